"""How a service is observed, stopped and started on the target: the Manager every kind of service has.

Every read, signal, start and health check is an action built once per service: the plan shows them with
placeholders for the PIDs only the run finds, and the run does exactly them. A poll (waiting for a stop, a
start) is one round trip per round: the process's /proc entry and its health URL in one batch.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from typing import Any

from deployer.config.models import Service
from deployer.errors import StepFailed
from deployer.steps.action import Action, Bound
from deployer.steps.context import NOTHING, Context

LOG_TAIL = 3000
START_POLL_S = 0.2
PROBE_TIMEOUT_S = 5.0  # a health check, a /proc read or a systemctl query


class Phase(str, Enum):
    """Where a service is in its restart, as the live view and the run log show it."""

    stopping = "stopping"  # signalled (or its stop command ran); waiting for it to exit
    waiting_tree = "waiting_tree"  # the leader is gone; waiting for the rest of its process tree and its port
    waiting_gpu = "waiting_gpu"  # waiting for its GPUs' memory to be released
    starting = "starting"  # launched; waiting for the process to keep running
    loading = "loading"  # running; waiting for its health URL to answer 200
    healthy = "healthy"  # its health URL answers 200


def pid_of(name: str) -> str:
    return f"<pid of {name}>"


def new_pid_of(name: str) -> str:
    return f"<new pid of {name}>"


@dataclass(frozen=True)
class Proc:
    """A process as /proc/PID/stat shows it (read after the command name, which may hold spaces and parens)."""

    state: str
    started: str  # clock ticks since boot (field 22): with the PID it names one process, even after PID reuse

    @classmethod
    def of(cls, stat: bytes | None) -> Proc | None:
        fields = [] if stat is None else stat.decode(errors="replace").rsplit(")", 1)[-1].split()
        return cls(fields[0], fields[19] if len(fields) > 19 else "") if fields else None

    @property
    def running(self) -> bool:
        """Not a zombie: an unreaped orphan must not make a stop wait out its grace."""
        return self.state != "Z"


def runs(stat: bytes | None, started: str | None = None) -> bool:
    """Does this /proc/PID/stat show a running process (the one that started at `started`, when given)?"""
    proc = Proc.of(stat)
    return proc is not None and proc.running and started in (None, proc.started)


@dataclass(frozen=True)
class Observed:
    """What a service looked like on the target just before the restart."""

    pid: int | None  # the live process deployer's record names; None: no record, or it names a dead one
    health: bool | None  # its health URL answered 200; None: the service has no health URL

    def describe(self) -> str:
        text = f"pid {self.pid} alive" if self.pid is not None else "no live pid"
        if self.health is not None:
            text += ", health " + ("answering" if self.health else "not answering")
        return text


def pid_text(pid: int | None) -> str:
    return "(none)" if pid is None else str(pid)


def answered(result: object) -> bool:
    return getattr(result, "status", None) == 200


class Manager(ABC):
    """How one service is observed, stopped and started on the target: its actions, and the run that does them."""

    def __init__(self, ctx: Context, name: str, service: Service, step: str, timeout: float) -> None:
        self.ctx, self.name, self.service, self.step = ctx, name, service, step
        self.timeout = timeout  # for the start and stop commands themselves
        url, wait = service.health, f"{service.health_timeout_s:g}s"
        self.health = None if url is None else Action.http(f"{name}.health", f"is {name} answering", url)
        self.free = None if url is None else Action.http(
            f"{name}.free", f"after the stops nothing may answer for {name} (else another process serves it)", url)
        self.up_health = None if url is None else Action.http(
            f"{name}.up_health", f"wait up to {wait} for {name} to answer 200", url, repeats=True)

    @classmethod
    @abstractmethod
    def manages(cls, service: Service) -> bool:
        """Is this the manager of that inventory service (the registry asks each in turn)?"""

    # -- the actions, in the order the step does them -------------------------------------------------

    @abstractmethod
    def observe_actions(self) -> list[Action]: ...

    @abstractmethod
    def stop_actions(self) -> list[Action]: ...

    def free_actions(self) -> list[Action]:
        return [] if self.free is None else [self.free]

    @abstractmethod
    def start_actions(self) -> list[Action]:
        """Start it and wait until it runs and answers (one round trip per poll)."""

    @abstractmethod
    def confirm_actions(self) -> list[Action]:
        """After every service started: is the new process still the one running?"""

    @property
    @abstractmethod
    def log(self) -> Action:
        """The tail of its output, read when it fails."""

    # -- doing them -------------------------------------------------------------------------------------

    @abstractmethod
    def observe(self, health: bool = True) -> Observed: ...

    def pid(self) -> int | None:
        return self.observe(health=False).pid

    @abstractmethod
    def stop(self, pid: int | None) -> str:
        """Stop it (pid: what observe() found); say how."""

    @abstractmethod
    def start(self) -> int:
        """Start it; its new PID once it runs and its health URL answers 200."""

    @abstractmethod
    def still_runs(self, pid: int) -> bool: ...

    def answers_after_stop(self) -> bool:
        return self.free is not None and answered(self.ctx.act(self.free, timeout=PROBE_TIMEOUT_S))

    def wait_up(self, probe: Action, bound: Bound, started: str | None = None) -> object:
        """Poll the process (probe) and the health URL in one round trip a round, until both say yes; the
        probe's last result."""
        deadline = time.monotonic() + self.service.health_timeout_s
        calls = [(probe, bound), *([] if self.up_health is None else [(self.up_health, NOTHING)])]
        # The poll is recorded when it ends: before the log tail a failure reads, as the plan orders them.
        with self.ctx.poll(PROBE_TIMEOUT_S) as poll:
            while True:
                results = poll.round(calls)
                if not self.alive(results[0], started):
                    problem = "exited during start-up"
                elif self.up_health is None or answered(results[1]):
                    return results[0]
                elif time.monotonic() >= deadline:
                    problem = f"{self.service.health} did not answer 200 within {self.service.health_timeout_s:g}s"
                else:
                    self.ctx.cancel.wait(START_POLL_S)
                    continue
                break
        raise self.fail(problem)

    @abstractmethod
    def alive(self, probed: object, started: str | None) -> bool:
        """What a probe's result says: the new process runs."""

    def phase(self, phase: Phase, started: float, budget_s: float | None = None, **fields: Any) -> None:
        """A `service_phase` event: the live view shows each service's phase, pid, last health answer and time
        against its budget; plain output prints a line on each change (and every 10 s while it waits).
        `started` is the monotonic time the phase began; fields: pid, health (the last answer: a status, or
        "no answer"), detail (one line: what it waits for)."""
        self.ctx.emit("service_phase", service=self.name, phase=phase.value,
                      elapsed_s=round(time.monotonic() - started, 1), budget_s=budget_s, **fields)

    def fail(self, message: str) -> StepFailed:
        tail = self.ctx.act(self.log, timeout=30).out_stream.text
        return StepFailed(self.step, f"service {self.name}: {message}",
                          stderr_tail=self.ctx.bus.masker.tail(tail, LOG_TAIL))
