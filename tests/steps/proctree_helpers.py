"""What the process-tree tests share: a playbook that only restarts, and cleanup of whole sessions by pid."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from fixtures_repo import Project


def sessions() -> dict[int, int]:
    """pid -> session id of every live process on this machine (the targets run here, local and over sshd);
    a zombie, dead and waiting for a parent to reap it, holds nothing."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
                if fields[0] not in "ZX":
                    found[int(name)] = int(fields[3])
    return found


def in_sessions(sids: set[int]) -> list[int]:
    return [pid for pid, sid in sessions().items() if sid in sids]


def kill_sessions(sids: set[int]) -> None:
    """Every process of those sessions, by pid: what a test started, even when the stop under test failed."""
    for pid in in_sessions(sids):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def recorded_pid(repo: Path, name: str) -> int | None:
    pidfile = repo / ".git" / "deployer" / f"{name}.pid"
    return int(pidfile.read_text()) if pidfile.exists() else None


def restart_playbook(project: Project, dest: str, text: str) -> None:
    """A playbook that changes one tracked file (so each apply commits) and restarts every service."""
    project.write("fix/touched.py", text)
    project.playbook(files=[{"src": "fix/touched.py", "dest": dest}],
                     steps=["upload", {"commit": {"message": "touch"}}, {"co_restart": {"timeout_s": 30}}])
