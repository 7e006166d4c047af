"""paramiko, imported without invoke until an ssh_config needs it, and without importlib.metadata.

paramiko.config imports invoke (and with it unittest.mock, asyncio and a vendored yaml: about a third of
paramiko's import time, ~60 ms a run) only to run an ssh_config's `Match exec` lines. Import this module
instead of paramiko (it is `paramiko` here); `allow_match_exec` hands invoke over when a config has such a line.
paramiko's own version comes from its dist-info directly (deployer/lean.py).
"""

from __future__ import annotations

import importlib
import re
import sys

from deployer.lean import metadata_knowing, standing_in

_MATCH_EXEC = re.compile(r"^\s*match\b.*\bexec\b", re.IGNORECASE | re.MULTILINE)

if "paramiko" not in sys.modules:
    with standing_in({"invoke": None, **metadata_knowing("paramiko")}):  # paramiko's `import invoke` raises
        import paramiko.config
import paramiko  # noqa: E402
import paramiko.config  # noqa: E402

__all__ = ["allow_match_exec", "paramiko"]


def allow_match_exec(config_text: str) -> None:
    """Give paramiko invoke when config_text has a `Match exec` line (paramiko runs it through invoke)."""
    if _MATCH_EXEC.search(config_text) and getattr(paramiko.config, "invoke", None) is None:
        setattr(paramiko.config, "invoke", importlib.import_module("invoke"))  # noqa: B010
