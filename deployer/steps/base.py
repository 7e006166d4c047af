"""What every step is: typed params, a pure plan() of the commands it will run, and run()."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from deployer.command import shell_line
from deployer.config import Host, Strict
from deployer.context import Context


class NoParams(Strict):
    pass


@dataclass(frozen=True)
class Action:
    """One thing a step will do: a command on the target, or work done here (argv None)."""

    what: str
    argv: tuple[str, ...] | None = None
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = ()

    def render(self) -> str:
        if self.argv is None:
            return self.what
        return f"{self.what}: {shell_line(self.argv, cwd=self.cwd, env=dict(self.env))}"


class Step(ABC):
    kind: ClassVar[str]
    Params: ClassVar[type[Strict]] = NoParams
    # Steps that change the target's files: a failure before the commit restores them.
    changes_files: ClassVar[bool] = False
    # In a playbook that uploads, these kinds must come earlier / later than this step.
    after: ClassVar[tuple[str, ...]] = ()
    before: ClassVar[tuple[str, ...]] = ()
    timeout_s: float

    def __init__(self, params: Strict, name: str, where: str = "") -> None:
        self.params = params
        self.name = name
        self.where = where  # file:line:column of the step in its playbook, for errors
        self.timeout_s = float(getattr(params, "timeout_s", 120.0))

    def check_host(self, host_name: str, host: Host) -> str | None:
        """What this step needs from the inventory host and does not get (checked before connecting)."""
        return None

    @abstractmethod
    def plan(self, ctx: Context) -> list[Action]:
        """What run() would do, computed without changing anything."""

    @abstractmethod
    def run(self, ctx: Context) -> str:
        """Do it; return a one-line summary; raise StepFailed (or a DeployerError) on failure."""

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "params": self.params.model_dump()}
