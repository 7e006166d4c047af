"""What every step is: typed params, a pure plan() of the actions it will do, and run() that does them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from deployer.config.models import Host, Strict
from deployer.diffs import DiffStat
from deployer.steps.action import Action
from deployer.steps.context import Context

if TYPE_CHECKING:
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
    """The core every step kind has: its kind's name, typed params, the effect the run's state machine follows, its
    scope in a unit, plan() and run(). Anything more is a protocol of steps/optional.py that a kind opts into;
    the four hooks below answer for a kind that has nothing to say, and are asked of every step by the inventory
    check, `deployer check` and the plan."""

    kind: ClassVar[str]
    Params: ClassVar[type[Strict]] = NoParams
    effect: ClassVar[Effect] = Effect.observes
    scope: ClassVar[Scope] = Scope.each_host
    # What judge_here() judges, when it does: the plan and `deployer check` report each under this label.
    judges: ClassVar[str] = ""
    timeout_s: float

    def __init__(self, params: Strict, name: str, where: str = "") -> None:
        self.params = params
        self.name = name
        self.where = where  # file:line:column of the step in its playbook, for errors
        self.timeout_s = float(getattr(params, "timeout_s", 120.0))

    @abstractmethod
    def plan(self, ctx: Context) -> list[Action]:
        """What run() would do, computed without changing anything."""

    @abstractmethod
    def run(self, ctx: Context) -> str:
        """Do it; return a one-line summary; raise StepFailed (or a DeployerError) on failure."""

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "params": self.params.model_dump()}

    def check_host(self, host_name: str, host: Host) -> str | None:
        """What this step needs from the inventory host and does not get (checked before connecting)."""
        return None

    def reach_routers(self, routers: Callable[[], RouterReach]) -> None:
        """The inventory's routers (read when called), for a step that sends through one: the canary's `via:`."""
        return

    def judge_here(self, ctx: Context, projected: Callable[[], DiffStat]) -> list[str]:
        """What would fail this step, judged before the run touches the target, whatever the step's place in the
        playbook (`projected()` is the diff the plan projects, counted on first call), so a broken fix never
        costs a storm. "Here": in the run's preparation, from the shipped bytes and the target's HEAD (read-only
        reads allowed). Only steps that set `judges`."""
        return []

    def live_checks(self, ctx: Context) -> list[LiveCheck]:
        """What `deployer check` reads for this step, live and read-only (a metric step: its gauge now)."""
        return []


def no_url(given: str | None, host_has: str | None, host_name: str, what: str, field: str,
           on_step: str = "`url`") -> str | None:
    """check_host's answer for a step that needs a URL, given on the step or by a field of the host."""
    if given is None and host_has is None:
        return f"no {what} URL: set `{field}` on host {host_name} or {on_step} on the step"
    return None
