"""Restart coupled services together onto the new commit, and prove each restart happened.

Prefill and decode cache each other's connection state, so they go down together (reverse
order) and come up in order, each healthy before the next starts. A restart whose PID did
not change did not happen.
"""

from __future__ import annotations

import posixpath
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

from deployer.config import Host, Service, Strict, resolve_env
from deployer.context import Context
from deployer.errors import StepFailed
from deployer.steps.base import Action, Effect, Step
from deployer.transport.base import ExecResult, Transport

# Detached start: own session (so a stop can signal the whole group), output to the log,
# stdin closed, and the PID written before the shell returns. The log holds whatever the service
# prints, secrets included: 0600, even when an older deployer made it 0644; the umask is changed
# only for creating it, so the service keeps its own.
LAUNCH = ('log=$1; pidfile=$2; shift 2; (umask 077; : >>"$log") && chmod 600 -- "$log" || exit 1; '
          'nohup setsid "$@" >>"$log" 2>&1 </dev/null & echo $! >"$pidfile"; echo $!')
LOG_TAIL = 3000
POLL_S = 0.1


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


class Manager(ABC):
    """How one service is stopped, started and observed on the target."""

    def __init__(self, ctx: Context, name: str, service: Service, step: str, timeout: float) -> None:
        self.ctx, self.name, self.service, self.step = ctx, name, service, step
        self.timeout = timeout  # for the start and stop commands themselves

    @abstractmethod
    def pid(self) -> int | None: ...

    @abstractmethod
    def stop_actions(self) -> list[Action]: ...

    @abstractmethod
    def start_actions(self) -> list[Action]: ...

    @abstractmethod
    def stop(self) -> str: ...

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def log_tail(self) -> str: ...

    @abstractmethod
    def alive(self, pid: int) -> bool: ...

    def observe(self) -> Observed:
        health = self.service.health
        return Observed(self.pid(), None if health is None else answers(self.ctx.transport, health))

    def fail(self, message: str) -> StepFailed:
        return StepFailed(self.step, f"service {self.name}: {message}",
                          stderr_tail=self.ctx.bus.masker.tail(self.log_tail(), LOG_TAIL))


class CommandManager(Manager):
    @property
    def pidfile(self) -> str:
        return posixpath.join(self.ctx.state_dir(), f"{self.name}.pid")

    @property
    def logfile(self) -> str:
        return posixpath.join(self.ctx.state_dir(), f"{self.name}.log")

    @property
    def cwd(self) -> str:
        return posixpath.join(self.ctx.repo, self.service.cwd or "")

    def launch_argv(self) -> tuple[str, ...]:
        assert self.service.start is not None
        return ("sh", "-c", LAUNCH, "deployer-launch", self.logfile, self.pidfile, *self.service.start)

    @property
    def startfile(self) -> str:
        return posixpath.join(self.ctx.state_dir(), f"{self.name}.started")

    def pid(self) -> int | None:
        raw = self.ctx.transport.get(self.pidfile, timeout=self.timeout)
        text = raw.decode(errors="replace").strip() if raw else ""
        if not text.isdigit() or not self.alive(int(text)):
            return None
        recorded = self.ctx.transport.get(self.startfile, timeout=self.timeout)
        if recorded is not None and recorded.decode(errors="replace").strip() != self._started_at(int(text)):
            return None  # the pid file outlived its process and the number now names another one
        return int(text)

    def _started_at(self, pid: int) -> str:
        """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or ''."""
        fields = self._proc_fields(pid) or []
        return fields[19] if len(fields) > 19 else ""

    def stop_actions(self) -> list[Action]:
        if self.service.stop:
            return [Action(f"stop {self.name}", tuple(self.service.stop), self.cwd)]
        return [Action(f"stop {self.name}: TERM its process group (pid from {self.pidfile}), "
                       f"KILL after {self.service.stop_grace_s:g}s")]

    def start_actions(self) -> list[Action]:
        return [Action(f"start {self.name} (log {self.logfile})", self.launch_argv(), self.cwd,
                       tuple(self.env().items()))]

    def env(self) -> dict[str, str]:
        return resolve_env({**self.ctx.host.env, **self.service.env})

    def stop(self) -> str:
        pid = self.pid()
        if self.service.stop:
            result = self.ctx.run(self.service.stop, cwd=self.cwd, timeout=self.timeout)
            if not result.ok:
                raise self.ctx.failure(f"the stop command of {self.name} failed", result)
        elif pid is not None:
            self._signal("TERM", pid)
        if pid is None:
            return "ran its stop command; no live pid to wait for" if self.service.stop else "no live pid to signal"
        deadline = time.monotonic() + self.service.stop_grace_s
        while self.alive(pid):
            if time.monotonic() >= deadline:
                self._signal("KILL", pid)
                self._wait_gone(pid, 10.0)
                return f"killed after {self.service.stop_grace_s:g}s grace"
            self.ctx.cancel.wait(POLL_S)
        return "stopped"

    def _signal(self, sig: str, pid: int) -> ExecResult:
        # The service leads its own process group (setsid): signal the group, so workers die too.
        # `-s SIG --` is the one spelling every kill accepts (dash's builtin rejects `-TERM -- -PID`).
        result = self.ctx.run(("kill", "-s", sig, "--", f"-{pid}"), timeout=30)
        return result if result.ok else self.ctx.run(("kill", "-s", sig, "--", str(pid)), timeout=30)

    def alive(self, pid: int) -> bool:
        """Running and not a zombie: an unreaped orphan must not make a stop wait out its grace."""
        fields = self._proc_fields(pid)
        if fields is None:  # gone, or a target without /proc: ask kill
            return self.ctx.run(("kill", "-0", str(pid)), timeout=30).ok
        return bool(fields) and fields[0] != "Z"

    def _proc_fields(self, pid: int) -> list[str] | None:
        """/proc/PID/stat after the command name (which may hold spaces and parens), or None."""
        stat = self.ctx.run(("cat", f"/proc/{pid}/stat"), timeout=30, quiet=True)
        return stat.out.rsplit(")", 1)[-1].split() if stat.ok else None

    def _wait_gone(self, pid: int, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.alive(pid):
            if time.monotonic() >= deadline:
                raise self.fail(f"pid {pid} survived SIGKILL")
            time.sleep(POLL_S)

    def start(self) -> None:
        self.ctx.check(("mkdir", "-p", "--", self.ctx.state_dir()), "cannot create deployer's state dir")
        launched = self.ctx.check(self.launch_argv(), f"cannot start {self.name}", cwd=self.cwd, env=self.env(),
                                  timeout=self.timeout).out.strip()
        if launched.isdigit():  # remembered so a recycled PID is never mistaken for the service
            self.ctx.transport.put(self._started_at(int(launched)).encode(), self.startfile, timeout=self.timeout)

    def log_tail(self) -> str:
        return self.ctx.run(("tail", "-c", str(LOG_TAIL), "--", self.logfile), timeout=30).out


class SystemdManager(Manager):
    @property
    def unit(self) -> str:
        assert self.service.systemd is not None
        return self.service.systemd

    def pid(self) -> int | None:
        out = self.ctx.run(("systemctl", "show", "-p", "MainPID", "--value", self.unit), timeout=30).out.strip()
        return int(out) if out.isdigit() and int(out) > 0 else None

    def stop_actions(self) -> list[Action]:
        return [Action(f"stop {self.name}", ("systemctl", "stop", self.unit))]

    def start_actions(self) -> list[Action]:
        return [Action(f"start {self.name}", ("systemctl", "start", self.unit))]

    def stop(self) -> str:
        self.ctx.check(("systemctl", "stop", self.unit), f"systemctl stop {self.unit} failed", timeout=self.timeout)
        return "stopped"

    def start(self) -> None:
        self.ctx.check(("systemctl", "start", self.unit), f"systemctl start {self.unit} failed",
                       timeout=self.timeout)

    def alive(self, pid: int) -> bool:
        return self.ctx.run(("systemctl", "is-active", "--quiet", self.unit), timeout=30).ok

    def log_tail(self) -> str:
        return self.ctx.run(("journalctl", "-u", self.unit, "-n", "40", "--no-pager"), timeout=30).out


def manager(ctx: Context, name: str, step: Step) -> Manager:
    return manager_for(ctx, name, step.name, step.timeout_s)


def manager_for(ctx: Context, name: str, step: str = "status", timeout: float = 60.0) -> Manager:
    service = ctx.host.services[name]
    cls = SystemdManager if service.systemd else CommandManager
    return cls(ctx, name, service, step, timeout)


def answers(transport: Transport, url: str) -> bool:
    """Does url answer 200 on the target's own loopback? Asked by the agent there: no tunnel."""
    return transport.http(url, timeout=2.0).status == 200


class CoRestartParams(Strict):
    services: list[str] | None = None  # default: every service of the host, in inventory order
    timeout_s: float = 60.0


class CoRestart(Step):
    kind = "co_restart"
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

    def plan(self, ctx: Context) -> list[Action]:
        managers = [manager(ctx, n, self) for n in self.names(ctx)]
        actions = [a for m in reversed(managers) for a in m.stop_actions()]
        for m in managers:
            actions += m.start_actions()
            if m.service.health:
                actions.append(Action(f"wait up to {m.service.health_timeout_s:g}s for {m.service.health} "
                                      "to answer 200"))
        return actions

    def run(self, ctx: Context) -> str:
        managers = [manager(ctx, n, self) for n in self.names(ctx)]
        seen = {m.name: m.observe() for m in managers}
        old = {n: s.pid for n, s in seen.items()}
        for m in reversed(managers):
            how = m.stop()
            ctx.emit("service_stopped", service=m.name, pid=old[m.name], pid_alive=old[m.name] is not None,
                     health_answering=seen[m.name].health, seen=seen[m.name].describe(), how=how)
        for m in managers:
            # Something deployer does not know about (started by hand, no pid file) still serving
            # would answer the health check for the new process, which could not even bind.
            if m.service.health and answers(ctx.transport, m.service.health):
                raise m.fail(f"{m.service.health} still answers after the stop, so another process serves it "
                             f"(pid {old[m.name] or 'unknown: started outside deployer'}); stop it once by hand "
                             "or give the service a `stop` command")
        new: dict[str, int | None] = {}
        for m in managers:
            ctx.cancel.check()
            m.start()
            new[m.name] = self._wait_healthy(ctx, m)
            ctx.emit("service_started", service=m.name, pid=new[m.name])
        ctx.emit("restart", pids={n: {"old": old[n], "new": new[n]} for n in old})
        ctx.facts.pids = {n: {"old": old[n], "new": new[n]} for n in old}
        for m in managers:
            if new[m.name] is None or new[m.name] == old[m.name]:
                raise m.fail(f"PID did not change ({pid_text(old[m.name])} -> {pid_text(new[m.name])}): "
                             "the restart did not happen")
            if m.pid() != new[m.name]:
                raise m.fail(f"pid {new[m.name]} exited right after its health check passed")
        return "; ".join(f"{n}: was {seen[n].describe()}; pid {pid_text(old[n])} -> {pid_text(new[n])}" for n in old)

    def _wait_healthy(self, ctx: Context, m: Manager) -> int | None:
        deadline = time.monotonic() + m.service.health_timeout_s
        url = m.service.health
        while True:
            pid = m.pid()
            if pid is None:
                raise m.fail("exited during start-up")
            if url is None or answers(ctx.transport, url):
                return pid
            if time.monotonic() >= deadline:
                raise m.fail(f"{m.service.health} did not answer 200 within {m.service.health_timeout_s:g}s")
            ctx.cancel.wait(0.2)
