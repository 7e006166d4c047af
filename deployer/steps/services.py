"""Restart coupled services together onto the new commit, and prove each restart happened.

Prefill and decode cache each other's connection state, so they go down together (reverse
order) and come up in order, each healthy before the next starts. A restart whose PID did
not change did not happen.

Every read, signal, start and health check is an action built once per service (Manager): the plan
shows them with placeholders for the PIDs only the run finds, and the run does exactly them. A poll
(waiting for a stop, a start) is one round trip per round: the process's /proc entry and its health
URL in one batch.
"""

from __future__ import annotations

import posixpath
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

from deployer.config.models import Host, Service, Strict, resolve_env
from deployer.errors import StepFailed
from deployer.steps.action import Action, Bound
from deployer.steps.base import Effect, Scope, Step
from deployer.steps.context import NOTHING, Context

# Detached start: own session (so a stop can signal the whole group), output to the log,
# stdin closed, and the PID written before the shell returns. The log holds whatever the service
# prints, secrets included: 0600, even when an older deployer made it 0644; the umask is changed
# only for creating it, so the service keeps its own.
LAUNCH = ('log=$1; pidfile=$2; shift 2; (umask 077; : >>"$log") && chmod 600 -- "$log" || exit 1; '
          'nohup setsid "$@" >>"$log" 2>&1 </dev/null & echo $! >"$pidfile"; echo $!')
LOG_TAIL = 3000
STOP_POLL_S = 0.1
START_POLL_S = 0.2
PROBE_TIMEOUT_S = 5.0  # a health check, a /proc read or a systemctl query
KILL_WAIT_S = 10.0  # how long a KILLed process may take to disappear


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

    def fail(self, message: str) -> StepFailed:
        tail = self.ctx.act(self.log, timeout=30).out_stream.text
        return StepFailed(self.step, f"service {self.name}: {message}",
                          stderr_tail=self.ctx.bus.masker.tail(tail, LOG_TAIL))


class CommandManager(Manager):
    """A service deployer starts itself: detached, with a pid file and a record of its process's start time."""

    def __init__(self, ctx: Context, name: str, service: Service, step: str, timeout: float) -> None:
        super().__init__(ctx, name, service, step, timeout)
        state = ctx.state_dir()
        self.pidfile = posixpath.join(state, f"{name}.pid")
        self.logfile = posixpath.join(state, f"{name}.log")
        self.startfile = posixpath.join(state, f"{name}.started")
        self.cwd = posixpath.join(ctx.repo, service.cwd or "")
        old, new = pid_of(name), new_pid_of(name)
        grace = f"{service.stop_grace_s:g}s"
        self.read_pid = Action.get(f"{name}.pidfile", f"read {name}'s pid", self.pidfile)
        self.read_started = Action.get(f"{name}.started", "and the start time of the process it names", self.startfile)
        self.stat = Action.get(f"{name}.stat", f"is {old} running (and the process the pid file meant)",
                               f"/proc/{old}/stat", when="the pid file names a pid")
        self.stop_command = None if service.stop is None else Action.run(
            f"{name}.stop", f"stop {name}", tuple(service.stop), self.cwd, failure=f"the stop command of {name} failed")
        # The service leads its own process group (setsid): signal the group, so workers die too.
        # `-s SIG --` is the one spelling every kill accepts (dash's builtin rejects `-TERM -- -PID`).
        self.signals = {
            (sig, group): Action.run(f"{name}.{sig.lower()}{'' if group else '_pid'}",
                                     f"stop {name}: {sig} its {'process group' if group else 'process alone'}",
                                     ("kill", "-s", sig, "--", f"-{old}" if group else old), when=when)
            for sig, group, when in (
                ("TERM", True, f"{old} is running" + (" after the stop command" if service.stop else "")),
                ("TERM", False, "it leads no process group"),
                ("KILL", True, f"it still runs after {grace}"),
                ("KILL", False, "it leads no process group"))
            if sig == "KILL" or not service.stop}
        self.stopping = Action.get(f"{name}.stopping", f"wait up to {grace} for {old} to exit", f"/proc/{old}/stat",
                                   repeats=True, when=f"{old} is running")
        self.dying = Action.get(f"{name}.dying", f"wait up to {KILL_WAIT_S:g}s for the KILLed {old} to go",
                                f"/proc/{old}/stat", repeats=True, when="it was KILLed")
        assert service.start is not None
        self.mkdir = Action.run(f"{name}.mkdir", "create deployer's state dir", ("mkdir", "-p", "--", state),
                                failure="cannot create deployer's state dir")
        self.launch = Action.run(f"{name}.launch", f"start {name} (log {self.logfile})",
                                 ("sh", "-c", LAUNCH, "deployer-launch", self.logfile, self.pidfile, *service.start),
                                 self.cwd, env=tuple(resolve_env({**ctx.host.env, **service.env}).items()),
                                 failure=f"cannot start {name}")
        self.born = Action.get(f"{name}.born", f"read when {new} started", f"/proc/{new}/stat")
        self.note = Action.put(f"{name}.note", f"keep that start time, so a recycled {new} is never taken for {name}",
                               self.startfile)
        self.up = Action.get(f"{name}.up", f"wait for {new} to keep running", f"/proc/{new}/stat", repeats=True)
        self.still = Action.get(f"{name}.still", f"{new} still runs after every service started", f"/proc/{new}/stat")
        self._log = Action.run(f"{name}.log", f"the tail of {name}'s output", ("tail", "-c", str(LOG_TAIL), "--",
                                                                               self.logfile), when=f"{name} fails")
        self.started_at = ""  # the start time of the process start() launched

    def observe_actions(self) -> list[Action]:
        return [self.read_pid, self.read_started, self.stat, *([] if self.health is None else [self.health])]

    def stop_actions(self) -> list[Action]:
        signal = self.signals.get
        return [a for a in (self.stop_command, signal(("TERM", True)), signal(("TERM", False)), self.stopping,
                            signal(("KILL", True)), signal(("KILL", False)), self.dying) if a is not None]

    def start_actions(self) -> list[Action]:
        return [self.mkdir, self.launch, self.born, self.note, self.up, *([] if self.up_health is None else
                                                                          [self.up_health])]

    def confirm_actions(self) -> list[Action]:
        return [self.still]

    @property
    def log(self) -> Action:
        return self._log

    def observe(self, health: bool = True) -> Observed:
        recorded, started = self.ctx.act_all([(self.read_pid, NOTHING), (self.read_started, NOTHING)],
                                             timeout=PROBE_TIMEOUT_S)
        text = recorded.decode(errors="replace").strip() if recorded else ""
        ask = [(self.health, NOTHING)] if health and self.health is not None else []
        if not text.isdigit():
            return Observed(None, answered(self.ctx.act_all(ask, timeout=PROBE_TIMEOUT_S)[0]) if ask else None)
        results = self.ctx.act_all([(self.stat, {pid_of(self.name): text}), *ask], timeout=PROBE_TIMEOUT_S)
        # A pid file can outlive its process, and the number then name another one: the start time tells.
        meant = None if started is None else started.decode(errors="replace").strip()
        return Observed(int(text) if runs(results[0], meant) else None, answered(results[1]) if ask else None)

    def stop(self, pid: int | None) -> str:
        if self.stop_command is not None:
            self.ctx.act(self.stop_command, timeout=self.timeout)
        if pid is None:
            return "ran its stop command; no live pid to wait for" if self.stop_command else "no live pid to signal"
        if self.stop_command is None:
            self._signal("TERM", pid)
        if self._gone(self.stopping, pid, self.service.stop_grace_s):
            return "stopped"
        self._signal("KILL", pid)
        if not self._gone(self.dying, pid, KILL_WAIT_S):
            raise self.fail(f"pid {pid} survived SIGKILL")
        return f"killed after {self.service.stop_grace_s:g}s grace"

    def _signal(self, sig: str, pid: int) -> None:
        bound = {pid_of(self.name): str(pid)}
        if not self.ctx.act(self.signals[sig, True], bound, timeout=30).ok:
            self.ctx.act(self.signals[sig, False], bound, timeout=30)

    def _gone(self, probe: Action, pid: int, seconds: float) -> bool:
        """Poll until the process is gone (True) or `seconds` have passed (False): one round trip a round."""
        deadline = time.monotonic() + seconds
        with self.ctx.poll(PROBE_TIMEOUT_S) as poll:
            while runs(poll.round([(probe, {pid_of(self.name): str(pid)})])[0]):
                if time.monotonic() >= deadline:
                    return False
                self.ctx.cancel.wait(STOP_POLL_S)
        return True

    def start(self) -> int:
        _, launch = self.ctx.act_all([(self.mkdir, NOTHING), (self.launch, NOTHING)], timeout=self.timeout)
        launched = str(launch.out).strip()
        if not launched.isdigit():
            raise self.fail(f"the launch printed no pid: {launched[:80]!r}")
        bound = {new_pid_of(self.name): launched}
        born = Proc.of(self.ctx.act(self.born, bound, timeout=PROBE_TIMEOUT_S))
        if born is None:
            raise self.fail("exited during start-up")
        self.started_at = born.started
        # Remembered so a recycled PID is never mistaken for the service.
        self.ctx.act(self.note, bound, data=born.started.encode(), timeout=self.timeout)
        self.wait_up(self.up, bound, born.started)
        return int(launched)

    def alive(self, probed: object, started: str | None) -> bool:
        return isinstance(probed, bytes) and runs(probed, started)

    def still_runs(self, pid: int) -> bool:
        return runs(self.ctx.act(self.still, {new_pid_of(self.name): str(pid)}, timeout=PROBE_TIMEOUT_S),
                    self.started_at)


class SystemdManager(Manager):
    def __init__(self, ctx: Context, name: str, service: Service, step: str, timeout: float) -> None:
        super().__init__(ctx, name, service, step, timeout)
        assert service.systemd is not None
        unit = service.systemd
        main_pid = ("systemctl", "show", "-p", "MainPID", "--value", unit)
        self.main_pid = Action.run(f"{name}.mainpid", f"read {unit}'s main pid", main_pid)
        self.stop_unit = Action.run(f"{name}.stop", f"stop {name}", ("systemctl", "stop", unit),
                                    failure=f"systemctl stop {unit} failed")
        self.start_unit = Action.run(f"{name}.start", f"start {name}", ("systemctl", "start", unit),
                                     failure=f"systemctl start {unit} failed")
        self.up = Action.run(f"{name}.up", f"wait for {unit} to have a main pid", main_pid, repeats=True)
        self.still = Action.run(f"{name}.still", "its main pid after every service started", main_pid)
        self._log = Action.run(f"{name}.log", f"the end of {unit}'s journal",
                               ("journalctl", "-u", unit, "-n", "40", "--no-pager"), when=f"{name} fails")

    def observe_actions(self) -> list[Action]:
        return [self.main_pid, *([] if self.health is None else [self.health])]

    def stop_actions(self) -> list[Action]:
        return [self.stop_unit]

    def start_actions(self) -> list[Action]:
        return [self.start_unit, self.up, *([] if self.up_health is None else [self.up_health])]

    def confirm_actions(self) -> list[Action]:
        return [self.still]

    @property
    def log(self) -> Action:
        return self._log

    @staticmethod
    def pid_in(result: object) -> int | None:
        out = getattr(result, "out", "").strip()
        return int(out) if out.isdigit() and int(out) > 0 else None

    def observe(self, health: bool = True) -> Observed:
        ask = [(self.health, NOTHING)] if health and self.health is not None else []
        results = self.ctx.act_all([(self.main_pid, NOTHING), *ask], timeout=PROBE_TIMEOUT_S)
        return Observed(self.pid_in(results[0]), answered(results[1]) if ask else None)

    def stop(self, pid: int | None) -> str:
        self.ctx.act(self.stop_unit, timeout=self.timeout)
        return "stopped"

    def start(self) -> int:
        self.ctx.act(self.start_unit, timeout=self.timeout)
        pid = self.pid_in(self.wait_up(self.up, NOTHING))
        assert pid is not None, "wait_up returns once the unit has a main pid"
        return pid

    def alive(self, probed: object, started: str | None) -> bool:
        return self.pid_in(probed) is not None

    def still_runs(self, pid: int) -> bool:
        return self.pid_in(self.ctx.act(self.still, timeout=PROBE_TIMEOUT_S)) == pid


def manager(ctx: Context, name: str, step: Step) -> Manager:
    return manager_for(ctx, name, step.name, step.timeout_s)


def manager_for(ctx: Context, name: str, step: str = "status", timeout: float = 60.0) -> Manager:
    service = ctx.host.services[name]
    cls = SystemdManager if service.systemd else CommandManager
    return cls(ctx, name, service, step, timeout)


class CoRestartParams(Strict):
    services: list[str] | None = None  # default: every service of the host, in inventory order
    timeout_s: float = 60.0


class CoRestart(Step):
    kind = "co_restart"
    scope = Scope.unit
    effect = Effect.restarts
    Params = CoRestartParams
    params: CoRestartParams
    after = ("commit",)

    def check_host(self, host_name: str, host: Host) -> str | None:
        names = self.params.services if self.params.services is not None else list(host.services)
        unknown = [n for n in names if n not in host.services]
        if unknown or not names:
            return (f"host {host_name} defines no service {', '.join(unknown) or '(none)'} "
                    f"(it has: {', '.join(host.services) or 'none'})")
        return None

    def names(self, ctx: Context) -> list[str]:
        names = self.params.services if self.params.services is not None else list(ctx.host.services)
        unknown = [n for n in names if n not in ctx.host.services]
        if unknown or not names:
            raise StepFailed(self.name, f"host {ctx.host_name} defines no service {', '.join(unknown) or '(none)'} "
                             f"(it has: {', '.join(ctx.host.services) or 'none'})")
        return names

    def managers(self, ctx: Context) -> list[Manager]:
        return [manager(ctx, n, self) for n in self.names(ctx)]

    def plan(self, ctx: Context) -> list[Action]:
        managers = self.managers(ctx)
        return [*(a for m in managers for a in m.observe_actions()),
                *(a for m in reversed(managers) for a in m.stop_actions()),
                *(a for m in managers for a in m.free_actions()),
                *(a for m in managers for a in m.start_actions()),
                *(a for m in managers for a in m.confirm_actions()),
                *(m.log for m in managers)]

    def run(self, ctx: Context) -> str:
        managers = self.managers(ctx)
        seen = {m.name: m.observe() for m in managers}
        old = {n: s.pid for n, s in seen.items()}
        for m in reversed(managers):
            how = m.stop(old[m.name])
            ctx.emit("service_stopped", service=m.name, pid=old[m.name], pid_alive=old[m.name] is not None,
                     health_answering=seen[m.name].health, seen=seen[m.name].describe(), how=how)
        for m in managers:
            # Something deployer does not know about (started by hand, no pid file) still serving
            # would answer the health check for the new process, which could not even bind.
            if m.answers_after_stop():
                raise m.fail(f"{m.service.health} still answers after the stop, so another process serves it "
                             f"(pid {old[m.name] or 'unknown: started outside deployer'}); stop it once by hand "
                             "or give the service a `stop` command")
        new: dict[str, int] = {}
        for m in managers:
            ctx.cancel.check()
            new[m.name] = m.start()
            ctx.emit("service_started", service=m.name, pid=new[m.name])
        ctx.emit("restart", pids={n: {"old": old[n], "new": new[n]} for n in old})
        ctx.facts.pids = {n: {"old": old[n], "new": new[n]} for n in old}
        for m in managers:
            if new[m.name] == old[m.name]:
                raise m.fail(f"PID did not change ({pid_text(old[m.name])} -> {pid_text(new[m.name])}): "
                             "the restart did not happen")
            if not m.still_runs(new[m.name]):
                raise m.fail(f"pid {new[m.name]} exited right after its health check passed")
        return "; ".join(f"{n}: was {seen[n].describe()}; pid {pid_text(old[n])} -> {pid_text(new[n])}" for n in old)
