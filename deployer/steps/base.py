"""What every step is: typed params, a pure plan() of the actions it will do, and run() that does them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import Enum
from typing import Any, ClassVar

from deployer.config.models import Strict
from deployer.steps.action import Action
from deployer.steps.context import Context

__all__ = ["Action", "Effect", "NoParams", "Scope", "Step"]


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


class Step(ABC):
    """The core every step kind has: its kind's name, typed params, the effect the run's state machine follows, its
    scope in a unit, plan() and run(), and describe(), the record of it the run's log keeps. Anything more is a
    protocol of steps/optional.py that a kind opts into."""

    kind: ClassVar[str]
    Params: ClassVar[type[Strict]] = NoParams
    effect: ClassVar[Effect] = Effect.observes
    scope: ClassVar[Scope] = Scope.each_host
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
        """The step as data, as the run's log records it (run_start's `steps`): every step has one."""
        return {"kind": self.kind, "name": self.name, "params": self.params.model_dump()}


def no_url(given: str | None, host_has: str | None, host_name: str, what: str, field: str,
           on_step: str = "`url`") -> str | None:
    """ChecksHost.check_host's answer for a step that needs a URL, given on the step or by a field of the host."""
    if given is None and host_has is None:
        return f"no {what} URL: set `{field}` on host {host_name} or {on_step} on the step"
    return None
