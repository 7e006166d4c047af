"""Runs of this machine that never ended: killed before they could write their run_end.

A run killed before it took the target's lock leaves nothing on the target, so the next apply there would
succeed and never mention it; only its log here, which `runs verify` then fails for good, says it was cut.
The next apply names it, from a look at the newest run dirs alone: no target, no reading of old history. A run
whose process on this machine still runs (its record names it: runowner.py) is not named: it is going, not cut."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from deployer.errors import DeployerError
from deployer.runlog import EVENTS, Run, is_run_id, read_run
from deployer.runowner import Owner
from deployer.runstate import RunRecord

NEWEST = 20  # run dirs looked at: a killed run is worth a notice on the next applies, not forever


def unended_runs(runs_dir: Path, host: str | None, newest: int = NEWEST) -> list[tuple[Run, bool]]:
    """The newest runs on `host` (None: on any) whose log has neither a run_end nor a recovered_by line, and whose
    process does not run here now: each run, and whether its process is known to be gone (else this machine cannot
    judge it)."""
    if not runs_dir.is_dir():
        return []
    names = sorted(p.name for p in runs_dir.iterdir() if is_run_id(p.name) and (p / EVENTS).is_file())
    found = []
    for name in names[-newest:]:
        try:
            run = read_run(runs_dir, name)
        except DeployerError:
            continue  # a log that cannot be read is `runs verify`'s to report
        if host is not None and run.start.get("host") != host:
            continue
        gone = cut(run)
        if gone is not False:
            found.append((run, gone is True))
    return found


def cut(run: Run) -> bool | None:
    """Whether the run was cut: its log has neither a run_end nor a recovered_by line and its process no longer
    runs here (True); False: it ended, or it still runs; None: it never ended and this machine cannot tell
    whether its process runs (its record names none)."""
    if run.end is not None or run.first("recovered_by") is not None:
        return False
    _, alive = recorded_owner(run.dir)
    return None if alive is None else not alive


def recorded_owner(run_dir: Path) -> tuple[Owner | None, bool | None]:
    """The process of this machine that run_dir's record names, and whether it still runs (None: no record, none
    named, or of a boot or machine this one cannot judge)."""
    try:
        record = RunRecord.load(run_dir)
    except (OSError, ValidationError):
        record = None
    owner = record.state.owner if record is not None else None
    return owner, owner.alive() if owner is not None else None
