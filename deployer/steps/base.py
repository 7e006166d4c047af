"""What every step is: typed params, a pure plan() of the actions it will do, and run() that does them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from deployer.config.models import Host, Strict
from deployer.diffs import DiffStat
from deployer.steps.action import Action
from deployer.steps.context import Context, Submitted

if TYPE_CHECKING:
    from deployer.agent.client import Pending
    from deployer.config.routers import Router
    from deployer.transport.base import Transport

__all__ = ["Action", "Effect", "LiveCheck", "NoParams", "Scope", "Step"]


class RouterReach(Protocol):
    """The inventory's routers and a connection to a router's host (fleet.router.Routers): what a step that
    sends through a router (the canary's `via:`) is given, typed here so that steps need not import the fleet."""

    @property
    def specs(self) -> dict[str, Router]: ...

    @property
    def connect(self) -> Callable[[str], Transport] | None: ...


class NoParams(Strict):
    pass


class Effect(str, Enum):
    """What a step does to the target: the run's state machine follows these, never step kinds."""

    observes = "observes"  # reads the target, or works here: no new phase
    changes_files = "changes_files"  # a failure before the commit restores the files
    commits = "commits"  # leaves the run's commit (found again by its trailer)
    restarts = "restarts"  # services go down and come back on the new code
    verifies = "verifies"  # checks the running services; after the commit its failure is on_failure's
    loads = "loads"  # sends load that provokes the bug: proof for a fix, never repeated on a rolled-back build


class Scope(str, Enum):
    """Where a step runs when the host is one of a unit's (a service split across hosts, restarted as one):
    fleets follow these, never step kinds."""

    each_host = "each_host"  # every host of the unit runs it in its own run
    metrics_host = "metrics_host"  # once, on the unit's metrics host: it reads or loads the unit's service
    unit = "unit"  # across the unit's hosts as one (co_restart: stops in reverse order, starts in order)


@dataclass(frozen=True)
class LiveCheck:
    """A row of `deployer check`: what a step reads on the target now, and whether its run could start from it."""

    name: str
    ok: bool
    detail: str


class Step(ABC):
    kind: ClassVar[str]
    Params: ClassVar[type[Strict]] = NoParams
    effect: ClassVar[Effect] = Effect.observes
    scope: ClassVar[Scope] = Scope.each_host
    # In a playbook that uploads, these kinds must come earlier / later than this step.
    after: ClassVar[tuple[str, ...]] = ()
    before: ClassVar[tuple[str, ...]] = ()
    # What judge_here() judges, when it does: the plan reports each under this label ("bounds", "compile").
    judges: ClassVar[str] = ""
    # Runs here alone, never on the target: a run may send its changes before this step's turn (run/whole.py).
    local: ClassVar[bool] = False
    # Its judge_here() or refusals() read the target before the run changes it: the changes wait for that answer.
    judged_on_target: ClassVar[bool] = False
    timeout_s: float

    def __init__(self, params: Strict, name: str, where: str = "") -> None:
        self.params = params
        self.name = name
        self.where = where  # file:line:column of the step in its playbook, for errors
        self.timeout_s = float(getattr(params, "timeout_s", 120.0))

    def prefetch(self, ctx: Context) -> list[Submitted]:
        """Send this step's read-only commands ahead of its turn (in ctx.prefetched under its name), right
        after the step before it sent its changes: the agent runs them in order, so they see those
        changes, and the whole stretch costs one round trip. Steps that may do so override this."""
        return []

    def decided_there(self, ctx: Context) -> bool:
        """Whether this step passes exactly when each command its prefetch() sent succeeded by the agent's rule
        (exit 0, and the output it was told to expect): then the target itself can hold back what comes after
        it, and a commit may be sent with the changes, behind it (see send_ahead)."""
        return False

    def send_ahead(self, ctx: Context, after: Sequence[Pending[Any]]) -> bool:
        """Send this step with the changes before it, to run on the target only if each of `after` succeeded
        (ctx.ahead holds it until the step runs); False: this step is sent in its turn."""
        return False

    def send_changes(self, ctx: Context) -> list[Submitted] | None:
        """A step that changes files: send every change now, not waiting for one, so the run can send them
        before its turn (run/whole.py) and the step takes them in as it runs (Step.sent). None: it cannot."""
        return None

    def landed(self, ctx: Context) -> None:
        """The run stops before this step's turn: take in what send_ahead sent, which may have run all the same
        (a step that sends nothing ahead has nothing to take in)."""
        ctx.ahead.pop(self.name, None)

    def sent(self, ctx: Context) -> list[Submitted] | None:
        """What prefetch() sent for this run, if anything."""
        return ctx.prefetched.pop(self.name, None)

    def check_host(self, host_name: str, host: Host) -> str | None:
        """What this step needs from the inventory host and does not get (checked before connecting)."""
        return None

    def reach_routers(self, routers: Callable[[], RouterReach]) -> None:
        """The inventory's routers (read when called), for a step that sends through one: the canary's `via:`."""
        return

    def judge_here(self, ctx: Context, projected: Callable[[], DiffStat]) -> list[str]:
        """What would fail this step, judged from the shipped bytes and the target's HEAD alone (`projected()`
        is the diff the plan projects, counted on first call): the engine asks before the run touches the
        target, whatever the step's place in the playbook, so a broken fix never costs a storm. Only steps that
        set `judges`."""
        return []

    def plan_note(self, ctx: Context, steps: Sequence[Step]) -> str | None:
        """What the plan should warn of about this step in this playbook (read-only reads allowed), or None."""
        return None

    def refusals(self, ctx: Context) -> list[str]:
        """What the target lacks for this step's run, read live and read-only right after preflight (nvidia-smi
        for a service with `gpus:`): any refuses the run before anything changes (exit 1)."""
        return []

    def after_revert(self, baseline: Mapping[str, float]) -> Step | str:
        """This step as a rollback runs it again on the reverted build (only steps that restart or verify), or
        why it does not (a string, shown as not run). Itself by default (a restart, a canary); a check of the
        fix's own symptom judges the old build against the run's baseline (metric -> value before the fix)."""
        return self

    def keeping(self, ctx: Context, started: Mapping[str, int]) -> tuple[Step | None, list[str], list[str]]:
        """For a recover: this step over only the services that do not serve the cut run's commit yet (None: all
        do), the services kept and those it restarts; `started` names the process the cut run started for each
        service after its commit. Only a restart narrows (co_restart); any other step runs as it is."""
        return self, [], []

    def live_checks(self, ctx: Context) -> list[LiveCheck]:
        """What `deployer check` reads for this step, live and read-only (a metric step: its gauge now)."""
        return []

    # -- a step of scope `unit` spans a unit's hosts as one, and implements these -------------------------

    def members_in(self, unit: str, members: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """Which of a unit's (host, service) members the step works on, in unit order (ConfigError: it names a
        service the unit lacks)."""
        raise NotImplementedError(f"{self.kind} does not span a unit")

    def part(self, services: list[str]) -> Step:
        """The step as one host of a unit runs it in its own run (its plan, its check): that host's services."""
        raise NotImplementedError(f"{self.kind} does not span a unit")

    def across(self, members: Sequence[tuple[Context, str]], name: str, leader: tuple[str, str] | None = None,
               **tags: str) -> dict[str, str]:
        """Do it on members (each host's connection and a service) as one, tags on its events; each host's summary.
        leader: the unit is a gang, and this (host, service) its leader."""
        raise NotImplementedError(f"{self.kind} does not span a unit")

    @abstractmethod
    def plan(self, ctx: Context) -> list[Action]:
        """What run() would do, computed without changing anything."""

    @abstractmethod
    def run(self, ctx: Context) -> str:
        """Do it; return a one-line summary; raise StepFailed (or a DeployerError) on failure."""

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "params": self.params.model_dump()}


def no_url(given: str | None, host_has: str | None, host_name: str, what: str, field: str,
           on_step: str = "`url`") -> str | None:
    """check_host's answer for a step that needs a URL, given on the step or by a field of the host."""
    if given is None and host_has is None:
        return f"no {what} URL: set `{field}` on host {host_name} or {on_step} on the step"
    return None
