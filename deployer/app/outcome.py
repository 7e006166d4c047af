"""What a use case that runs returns: one host's run, a fleet's, or several hosts' runs in turn. Each says its
exit code (the command line's), whether it changed a target, and the document `--json` prints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deployer.fleet.record import FleetState
    from deployer.run.engine import RunResult


@dataclass(frozen=True)
class RunOutcome:
    """One host's run (an apply, a rollback, a restart, a recover): its result, recorded under run_id."""

    result: RunResult

    @property
    def run_id(self) -> str:
        return self.result.run_id

    @property
    def exit_code(self) -> int:
        return self.result.exit_code

    @property
    def error(self) -> str | None:
        return self.result.error

    @property
    def changed(self) -> bool:
        """Whether the run left the target otherwise than it found it (Ansible's changed)."""
        return bool(self.document()["changed"])

    def document(self) -> dict[str, Any]:
        return self.result.document()


@dataclass(frozen=True)
class FleetOutcome:
    """A fleet run: every host's sub-run, its batches and how it ended, recorded under run_id (fleet.json)."""

    state: FleetState

    @property
    def run_id(self) -> str:
        return self.state.fleet_id

    @property
    def exit_code(self) -> int:
        return self.state.exit_code or 0

    @property
    def error(self) -> str | None:
        return self.state.error

    @property
    def changed(self) -> bool:
        return any(host.changed for host in self.state.hosts.values())

    def document(self) -> dict[str, Any]:
        return self.state.document()


@dataclass(frozen=True)
class HostsOutcome:
    """Several hosts' runs, one after another or a unit's (unit) as one, each its own run; the exit code of the
    first that failed, 1 when fewer ran than expected."""

    results: dict[str, RunResult]
    expected: int
    unit: str | None = None

    @property
    def failed(self) -> list[RunResult]:
        return [result for result in self.results.values() if result.exit_code]

    @property
    def exit_code(self) -> int:
        failed = self.failed
        return failed[0].exit_code if failed else 0 if len(self.results) == self.expected else 1

    @property
    def error(self) -> str | None:
        failed = self.failed
        return failed[0].error if failed else None

    @property
    def changed(self) -> bool:
        return any(one.document()["changed"] for one in self.results.values())

    def document(self) -> dict[str, Any]:
        return {**({"unit": self.unit} if self.unit is not None else {}),
                "hosts": {host: result.document() for host, result in self.results.items()},
                "exit_code": self.exit_code, "error": self.error}
