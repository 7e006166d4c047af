"""Start, ask and stop this user's daemon for this install."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from deployer.daemon.client import dial
from deployer.daemon.place import folder, install_id, private_folder, script_less_path, stamp
from deployer.daemon.serve import HELD
from deployer.daemon.wire import Reader, WireError, send
from deployer.errors import DaemonError

IDLE_S = 15 * 60.0
START_WAIT_S = 60.0  # its imports take a second or two; a loaded machine, more
# The daemon's interpreter: the caller's, with its flags, never the caller's working directory on its path.
_BOOT = "import sys\nif sys.path[:1] == ['']: del sys.path[0]\nfrom deployer.launch import serve\nserve()"


def ask(message: dict[str, Any], base: Path | None = None) -> dict[str, Any] | None:
    """The daemon's answer to one question (None: no daemon of this user answers there). A folder that is there
    and not this user's alone is an error here (a command only ignores it)."""
    base = folder() if base is None else base
    if base.exists() or base.is_symlink():
        reason = private_folder(base, make=False)
        if reason is not None:
            raise DaemonError(f"no daemon can live there: {reason}")
    conn = dial(base)
    if conn is None:
        return None
    with conn:
        try:
            conn.settimeout(10)
            send(conn, message)
            return Reader(conn).message()
        except (OSError, WireError):
            return None


def status(base: Path | None = None, mine: dict[str, str] | None = None) -> dict[str, Any] | None:
    """pid, started (epoch s), served, idle_s, and current (it serves this process: `mine`, its stamp, taken
    here unless given); None: none runs."""
    return ask({"op": "status", "stamp": stamp(script_less_path()) if mine is None else mine}, base)


def stop(base: Path | None = None, wait_s: float = 10.0) -> int | None:
    """Stop the daemon; its pid (None: none ran). Commands it started run on."""
    answer = ask({"op": "stop"}, base)
    if answer is None:
        return None
    deadline = time.monotonic() + wait_s
    while ask({"op": "status"}, base) is not None:  # still answering (whose code it runs is no question here)
        if time.monotonic() > deadline:
            raise DaemonError(f"the daemon (pid {answer.get('stopping')}) was asked to stop and still answers")
        time.sleep(0.02)
    return int(answer.get("stopping", 0))


def spawn(idle_s: float = IDLE_S, base: Path | None = None) -> subprocess.Popen[bytes]:
    """Start a daemon in its own session (it outlives this process); its log is beside its socket (appended to:
    one that finds another daemon there says so below that one's lines; a daemon that starts empties it)."""
    base = (folder() if base is None else base).absolute()
    reason = private_folder(base, make=True)
    if reason is not None:
        raise DaemonError(f"no daemon: {reason}")
    with open(base / f"{install_id()}.log", "ab") as log:
        return subprocess.Popen([sys.executable, *_flags(), "-c", _BOOT, str(base), str(idle_s)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/",
                                start_new_session=True)


def start(idle_s: float = IDLE_S, base: Path | None = None) -> tuple[dict[str, Any], bool]:
    """A daemon running this code: its status, and whether this call started it (one that ran other code is
    stopped first)."""
    base = (folder() if base is None else base).absolute()
    mine = stamp(script_less_path())  # once: the polls below would walk deployer's files each time
    found = status(base, mine)
    if found is not None and found["current"]:
        return found, False
    if found is not None:
        stop(base)
    proc = spawn(idle_s, base)
    deadline = time.monotonic() + START_WAIT_S
    while (found := status(base, mine)) is None or not found["current"]:
        if found is not None and found["pid"] == proc.pid:
            stop(base)
            raise DaemonError("the daemon started but serves no command of this process: its module path, "
                              "interpreter flags or process context differ from this one's (see deployer daemon "
                              "--help)")
        # Another start's daemon may have won the place (this one gave up: its log says so): wait for that one.
        if (proc.poll() not in (None, HELD)) or time.monotonic() > deadline:
            log = (base / f"{install_id()}.log").read_text(errors="replace").strip()
            how = "no answer in 60 s" if proc.returncode is None else f"exit {proc.returncode}"
            raise DaemonError(f"the daemon did not start ({how}): {log[-2000:] or 'it wrote nothing'}")
        time.sleep(0.02)
    return found, found["pid"] == proc.pid


def _flags() -> list[str]:
    """The interpreter flags that change what code runs, so that the daemon's are its starter's (the stamp holds
    all of sys.flags: any other difference makes the daemon refuse that caller, never serve it wrongly)."""
    flags = sys.flags
    return (["-O"] * flags.optimize + ["-B"] * sys.dont_write_bytecode + ["-s"] * flags.no_user_site
            + ["-E"] * flags.ignore_environment + ["-I"] * flags.isolated
            + ["-P"] * bool(getattr(flags, "safe_path", False)))
