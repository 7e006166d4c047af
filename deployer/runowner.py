"""The process of this machine that runs a run, as the run's record names it: this machine's own proof that one
of its runs is gone, where the target's lock (the pid it names included) is only the target's word.

A pid alone names no process: pids are used again, so the record keeps the process's start time (clock ticks
after boot) and the boot it started in, and a pid means something only in its own pid namespace (a container's
is not its host's). Only Linux's /proc says all of this; elsewhere no owner is recorded and nothing is judged.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field

_PROC = Path("/proc")


class Owner(BaseModel):
    pid: int = Field(gt=0)  # 0 or less would name a process group to os.kill
    started: int  # /proc/<pid>/stat's starttime: a pid used again has another
    boot_id: str
    pid_ns: str

    @classmethod
    def this(cls) -> Owner | None:
        """This process (None: this system cannot judge it later)."""
        try:
            boot_id, pid_ns = _here()
            _, started = _stat(os.getpid())
        except OSError:
            return None
        return cls(pid=os.getpid(), started=started, boot_id=boot_id, pid_ns=pid_ns)

    def alive(self) -> bool | None:
        """Whether the process still runs (a zombie does not: its files, the run's link among them, are closed).
        None when this machine cannot tell: it was recorded in another boot or pid namespace, which may be
        another machine sharing the runs dir, or its /proc entry is hidden from us."""
        try:
            if _here() != (self.boot_id, self.pid_ns):
                return None
        except OSError:
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # a process of that pid runs, another user's
        try:
            state, started = _stat(self.pid)
        except OSError:
            return None  # hidden from us (hidepid), or gone this very moment: not proof either way
        return started == self.started and state not in "ZX"


def _here() -> tuple[str, str]:
    """This boot and this process's pid namespace."""
    return (_PROC / "sys/kernel/random/boot_id").read_text().strip(), os.readlink(_PROC / "self/ns/pid")


def _stat(pid: int) -> tuple[str, int]:
    """The state and start time of `pid`."""
    text = (_PROC / str(pid) / "stat").read_text()
    # The command name, in parentheses, may itself hold spaces and parentheses: fields start after the last one.
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[19])
