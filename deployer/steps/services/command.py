"""A service deployer starts itself (`start:` in the inventory): detached in its own session, its pid in a
pid file, stopped by its `stop` command or by signalling its whole process group."""

from __future__ import annotations

import posixpath
import time

from deployer.config.models import Service, resolve_env
from deployer.steps.action import Action
from deployer.steps.context import NOTHING, Context
from deployer.steps.services.manager import (
    LOG_TAIL,
    PROBE_TIMEOUT_S,
    Manager,
    Observed,
    Proc,
    answered,
    new_pid_of,
    pid_of,
    runs,
)

# Detached start: own session (so a stop can signal the whole group), output to the log,
# stdin closed, and the PID written before the shell returns. The log holds whatever the service
# prints, secrets included: 0600, even when an older deployer made it 0644; the umask is changed
# only for creating it, so the service keeps its own.
LAUNCH = ('log=$1; pidfile=$2; shift 2; (umask 077; : >>"$log") && chmod 600 -- "$log" || exit 1; '
          'nohup setsid "$@" >>"$log" 2>&1 </dev/null & echo $! >"$pidfile"; echo $!')
STOP_POLL_S = 0.1
KILL_WAIT_S = 10.0  # how long a KILLed process may take to disappear


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

    @classmethod
    def manages(cls, service: Service) -> bool:
        return service.start is not None

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
