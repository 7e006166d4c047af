"""How a run's record here ends: in the phase the target holds, even when the record cannot be written (a full
disk). The target stays consistent all the same; the phase it holds is kept in memory and written at the run's
end, or `deployer recover` writes it once the runs dir has room."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from deployer.errors import ChecksFailed, DeployerError
from deployer.runlog import utc_now
from deployer.runstate import Phase, RunRecord, RunRecordError


@dataclass
class Ending:
    """How a run ends in its record, and what it could not record."""
    record: RunRecord
    # The settled phase the target holds that the record here could not be moved to.
    unrecorded: tuple[Phase, dict[str, Any], RunRecordError] | None = None

    @property
    def held(self) -> Phase:
        """The phase the target holds (the record's own, unless it could not be written)."""
        return self.unrecorded[0] if self.unrecorded else self.record.state.phase

    def end(self, phase: Phase, **fields: Any) -> None:
        """Settle the record in the phase the target now holds. A record that cannot be written here (a full
        disk) leaves the target no less consistent: the run clears its intent record all the same, and tries
        the record again at its end."""
        try:
            self.record.advance(phase, utc_now(), **fields)
        except RunRecordError as exc:
            # Ended again in the same phase (the run's end after its commit's), what the first end knew is kept.
            known = self.unrecorded[1] if self.unrecorded is not None and self.unrecorded[0] == phase else {}
            self.unrecorded = (phase, {**known, **fields}, exc)

    def settle(self, failure: DeployerError) -> None:
        """A run that stops leaves a phase that says what the target holds; never a forward phase."""
        state = self.record.state
        if state.terminal or state.phase == Phase.interrupted or self.unrecorded is not None:
            return
        if isinstance(failure, ChecksFailed) and state.phase == Phase.rolling_back:  # the revert stands
            self.end(Phase.rolled_back, rollback_commit=failure.commit, checks_failed=failure.checks)
            return
        if state.phase in (Phase.preparing, Phase.locked):  # nothing was changed
            self.end(Phase.failed_restored, error=str(failure))
        else:  # the step's own handling did not get to say: the target may be in between
            # Unwritable (a full disk), the record keeps its forward phase: it too says the target may be there.
            with contextlib.suppress(RunRecordError):
                self.record.advance(Phase.interrupted, utc_now(), error=str(failure))

    def retry(self) -> str | None:
        """At the run's end, the record gets its end if there is room again; else what to do."""
        if self.unrecorded is None:
            return None
        phase, fields, exc = self.unrecorded
        with contextlib.suppress(RunRecordError):
            self.record.advance(phase, utc_now(), **fields)
            self.unrecorded = None
            return None
        return (f"The target is consistent ({phase.value}), but {exc}: the record here still says "
                f"{self.record.state.phase.value}. Once the runs dir has room, `deployer recover "
                f"{self.record.state.run_id}` ends the record and the log")
