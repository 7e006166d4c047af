"""co_restart: restart coupled services together onto the new commit, and prove each restart happened.

Prefill and decode cache each other's connection state, so they go down together (reverse order) and come
up in order, each healthy before the next starts. A restart whose PID did not change did not happen. A
service with `gpus:` starts only once its GPUs are released (services/gpu.py): a new server loading onto
memory the old one still holds dies of out-of-memory.

One routine (Restart) does it over its members, each service's manager on its own host's connection: one
host's services, or a unit's services across its hosts. It is a list of stages, each one manager's part of
one phase with the actions it plans; plan() lists those actions and run() does the stages in that order, so
the dry run shows what the run does by construction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

from pydantic import Field

from deployer.agent.protocol import Ready, ReadyCheck
from deployer.config.models import Host, Strict
from deployer.diffs import DiffStat
from deployer.errors import ConfigError, StepFailed
from deployer.steps.action import Action
from deployer.steps.base import Effect, Scope, Step
from deployer.steps.context import NOTHING, Context
from deployer.steps.optional import ChecksHost, JudgedThere, JudgesEarly, Narrows, Ordered, Refuses, SpansUnit
from deployer.steps.services import manager_for
from deployer.steps.services.gang import GangStart
from deployer.steps.services.gpu import GpuWait
from deployer.steps.services.manager import Manager, Observed, not_ours, pid_text


@dataclass(frozen=True)
class Stage:
    """One manager's part of one phase: the actions it plans, and what does exactly them; named as a person
    reads it in a brief plan (`stop decode`), where the phase's actions are one line."""

    actions: list[Action]
    do: Callable[[], None]
    label: str = ""


@dataclass
class Restart:
    """co_restart's body over its members, wherever each runs; the pid bookkeeping (facts.pids, the `restart`
    event) is written here, for each host, with the members on it."""

    members: list[Manager]  # in start order
    tags: Mapping[str, str]  # on every event it emits (a unit's name)
    leader: tuple[str, str] | None = None  # a gang's (host, service): its members start at once (gang.py)
    seen: dict[Manager, Observed] = field(default_factory=dict)
    new: dict[Manager, int] = field(default_factory=dict)
    gpus: dict[Manager, GpuWait] = field(init=False)

    def __post_init__(self) -> None:
        self.gpus = {m: GpuWait(m) for m in self.members if m.service.gpus}
        for m in self.members:  # the events each manager emits itself carry them too
            m.tags = self.tags
            if self.leader is not None and (m.ctx.host_name, m.name) != self.leader:
                m.up_health = None  # a gang's health is its leader's: the other ranks' liveness is their process

    def stages(self) -> list[Stage]:
        def each(do: Callable[[Manager], None], actions: Callable[[Manager], list[Action]],
                 order: Sequence[Manager], label: str) -> list[Stage]:
            return [Stage(actions(m), partial(do, m), label.format(self.named(m))) for m in order]
        ms = self.members
        return [*each(self.observe, lambda m: m.observe_actions(), ms, "see {}'s process and health"),
                *each(self.stop, lambda m: m.stop_actions(), ms[::-1], "stop {}"),
                *each(self.free, lambda m: m.free_actions(), ms, "nothing else answers after the stops"),
                *(self.gang_starting() if self.leader else [s for m in ms for s in self.starting(m)]),
                Stage([], self.record),
                *each(self.confirm, lambda m: m.confirm_actions(), ms, "the new processes still run")]

    def named(self, m: Manager) -> str:
        """The service as a brief plan names it: with its host, where the restart spans hosts."""
        return m.name if len(self.by_host()) == 1 else f"{m.name} on {m.ctx.host_name}"

    def plan(self) -> list[Action]:
        # The failure's reads last (memory, log tail): each is done only by the failure that ends the run.
        return [*(replace(a, group=stage.label) for stage in self.stages() for a in stage.actions),
                *(replace(a, group="if a start fails: what it held and its log")
                  for m in self.members for a in m.failure_reads())]

    def run(self) -> dict[str, str]:
        """Do every stage in the plan's order; what happened, for each host."""
        for stage in self.stages():
            stage.do()
        return {host: "; ".join(f"{m.name}: was {self.seen[m].describe()}; pid {pid_text(self.seen[m].pid)} -> "
                                f"{pid_text(self.new[m])}" for m in mine) for host, mine in self.by_host().items()}

    def by_host(self) -> dict[str, list[Manager]]:
        hosts: dict[str, list[Manager]] = {}
        for m in self.members:
            hosts.setdefault(m.ctx.host_name, []).append(m)
        return hosts

    def observe(self, m: Manager) -> None:
        self.seen[m] = m.observe()

    def stop(self, m: Manager) -> None:
        seen = self.seen[m]
        how = m.stop(seen.pid)
        m.ctx.emit("service_stopped", service=m.name, pid=seen.pid, pid_alive=seen.pid is not None,
                   health_answering=seen.health, seen=seen.describe(), how=how, **self.tags)

    def free(self, m: Manager) -> None:
        # Something deployer does not know about (started by hand, no pid file) still serving would answer
        # the health check for the new process, which could not even bind.
        if m.answers_after_stop():
            raise m.fail(f"{m.service.health} still answers after the stop, so another process serves it "
                         f"(pid {self.seen[m].pid or 'unknown: started outside deployer'}); stop it once by hand "
                         "or give the service a `stop` command")

    def starting(self, m: Manager) -> list[Stage]:
        """Its GPUs released (when it has any), then its start: each start waits for its own GPUs."""
        wait = [self.gpu_wait(m)] if m in self.gpus else []
        return [*wait, Stage(m.start_actions(), partial(self.start, m), f"start {self.named(m)}")]

    def gpu_wait(self, m: Manager) -> Stage:
        label = f"wait for {self.named(m)}'s GPUs to be released"
        return Stage(self.gpus[m].actions(), partial(self.released, m), label)

    def gang_starting(self) -> list[Stage]:
        """Every member's GPUs released, then one stage that starts them all at once."""
        waits = [self.gpu_wait(m) for m in self.members if m in self.gpus]
        return [*waits, Stage([a for m in self.members for a in m.start_actions()], self.gang_start,
                              f"start {', '.join(self.named(m) for m in self.members)} at once")]

    def gang_start(self) -> None:
        lead = next(m for m in self.members if (m.ctx.host_name, m.name) == self.leader)
        self.new.update(GangStart(self.members, lead, self.tags).run())

    def released(self, m: Manager) -> None:
        if (problem := self.gpus[m].wait(old_tree(m, self.seen[m]))) is not None:
            raise m.not_started(f"{problem}; {self.left_down()}")

    def left_down(self) -> str:
        """What a failure between the stops and the last start leaves: the services stopped and not started."""
        down = [m.name for m in self.members if m not in self.new]
        return f"not started (stopped by this restart): {', '.join(down)}"

    def start(self, m: Manager) -> None:
        m.ctx.cancel.check()
        self.new[m] = m.start()
        m.ctx.emit("service_started", service=m.name, pid=self.new[m], **self.tags)

    def record(self) -> None:
        for mine in self.by_host().values():
            pids = {m.name: {"old": self.seen[m].pid, "new": self.new[m]} for m in mine}
            ctx = mine[0].ctx
            ctx.emit("restart", pids=pids, **self.tags)
            ctx.facts.pids = pids

    def confirm(self, m: Manager) -> None:
        old, new = self.seen[m].pid, self.new[m]
        if new == old:
            raise m.fail(f"PID did not change ({pid_text(old)} -> {pid_text(new)}): the restart did not happen")
        if not m.still_runs(new):
            raise m.fail(f"pid {new} exited right after its health check passed")


def ready_there(ctx: Context, ready: Ready) -> bool:
    """Whether the agent finds the target ready (one round trip for every service); False: nothing to ask, or it
    did not, and the judgement reads each service here, in its own words."""
    return bool(ready.services or ready.gpus) and ctx.transport.submit(ReadyCheck(ready)).declined() is None


def old_tree(m: Manager, seen: Observed) -> set[int]:
    """The old server's processes (the tree its stop ended, and the pid observe found): what may still hold its
    GPUs."""
    return m.old_tree | ({seen.pid} if seen.pid is not None else set())


class CoRestartParams(Strict):
    services: list[str] | None = Field(default=None, description=(
        "The services restarted, in start order (default: every service of the host, in inventory order)."))
    timeout_s: float = Field(default=60.0, description="Seconds each stop or start command may take.")


class CoRestart(Step, ChecksHost, JudgesEarly, Refuses, JudgedThere, Narrows, SpansUnit, Ordered):
    """Restart the services as one: stopped in reverse order, started in order, each proven by a new PID and health."""

    kind = "co_restart"
    scope = Scope.unit
    effect = Effect.restarts
    Params = CoRestartParams
    params: CoRestartParams
    after = ("commit",)
    judges = "services"

    def judge_here(self, ctx: Context, projected: Callable[[], DiffStat]) -> list[str]:
        """Before the run changes anything: a service whose health answers while no process of deployer's (nor
        an adopted one) runs it would make the restart fail after the commit, so the run is refused now."""
        ready = self.judged_there(ctx)
        if ready is not None and ready_there(ctx, Ready(services=ready.services)):
            return []
        found = [(m, m.observe()) for m in (manager_for(ctx, n, self.name) for n in self.names(ctx))]
        return [f"service {m.name}: {not_ours(ctx.host_name, m.name, m.service)}" for m, seen in found
                if seen.pid is None and seen.health]

    def check_host(self, host_name: str, host: Host) -> str | None:
        names = self.params.services if self.params.services is not None else list(host.services)
        unknown = [n for n in names if n not in host.services]
        if unknown or not names:
            return (f"host {host_name} defines no service {', '.join(unknown) or '(none)'} "
                    f"(it has: {', '.join(host.services) or 'none'})")
        return None

    def names(self, ctx: Context) -> list[str]:
        # The inventory's check, again at run time (a unit's part overrides both: its services were checked
        # against the unit when it was formed).
        if problem := CoRestart.check_host(self, ctx.host_name, ctx.host):
            raise StepFailed(self.name, problem)
        return self.params.services if self.params.services is not None else list(ctx.host.services)

    def refusals(self, ctx: Context) -> list[str]:
        ready = self.judged_there(ctx)
        if ready is not None and ready_there(ctx, Ready(gpus=ready.gpus)):
            return []
        managers = [manager_for(ctx, n, self.name) for n in self.names(ctx)]
        own = [problem for m in managers for problem in m.refusals()]
        return own + [problem for wait in map(GpuWait, (m for m in managers if m.service.gpus))
                      if (problem := wait.problem()) is not None]

    def judged_there(self, ctx: Context) -> Ready | None:
        """judge_here() and refusals() as the premise checks them on the target: each service answering only
        through the process deployer recorded for it, and its GPUs listed. None: a service whose manager only
        here can tell whose process serves it (systemd, a container, a pod)."""
        managers = [manager_for(ctx, n, self.name) for n in self.names(ctx)]
        services = [m.judged_there() for m in managers]
        if not all(services):
            return None
        return Ready([s for s in services if s], [GpuWait(m).judged_there() for m in managers if m.service.gpus])

    def restart(self, members: Sequence[tuple[Context, str]], name: str, tags: Mapping[str, str],
                leader: tuple[str, str] | None = None) -> Restart:
        return Restart([manager_for(ctx, service, name, self.timeout_s) for ctx, service in members], tags, leader)

    def plan(self, ctx: Context) -> list[Action]:
        return self.restart([(ctx, n) for n in self.names(ctx)], self.name, NOTHING).plan()

    def keeping(self, ctx: Context, started: Mapping[str, tuple[int, str]]
                ) -> tuple[CoRestart | None, list[str], list[str]]:
        """For a run that finishes another (recover of a cut run, a rollback again after one that stopped): this
        restart over only the services that do not serve the run's commit (or its revert) yet (None: all do), and
        those kept. `started` names the process an earlier run started for each service after its commit, or its
        revert (its log), and that run; one is kept while deployer's record names that very process (its pid with
        the start time its launch recorded) and its health answers: restarting it would be a second outage for
        nothing."""
        kept: list[str] = []
        for name in self.names(ctx):
            if name not in started:
                continue
            pid, by = started[name]
            seen = manager_for(ctx, name, self.name).observe()
            if seen.pid == pid and not seen.adopted and seen.health is not False:
                kept.append(name)
                ctx.emit("service_kept", service=name, pid=seen.pid,
                         why=f"started by run {by}, still that process, health answering")
        rest = [n for n in self.names(ctx) if n not in kept]
        if not rest or not kept:
            return (self if rest else None), kept, rest
        return CoRestart(self.params.model_copy(update={"services": rest}), self.name, self.where), kept, rest

    def run(self, ctx: Context) -> str:
        return self.across([(ctx, n) for n in self.names(ctx)], self.name)[ctx.host_name]

    # -- in a unit ---------------------------------------------------------------------------------------

    def members_in(self, unit: str, members: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        chosen = self.params.services
        unknown = [n for n in chosen or [] if n not in {service for _, service in members}]
        if unknown:
            raise ConfigError(f"{self.where}: {self.name}: unit {unit} has no service {', '.join(unknown)} "
                              f"(it has: {', '.join(f'{h}:{s}' for h, s in members)})")
        return [(h, s) for h, s in members if chosen is None or s in chosen]

    def part(self, services: list[str]) -> Step:
        return UnitRestart(self.params, self.name, self.where, services)

    def across(self, members: Sequence[tuple[Context, str]], name: str, leader: tuple[str, str] | None = None,
               **tags: str) -> dict[str, str]:
        return self.restart(members, name, tags, leader).run()


class UnitRestart(CoRestart):
    """co_restart on one host of a unit: the unit restarts its services across hosts as one (across); on one
    host the step names that host's part, which is what its plan shows and its run log describes."""

    def __init__(self, params: Strict, name: str, where: str, here: list[str]) -> None:
        super().__init__(params, name, where)
        self.here = here

    def check_host(self, host_name: str, host: Host) -> str | None:
        return None  # checked against the unit's services when the unit is formed

    def names(self, ctx: Context) -> list[str]:
        return self.here


def services_restarted(steps: Sequence[Step], host: Host) -> list[str]:
    """The services the co_restart steps among steps restart on host, in order (one naming none: every one of
    the host's): what a failed restart reads again to say which are down."""
    names: list[str] = []
    for step in steps:
        if isinstance(step, CoRestart):
            names += [n for n in (step.params.services or list(host.services)) if n not in names]
    return names
