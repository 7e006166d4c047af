"""What a step kind may do beyond the core (base.Step), each a small protocol the kind opts into.

A kind opts in by naming the protocol among its bases and defining its members (mypy then holds them to the
protocol's signatures). The run asks through the functions beside each protocol, which answer for a kind that did
not opt in (outside steps/ no code tests a step's class: tests/test_structure.py). A new kind that only plans and
runs needs none of them.

- Prefetches, SendsChanges, SendsAhead, RunsHere: what a step adds to the run's first round trip (run/ahead.py,
  run/whole.py); a kind that opts into none simply runs in its turn.
- SpansUnit: a step of scope `unit`, done across a unit's hosts as one (fleet/unit.py); the registry refuses a
  kind of that scope without it.
- Narrows, Rejudged: what a recover and a rollback make of the step (run/recover.py, run/revert_checks.py).
- Refuses, JudgedThere, NotesPlan, Ordered: what the target must offer before the run changes it (and whether
  the agent can judge that inside a premise), what the plan warns of, where the step goes in a playbook that
  uploads.
- ChecksHost, JudgesEarly, ReadsLive, ReachesRouters: what the inventory check, the plan, the run's preparation
  and `deployer check` ask of a step (app/checks.py, run/engine.py, run/plan.py, run/prepare.py, build.py).

- UnderTraffic: a check that a routed unit runs once it is back in its router (steps/canary.py's around_router).

RunsHere, Ordered and UnderTraffic hold no method: they are plain classes, named among a kind's bases all the same.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from deployer.config.models import Host
from deployer.diffs import DiffStat
from deployer.steps.base import Scope, Step
from deployer.steps.context import Context, Submitted

if TYPE_CHECKING:
    from deployer.agent.client import Pending
    from deployer.agent.protocol import Ready
    from deployer.config.routers import Router
    from deployer.transport.base import Transport


# -- the first round trip ----------------------------------------------------------------------------------


@runtime_checkable
class Prefetches(Protocol):
    """A read-only step whose commands go ahead of its turn, right after the step before it sent its changes: the
    agent runs them in order, so they see those changes, and the whole stretch costs one round trip."""

    @abstractmethod
    def prefetch(self, ctx: Context) -> list[Submitted]:
        """Send this step's commands now (the run keeps them in ctx.prefetched under its name; `sent` takes them)."""

    @abstractmethod
    def target_decides(self, ctx: Context) -> bool:
        """Whether this step passes exactly when each command prefetch() sent succeeded by the agent's rule (exit 0,
        and the output it was told to expect): then the target itself can hold back what comes after it, and a
        commit may be sent with the changes, behind it (SendsAhead)."""


@runtime_checkable
class SendsChanges(Protocol):
    """A step that changes files and can send every change at once, not waiting for one, so that the run sends them
    before its turn, with the lock (run/whole.py); its run takes them in (`sent`)."""

    @abstractmethod
    def send_changes(self, ctx: Context) -> list[Submitted] | None:
        """Send every change now; None: it cannot (a patch, applied to bytes read first)."""


@runtime_checkable
class SendsAhead(Protocol):
    """A step sent with the changes before it, to run on the target only if each of them succeeded (the commit,
    behind checks the target decides)."""

    @abstractmethod
    def send_ahead(self, ctx: Context, after: Sequence[Pending[Any]]) -> bool:
        """Send it now, behind `after` (ctx.ahead holds it until its turn); False: it is sent in its turn."""

    @abstractmethod
    def settle(self, ctx: Context) -> None:
        """The run stops before this step's turn: what send_ahead sent may have run all the same; take it in."""


class RunsHere:
    """A step that runs on this machine alone, never on the target (local_compile): a run may send its changes
    before this step's turn (run/whole.py)."""


def runs_here(step: Step) -> bool:
    return isinstance(step, RunsHere)


def sent(step: Step, ctx: Context) -> list[Submitted] | None:
    """What the run sent for this step before its turn (Prefetches, SendsChanges), taken out: None when nothing was."""
    return ctx.prefetched.pop(step.name, None)


def prefetch(step: Step, ctx: Context) -> list[Submitted]:
    return step.prefetch(ctx) if isinstance(step, Prefetches) else []


def target_decides(step: Step, ctx: Context) -> bool:
    return isinstance(step, Prefetches) and step.target_decides(ctx)


def sends_changes(step: Step) -> bool:
    return isinstance(step, SendsChanges)


def send_changes(step: Step, ctx: Context) -> list[Submitted] | None:
    return step.send_changes(ctx) if isinstance(step, SendsChanges) else None


def send_ahead(step: Step, ctx: Context, after: Sequence[Pending[Any]]) -> bool:
    return isinstance(step, SendsAhead) and step.send_ahead(ctx, after)


def settle(step: Step, ctx: Context) -> None:
    """The run stops before the step's turn: take in what it sent ahead (a step that sent nothing has nothing)."""
    if isinstance(step, SendsAhead):
        step.settle(ctx)
    ctx.ahead.pop(step.name, None)


# -- units ------------------------------------------------------------------------------------------------


@runtime_checkable
class SpansUnit(Protocol):
    """A step of scope `unit`: done across a unit's hosts as one (co_restart: stops in reverse order, starts in
    order)."""

    @abstractmethod
    def members_in(self, unit: str, members: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """Which of a unit's (host, service) members the step works on, in unit order (ConfigError: it names a
        service the unit lacks)."""

    @abstractmethod
    def part(self, services: list[str]) -> Step:
        """The step as one host of a unit runs it in its own run (its plan, its check): that host's services."""

    @abstractmethod
    def across(self, members: Sequence[tuple[Context, str]], name: str, leader: tuple[str, str] | None = None,
               **tags: str) -> dict[str, str]:
        """Do it on members (each host's connection and a service) as one, tags on its events; each host's summary.
        leader: the unit is a gang, and this (host, service) its leader."""


def spanning(step: Step) -> SpansUnit:
    """A step of scope `unit` as the unit runs it (the registry refuses a kind of that scope that cannot)."""
    assert step.scope == Scope.unit and isinstance(step, SpansUnit), step.kind
    return step


# -- a recover, a rollback ----------------------------------------------------------------------------------


@runtime_checkable
class Narrows(Protocol):
    """A restart that a recover narrows to the services that do not serve the cut run's commit yet."""

    @abstractmethod
    def keeping(self, ctx: Context, started: Mapping[str, tuple[int, str]]
                ) -> tuple[Step | None, list[str], list[str]]:
        """This step over only the services that do not serve the cut run's commit yet (None: all do), the services
        kept and those it restarts; `started` names the process the cut run (or a recover of it) started for each
        service after its commit, and the run that started it."""


def keeping(step: Step, ctx: Context, started: Mapping[str, tuple[int, str]]
            ) -> tuple[Step | None, list[str], list[str]]:
    """For a recover: the step as it runs (any step but a restart that narrows runs as it is)."""
    return step.keeping(ctx, started) if isinstance(step, Narrows) else (step, [], [])


@runtime_checkable
class Rejudged(Protocol):
    """A check that a rollback runs differently on the reverted build: a check of the fix's own symptom judges the
    old build against the run's baseline."""

    @abstractmethod
    def after_revert(self, baseline: Mapping[str, float]) -> Step | str:
        """This step as a rollback runs it again (baseline: metric -> value before the fix), or why it does not (a
        string, shown as not run)."""


# How a check that ran on the reverted build and could not judge it begins its summary: a rollback's verdict for it
# is that summary, never "passed" (run/revert_checks.py).
NOT_JUDGED = "not judged"


def after_revert(step: Step, baseline: Mapping[str, float]) -> Step | str:
    """The step as a rollback runs it again on the reverted build: itself unless it opted into Rejudged."""
    return step.after_revert(baseline) if isinstance(step, Rejudged) else step


# -- what the target must offer, what the plan says, where the step goes ---------------------------------------


@runtime_checkable
class Refuses(Protocol):
    """A step that reads the target to judge the run before the run changes it (free GPUs for a service with
    `gpus:`): the changes wait for that answer, so its chain is sent with the lock only when the agent can judge
    it there, inside the premise (JudgedThere)."""

    @abstractmethod
    def refusals(self, ctx: Context) -> list[str]:
        """What the target lacks for this step's run, read live and read-only right after preflight: any refuses
        the run before anything changes (exit 1)."""


@runtime_checkable
class JudgedThere(Protocol):
    """A step whose pre-change judgement of the target (Refuses, and JudgesEarly's reads of it) the agent can
    make inside the premise of a chain sent whole (run/whole.py): the premise holds only where that judgement
    would find nothing; where it does not hold, nothing was changed and the run judges here, in its own words."""

    @abstractmethod
    def judged_there(self, ctx: Context) -> Ready | None:
        """What the premise must find on the target; None: this run's judgement needs this machine."""


def judged_there(step: Step, ctx: Context) -> Ready | None:
    return step.judged_there(ctx) if isinstance(step, JudgedThere) else None


def reads_target_first(step: Step, ctx: Context) -> bool:
    """Whether the step judges the run from the target's answers, here, before the run changes it."""
    return isinstance(step, Refuses) and judged_there(step, ctx) is None


def refusals(step: Step, ctx: Context) -> list[str]:
    return step.refusals(ctx) if isinstance(step, Refuses) else []


@runtime_checkable
class NotesPlan(Protocol):
    """A step that the plan warns about in some playbooks (a drain whose metric no storm raises)."""

    @abstractmethod
    def plan_note(self, ctx: Context, steps: Sequence[Step]) -> str | None:
        """What the plan should warn of about this step in this playbook (read-only reads allowed), or None."""


def plan_note(step: Step, ctx: Context, steps: Sequence[Step]) -> str | None:
    return step.plan_note(ctx, steps) if isinstance(step, NotesPlan) else None


class Ordered:
    """In a playbook that uploads, these kinds must come earlier / later than this step (steps/playbook.py)."""

    after: ClassVar[tuple[str, ...]] = ()
    before: ClassVar[tuple[str, ...]] = ()


@runtime_checkable
class Needs(Protocol):
    """A step whose params need another kind earlier in any playbook (an analysis against `before` needs the
    reads of an analysis_baseline): refused when the playbook loads, never after a commit."""

    @abstractmethod
    def needs(self) -> dict[str, str]:
        """kind -> why this step needs it earlier."""


def needs(step: Step) -> dict[str, str]:
    return step.needs() if isinstance(step, Needs) else {}


# -- what the inventory check, the plan and `deployer check` ask of a step --------------------------------------


@runtime_checkable
class ChecksHost(Protocol):
    """A step that needs something of its inventory host (a URL, a service), checked before anything connects."""

    @abstractmethod
    def check_host(self, host_name: str, host: Host) -> str | None:
        """What this step needs from the inventory host and does not get; None: nothing."""


def check_host(step: Step, host_name: str, host: Host) -> str | None:
    return step.check_host(host_name, host) if isinstance(step, ChecksHost) else None


@runtime_checkable
class JudgesEarly(Protocol):
    """A step that can say what would fail it before the run touches the target, whatever its place in the
    playbook, so a broken fix never costs a storm: the run's preparation, the plan and `deployer check` ask it."""

    judges: ClassVar[str]  # what it judges: the plan and `deployer check` report it under this label

    @abstractmethod
    def judge_here(self, ctx: Context, projected: Callable[[], DiffStat]) -> list[str]:
        """What would fail this step (`projected()` is the diff the plan projects, counted on first call). "Here":
        in the run's preparation, from the shipped bytes and the target's HEAD (read-only reads allowed)."""


def judges(step: Step) -> str:
    """The label of what the step judges early; "": it judges nothing early."""
    return step.judges if isinstance(step, JudgesEarly) else ""


def judge_here(step: Step, ctx: Context, projected: Callable[[], DiffStat]) -> list[str]:
    return step.judge_here(ctx, projected) if isinstance(step, JudgesEarly) else []


@dataclass(frozen=True)
class LiveCheck:
    """A row of `deployer check`: what a step reads on the target now, and whether its run could start from it."""

    name: str
    ok: bool
    detail: str


@runtime_checkable
class ReadsLive(Protocol):
    """A step whose inputs `deployer check` reads live (a metric step: its gauge now)."""

    @abstractmethod
    def live_checks(self, ctx: Context) -> list[LiveCheck]:
        """What `deployer check` reads for this step, live and read-only."""


def live_checks(step: Step, ctx: Context) -> list[LiveCheck]:
    return step.live_checks(ctx) if isinstance(step, ReadsLive) else []


class RouterReach(Protocol):
    """The inventory's routers and a connection to a router's host (fleet.router.Routers): what a step that
    sends through a router (the canary's `via:`) is given, typed here so that steps need not import the fleet."""

    @property
    def specs(self) -> dict[str, Router]: ...

    @property
    def connect(self) -> Callable[[str], Transport] | None: ...


@runtime_checkable
class ReachesRouters(Protocol):
    """A step that sends through a router of the inventory (the canary's `via:`)."""

    @abstractmethod
    def reach_routers(self, routers: Callable[[], RouterReach]) -> None:
        """The inventory's routers (read when called)."""


def reach_routers(step: Step, routers: Callable[[], RouterReach]) -> None:
    if isinstance(step, ReachesRouters):
        step.reach_routers(routers)


class UnderTraffic:
    """A check that judges the new build under the traffic its router sends it (an analysis): a routed unit runs it
    once the unit is back in its router and listed, never while it is out of it, where it would get no request."""


def under_traffic(step: Step) -> bool:
    return isinstance(step, UnderTraffic)
