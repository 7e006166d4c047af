"""How a service is observed, stopped and started on the target: the Manager every kind of service has.

Every read, signal, start and health check is an action built once per service: the plan shows them with
placeholders for the PIDs only the run finds, and the run does exactly them. A poll (waiting for a stop, a
start) is one round trip per round: the process's /proc entry and its health URL in one batch.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any
from urllib.parse import urlsplit

from deployer.agent.processes import Processes, ProcInfo
from deployer.agent.protocol import ExecResult
from deployer.command import shell_line
from deployer.config.models import Service
from deployer.errors import StepFailed
from deployer.steps.action import Action, Bound
from deployer.steps.context import NOTHING, Context, outcome
from deployer.text import visible

LOG_TAIL = 3000
START_POLL_S = 0.2  # how often a start is polled at first (start_poll_s)
START_POLL_MAX_S = 1.0
STOP_POLL_S = 0.1
PROBE_TIMEOUT_S = 5.0  # a health check, a /proc read or a systemctl query
PHASE_REPEAT_S = 10.0  # a wait's phase is said again this often, so a plain log shows it is still waiting


def start_poll_s(waited_s: float) -> float:
    """The pause before the next poll of a start that has been waited for waited_s: START_POLL_S at first, then a
    tenth of the wait so far, at most START_POLL_MAX_S. A real server loads its model for minutes, and each poll
    is a /proc scan and a health request on that host (5 a second used to be 1,500 over a 5-minute load; a 16-unit
    rollout of stand-ins with 3 s of warm-up, 4 units at once, used 19.3 s of CPU before, 15.6 s after); found
    healthy at most a tenth of its wait late (a second, past 10 s)."""
    return min(max(START_POLL_S, waited_s / 10), START_POLL_MAX_S)


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
    adopted: bool = False  # pid is the process its own pid file names (`pidfile:`) or on its port (`adopt: port`)

    def describe(self) -> str:
        text = f"pid {self.pid} alive" if self.pid is not None else "no live pid"
        if self.adopted:
            text += " (adopted)"
        if self.health is not None:
            text += ", health " + ("answering" if self.health else "not answering")
        return text


class Story:
    """What a health URL answered over one start: each answer counted, in the order first seen."""

    def __init__(self, url: str | None) -> None:
        self.path = (urlsplit(url).path or url) if url else ""
        self.counts: dict[str, int] = {}
        self.last: str | None = None  # the newest answer: a status, or "no answer"

    def add(self, result: object) -> None:
        self.last = outcome(result)
        self.counts[self.last] = self.counts.get(self.last, 0) + 1

    def told(self, seconds: float) -> str:
        """`/health: no answer x1, 503 x59 over 60 s`."""
        answers = ", ".join(f"{said} x{times}" for said, times in self.counts.items())
        return f"{self.path}: {answers or 'never asked'} over {seconds:.0f} s"


def rss_kib(status: bytes | None) -> int | None:
    """VmRSS from a /proc/PID/status the target sent: a number of kB, or None."""
    for line in (status or b"").decode(errors="replace").splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "VmRSS:" and words[1].isdigit():
            return int(words[1])
    return None


def size_text(size: int) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"


def pid_text(pid: int | None) -> str:
    return "(none)" if pid is None else str(pid)


def answered(result: object) -> bool:
    return getattr(result, "status", None) == 200


def not_ours(host: str, name: str, service: Service) -> str:
    """A service whose health answers while no process of deployer's (nor an adopted one) runs it."""
    if service.container is not None:  # `adopt:` is for a command's process: a container runs or does not
        return (f"{service.health} answers 200, but container {service.container.name} does not run: another "
                "process serves that URL; stop it, or correct the service's health URL")
    if service.systemd is not None:
        return (f"{service.health} answers 200, but unit {service.systemd} runs no process: another process serves "
                "that URL; stop it, or correct the service's health URL")
    return (f"{service.health} answers 200, but no process deployer started (or adopted) runs {name}: add "
            f"\"adopt: port\" to hosts.{host}.services.{name} in the inventory, or stop it once by hand")


def proc_line(proc: ProcInfo) -> str:
    """A process as a message names it: its pid and its command line, control characters escaped."""
    return f"pid {proc.pid} ({visible(shell_line(proc.cmdline), multiline=False) or '?'})"


def listed(procs: Iterable[ProcInfo]) -> str:
    """`pid:start,...`, what a signal action is bound to: each process named with its start time, so a pid
    recycled since the listing is never signalled."""
    return ",".join(f"{p.pid}:{p.start}" for p in procs)


def holders(found: Processes, port: int) -> list[str]:
    """Who keeps `port` listening, as a message names them (empty: the port is free)."""
    named = [proc_line(p) for p in found.procs if p.alive and port in p.listens]
    return named + (["a process this agent may not see"] if port in found.unowned else [])


class Manager(ABC):
    """How one service is observed, stopped and started on the target: its actions, and the run that does them."""

    warning: str | None = None  # what observe() saw wrong with how the service runs (`check` shows it)
    # Each manager's own: is the new process still the one running, and the tail of its output on a failure.
    still: Action
    _log: Action
    # Asked each round of its start's wait; raises to end it (a gang's leader: another rank died).
    watch: Callable[[], None] | None = None

    def __init__(self, ctx: Context, name: str, service: Service, step: str, timeout: float) -> None:
        self.ctx, self.name, self.service, self.step = ctx, name, service, step
        # Where its processes and its log are read: the target's, but for a container that is its own service
        # (container.py), whose engine and pids are the host's.
        self.host_side = ctx
        self.timeout = timeout  # for the start and stop commands themselves
        self.tags: Mapping[str, str] = NOTHING  # on each event it emits (a unit's name): the restart sets them
        url, wait = service.health, f"{service.health_timeout_s:g}s"
        self.health = None if url is None else Action.http(f"{name}.health", f"is {name} answering", url)
        self.free = None if url is None else Action.http(
            f"{name}.free", f"after the stops nothing may answer for {name} (else another process serves it)", url)
        self.up_health = None if url is None else Action.http(
            f"{name}.up_health", f"wait up to {wait} for {name} to answer 200", url, repeats=True)
        self.port = None if url is None else urlsplit(url).port or 80
        self.port_free = None if self.port is None else Action.procs(
            f"{name}.port_free", f"wait up to {service.stop_grace_s:g}s for port {self.port} to be free",
            {"ports": str(self.port)}, repeats=True)
        self.old_tree: set[int] = set()  # the pids of the tree the stop ended (the GPU wait looks for them)
        new = new_pid_of(name)
        self.memory = Action.get(f"{name}.memory", f"how much memory {new} holds", f"/proc/{new}/status",
                                 when=f"{name} runs but does not answer in time")

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

    def confirm_actions(self) -> list[Action]:
        """After every service started: is the new process still the one running? (`still`, each manager's own.)"""
        return [self.still]

    @property
    def log(self) -> Action:
        """The tail of its output, read when it fails (`_log`, each manager's own)."""
        return self._log

    @abstractmethod
    def read_log(self, cursor: str, *, whole: bool, lines: int | None, most: int) -> Action:
        """A read of its log (`deployer logs`): without a cursor this start's output (whole: all it kept), its last
        `lines` lines when given; with one, what was written after it. At most `most` bytes of text on stdout;
        the last line of stderr is the cursor to read on from (and, after a space, how many bytes it left out).
        Exit 3: it has no log yet; 127: the tool that keeps its log is not on the host."""

    @abstractmethod
    def log_source(self, whole: bool) -> str:
        """What read_log shows, as its heading names it (`stdout and stderr since this start, in PATH`)."""

    def log_tool(self) -> str:
        """The command read_log needs on the host."""
        return "tail"

    def log_read(self, result: ExecResult) -> tuple[str, str, int]:
        """The text, the next cursor and the bytes left out of a read_log's result that exited 0."""
        cursor, _, skipped = (result.err.splitlines() or [""])[-1].partition(" ")
        return result.out, cursor, int(skipped) if skipped.isdigit() else 0

    def refusals(self) -> list[str]:
        """What refuses a restart of it before the run changes anything (read live, after preflight): none here."""
        return []

    def judged_there(self) -> dict[str, Any] | None:
        """What the premise of a chain sent whole must find on the target for observe() to find this service
        deployer's, or not answering (agent.protocol.Ready.services); None: only observe() can tell, here."""
        return None

    def failure_reads(self) -> list[Action]:
        """What a failed start reads to tell its story: the new process's memory, and the log's tail."""
        return [self.memory, self.log]

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

    def start_waited_out(self, began: float, budget: float) -> bool:
        """In a start's poll loop (an engine's or a kubelet's word that it runs): True once `budget` seconds have
        passed since `began` (the caller says what did not come); else False, after the pause before the next
        poll (start_poll_s)."""
        waited = time.monotonic() - began
        if waited >= budget:
            return True
        self.ctx.cancel.wait(start_poll_s(waited))
        return False

    def wait_up(self, probe: Action, bound: Bound, started: str | None = None) -> object:
        """Poll the process (probe) and the health URL in one round trip a round, until both say yes; the
        probe's last result. Each phase (starting, loading, healthy) is a `service_phase` event, again on
        each new health answer and every PHASE_REPEAT_S; a failure says what health answered all along."""
        budget = self.service.health_timeout_s
        begun = time.monotonic()
        story = Story(self.service.health)
        calls = [(probe, bound), *([] if self.up_health is None else [(self.up_health, NOTHING)])]
        self.phase(Phase.starting, begun, budget, pid=self.probed_pid(None, bound))
        shown: tuple[Phase, str | None] = (Phase.starting, None)
        said = begun
        gone = False
        # The poll is recorded when it ends: before the log tail a failure reads, as the plan orders them.
        with self.ctx.poll(PROBE_TIMEOUT_S) as poll:
            while True:
                results = poll.round(calls)
                if self.watch is not None:
                    self.watch()
                pid = self.probed_pid(results[0], bound)
                if self.up_health is not None:
                    story.add(results[1])
                lives = self.alive(results[0], started)
                if not lives and not gone:
                    # A process list is no snapshot: a launcher may fork its server after the list was read
                    # and exit before its own entry is. A list read after it exited shows what it left.
                    gone = True
                    continue
                gone = not lives
                if not lives:
                    problem = f"exited during start-up after {time.monotonic() - begun:.1f}s"
                elif self.up_health is None or answered(results[1]):
                    seconds = round(time.monotonic() - begun, 1)
                    self.phase(Phase.healthy, begun, budget, pid=pid, health=story.last)
                    self.ctx.emit("service_healthy", service=self.name, seconds=seconds, budget_s=budget, pid=pid,
                                  **self.tags)
                    return results[0]
                elif time.monotonic() - begun >= budget:
                    problem = f"{self.service.health} did not answer 200 within {budget:g}s"
                else:
                    now = time.monotonic()
                    if (Phase.loading, story.last) != shown or now - said >= PHASE_REPEAT_S:
                        shown, said = (Phase.loading, story.last), now
                        self.phase(Phase.loading, begun, budget, pid=pid, health=story.last,
                                   detail=f"waiting for {self.service.health} to answer 200")
                    self.ctx.cancel.wait(start_poll_s(time.monotonic() - begun))
                    continue
                break
        told = [story.told(time.monotonic() - begun)] if self.up_health is not None else []
        if lives and pid is not None:
            told.append(self.memory_of(pid))
        raise self.fail("; ".join([problem, *told]))

    def probed_pid(self, probed: object, bound: Bound) -> int | None:
        """The new process's pid, as the start bound it (or, for a manager that learns it by polling, as the
        probe's result says)."""
        text = bound.get(new_pid_of(self.name), "")
        return int(text) if text.isdigit() else None

    def memory_of(self, pid: int) -> str:
        """`pid N alive, RSS 3.1 GB`: how much the process that does not answer holds (a model loading, or a
        server stuck after loading), from its /proc/PID/status (input: read, never trusted)."""
        status = self.host_side.act(self.memory, {new_pid_of(self.name): str(pid)}, timeout=PROBE_TIMEOUT_S)
        rss = rss_kib(status)
        return f"pid {pid} alive, RSS {'unknown' if rss is None else size_text(rss * 1024)}"

    @abstractmethod
    def alive(self, probed: object, started: str | None) -> bool:
        """What a probe's result says: the new process runs."""

    def phase(self, phase: Phase, started: float, budget_s: float | None = None, **fields: Any) -> None:
        """A `service_phase` event: the live view shows each service's phase, pid, last health answer and time
        against its budget; plain output prints a line on each change (and every 10 s while it waits).
        `started` is the monotonic time the phase began; fields: pid, health (the last answer: a status, or
        "no answer"), detail (one line: what it waits for)."""
        self.ctx.emit("service_phase", service=self.name, phase=phase.value,
                      elapsed_s=round(time.monotonic() - started, 1), budget_s=budget_s, **fields, **self.tags)

    def wait_port_free(self) -> None:
        """After the stop: nothing may still listen on its port (a child that outlived the stop holds it, and
        the new process could not bind), within stop_grace_s; else fail naming who holds it."""
        if self.port_free is None or self.port is None:
            return
        deadline = time.monotonic() + self.service.stop_grace_s
        with self.ctx.poll(PROBE_TIMEOUT_S) as poll:
            while held := holders(poll.round([(self.port_free, NOTHING)])[0], self.port):
                if time.monotonic() >= deadline:
                    raise self.fail(f"port {self.port} is still held after the stop by {', '.join(held)}")
                self.ctx.cancel.wait(STOP_POLL_S)

    def log_bound(self) -> Bound:
        """The values the log tail is read with (where this start's output begins)."""
        return NOTHING

    def tail_label(self) -> str:
        """What the failure's tail holds, as its heading names it."""
        return f"{self.name}'s output"

    def fail(self, message: str) -> StepFailed:
        tail = self.host_side.act(self.log, self.log_bound(), timeout=30).out_stream.text
        return StepFailed(self.step, f"service {self.name}: {message}",
                          stderr_tail=self.ctx.bus.masker.tail(tail, LOG_TAIL),
                          tail_label=f"{self.tail_label()} (tail)")

    def not_started(self, why: str) -> StepFailed:
        """A failure before this restart launched it: its log holds only what earlier starts wrote (an earlier
        run's crash), so none of it is shown as this one's."""
        return StepFailed(self.step, f"service {self.name} was not started: {why}")
