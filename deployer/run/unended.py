"""Runs of this machine that never ended: killed before they could write their run_end.

A run killed before it took the target's lock leaves nothing on the target, so the next apply there would
succeed and never mention it; only its log here, which `runs verify` then fails for good, says it was cut.
The next apply names it, from a look at the newest run dirs alone: no target, no reading of old history."""

from __future__ import annotations

from pathlib import Path

from deployer.errors import DeployerError
from deployer.runlog import EVENTS, is_run_id, read_run

NEWEST = 20  # run dirs looked at: a killed run is worth a notice on the next applies, not forever


def unended_runs(runs_dir: Path, host: str, newest: int = NEWEST) -> list[str]:
    """The ids of the newest runs on `host` whose log has neither a run_end nor a recovered_by line."""
    if not runs_dir.is_dir():
        return []
    names = sorted(p.name for p in runs_dir.iterdir() if is_run_id(p.name) and (p / EVENTS).is_file())
    found = []
    for name in names[-newest:]:
        try:
            run = read_run(runs_dir, name)
        except DeployerError:
            continue  # a log that cannot be read is `runs verify`'s to report
        if run.start.get("host") == host and run.end is None and run.first("recovered_by") is None:
            found.append(name)
    return found
