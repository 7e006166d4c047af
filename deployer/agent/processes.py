"""The process-tree requests: a service's processes (its session, groups, pids, whoever listens on its port) and
signals sent only to processes so listed. Requests like protocol.py's, in a module of their own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from deployer.agent.protocol import Request

PROCS_REPLY = 32 << 20  # a process table: thousands of processes, each cmdline cut at 4 KiB


@dataclass(frozen=True)
class ProcInfo:
    """A process on the target as its agent read it from /proc."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    start: str  # clock ticks since boot: with the pid it names one process, even after the pid is reused
    state: str
    uid: int
    rss_kb: int
    cmdline: tuple[str, ...]
    listens: tuple[int, ...] = ()  # the asked-for ports it holds a listening socket on

    @property
    def alive(self) -> bool:
        """Not a zombie: an unreaped orphan holds no port, no memory and no GPU."""
        return self.state != "Z"


@dataclass(frozen=True)
class Processes:
    """The processes asked for, as the agent read them from /proc, and the asked-for ports it saw no owner of."""
    procs: tuple[ProcInfo, ...]
    unowned: tuple[int, ...]  # asked-for ports that listen, held by a process this agent may not see


@dataclass(frozen=True)
class Procs(Request[Processes]):
    """The processes of some sessions, process groups or pids, and those listening on some TCP ports."""

    op: ClassVar[str] = "procs"
    sessions: Sequence[int] = ()
    groups: Sequence[int] = ()
    pids: Sequence[int] = ()
    ports: Sequence[int] = ()

    def fields(self) -> dict[str, Any]:
        return {"sessions": list(self.sessions), "groups": list(self.groups), "pids": list(self.pids),
                "ports": list(self.ports)}

    def parse(self, result: dict[str, Any]) -> Processes:
        return Processes(tuple(ProcInfo(**{**p, "cmdline": tuple(p["cmdline"]), "listens": tuple(p["listens"])})
                               for p in result["procs"]), tuple(result["unowned"]))

    def max_reply(self) -> int:
        return PROCS_REPLY


@dataclass(frozen=True)
class Signal(Request[dict[int, str]]):
    """A signal to each (pid, start) still that process; per pid: signalled, gone or denied."""

    op: ClassVar[str] = "signal"
    sig: str
    procs: Sequence[tuple[int, str]]

    def fields(self) -> dict[str, Any]:
        return {"sig": self.sig, "procs": [{"pid": pid, "start": start} for pid, start in self.procs]}

    def parse(self, result: dict[str, Any]) -> dict[int, str]:
        return {int(pid): outcome for pid, outcome in result["outcomes"].items()}
