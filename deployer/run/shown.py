"""The state a recorded run is shown with: the README's names, read from its record, never a guess."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from deployer.errors import DeployerError
from deployer.runlog import Run, read_run
from deployer.runstate import FORWARD, Phase, RunRecord

REFUSED = "refused"  # stopped before its first step, having changed nothing (lock held, already rolled back...)
FAILED = "failed"  # a step failed before anything on the target changed (a fix that does not compile): no restore
# Stopped by a signal (^C, SIGTERM) before its commit, every file back to its pre-run bytes: nothing to recover.
CANCELED = "canceled"
# Records without a phase (a `lock release`, logs from before phases were kept) say only how they ended.
_BY_STATUS = {"successful": Phase.succeeded.value}


def shown_state(run: Run) -> str:
    """The run's phase (state.json, else its run_end), or `refused`, `failed`, `canceled`.

    A run without a run_end shows the phase it reached: it is still going, or it was cut there."""
    return shown_outcome(run)[0]


def shown_outcome(run: Run) -> tuple[str, bool]:
    """shown_state, and whether the run left the target otherwise than it found it (Ansible's changed)."""
    try:
        record = RunRecord.load(run.dir)
    except (OSError, ValidationError):
        record = None
    end = run.end or {}
    phase = record.state.phase.value if record else str(end.get("phase") or "")
    if not phase:
        status = str(end.get("status") or "")
        state = _BY_STATUS.get(status, status or Phase.interrupted.value)
        return state, state not in (REFUSED, FAILED)
    if phase != Phase.failed_restored.value:
        return phase, phase != Phase.unchanged.value
    history = [t.phase for t in record.state.history] if record else []
    # A chain sent with the lock whose premise did not hold went back to `locked`: it had changed nothing.
    reached = set(history[len(history) - history[::-1].index(Phase.locked):] if Phase.locked in history else history)
    changed = bool(reached & (set(FORWARD) - {Phase.preparing, Phase.locked}))
    if end.get("status") == "canceled":
        return CANCELED, changed
    if not changed:
        # Nothing was changed, so nothing was restored: a step that failed first (a fix that does not compile)
        # failed, as did a run cut before it (its end written by the recover that settled it); a run stopped
        # before its first step was refused.
        started = run.first("step_start") or run.first("judged_here") or end.get("ended_by")
        return (FAILED if started else REFUSED), False
    return phase, True


def shown_state_of(runs_dir: Path, run_id: str, phase: str) -> str:
    """shown_state of a run that just ended (a fleet's host, the end of an apply); `phase`, the one it ended
    in, when its log cannot be read (a full disk)."""
    return shown_outcome_of(runs_dir, run_id, phase)[0]


def shown_outcome_of(runs_dir: Path, run_id: str, phase: str) -> tuple[str, bool]:
    """shown_outcome of a run that just ended; from `phase` alone when its log cannot be read."""
    try:
        return shown_outcome(read_run(runs_dir, run_id))
    except DeployerError:
        return phase, phase != Phase.unchanged.value
