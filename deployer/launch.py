"""The `deployer` command's entry (and `python -m deployer`'s): in this user's daemon when one runs this very
code (deployer/daemon), else in this process, as always."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import NoReturn

from deployer.daemon.place import might_answer, socket_path


def main() -> NoReturn:
    if might_answer():
        from deployer.daemon.client import handed_over
        code = handed_over()
        if code is not None:
            os._exit(code)
    # auto: start one where none is; not beside one that refused this command (it serves other callers).
    if os.environ.get("DEPLOYER_DAEMON") == "auto" and not os.path.exists(socket_path()):
        from deployer.daemon.control import spawn
        from deployer.errors import DaemonError
        # For the commands after this one (this one does not wait for its imports). A folder that is not
        # private gets no daemon: commands run without one, as ever.
        with contextlib.suppress(DaemonError):
            spawn()
    from deployer.cli import run
    run()


def serve() -> NoReturn:
    """The daemon's process (started by deployer.daemon.control: argv is its folder and idle seconds)."""
    from deployer.daemon.place import private_folder
    from deployer.daemon.serve import Daemon

    base, idle_s = Path(sys.argv[1]), float(sys.argv[2])
    reason = private_folder(base, make=False)
    if reason is not None:
        print(f"no daemon: {reason}", file=sys.stderr)
        os._exit(1)
    os._exit(Daemon(base, idle_s, command=_command).serve(preload=_preload))


def _preload() -> None:
    from deployer.sources import hold
    from deployer.warm import preload
    preload()
    hold()


def _command() -> NoReturn:
    from deployer.cli import run
    run()
