"""What a run's log says it left serving: the process it started for each service, on its commit or on its
revert. A later run that finishes its work (recover of a cut run, a rollback again after one that stopped half
way) keeps those where they are still that process and healthy, rather than take them down a second time."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from deployer.runlog import EVENTS, Run, is_run_id, read_run

# Each names the new process a start brought up, in the order a start logs them: its phase `healthy` (what the
# live view shows), then service_healthy, then service_started. A kill may come between any two.
STARTED = ("service_healthy", "service_started")


def logged(runs_dir: Path, run_id: str) -> Run | None:
    """run_id's log, where this machine has it."""
    return read_run(runs_dir, run_id) if (runs_dir / run_id / EVENTS).is_file() else None


def with_its_recovers(runs_dir: Path, run_id: str, but: str | None = None) -> list[Run]:
    """run_id's log and those of the recovers of it since (and of theirs) that this machine has, oldest first, but
    the run `but` (the one asking): a recover stopped before its end left the services it restarted on the cut
    run's commit, and the next one keeps them too."""
    first = logged(runs_dir, run_id)
    if first is None:
        return []
    lineage, ids = [first], {run_id}
    for entry in sorted(runs_dir.iterdir()):
        if entry.name <= run_id or entry.name == but or not is_run_id(entry.name):
            continue
        try:
            with (entry / EVENTS).open("rb") as log:
                start = json.loads(log.readline())
        except (OSError, ValueError):
            continue
        of = start.get("recover_of") if isinstance(start, dict) and start.get("type") == "run_start" else None
        if isinstance(of, str) and of in ids:  # a log is input: a recover_of that is no string names no run
            lineage.append(read_run(runs_dir, entry.name))
            ids.add(entry.name)
    return lineage


def started(runs: Run | Sequence[Run] | None, on_revert: bool) -> dict[str, int]:
    """The process the runs (one run, or a run and its recovers, oldest first) left started for each service on
    the commit, or, on_revert, on the revert (a rollback's steps, which run after the revert commit); nothing
    without a log."""
    return {service: pid for service, (pid, _) in started_by(runs, on_revert).items()}


def started_by(runs: Run | Sequence[Run] | None, on_revert: bool) -> dict[str, tuple[int, str]]:
    """started(), with the run whose log names each process. Its health's answer names it as well as its start's
    record: a run killed between them left only the first (`service_phase` healthy, `service_healthy`, then
    `service_started`). The newest start of a service is the one that can still serve.
    A pid a log also names as started on the commit is never taken as the revert's, nor one any of them stopped as
    started at all (a start that found the old process serving still, a process a later recover restarted: a log
    is input)."""
    logs = [] if runs is None else [runs] if isinstance(runs, Run) else list(runs)
    starts = [(str(e.get("step", "")).split(":")[0] == "rollback", e["service"], e["pid"], run.run_id)
              for run in logs for e in run.events if _names_started(e)
              and isinstance(e.get("service"), str) and isinstance(e.get("pid"), int)]
    stopped = {e.get("pid") for run in logs for e in run.all("service_phase") if e.get("phase") == "stopping"}
    on_commit = {pid for reverting, _, pid, _ in starts if not reverting}
    return {service: (pid, by) for reverting, service, pid, by in starts
            if reverting == on_revert and pid not in stopped and not (on_revert and pid in on_commit)}


def _names_started(event: dict[str, object]) -> bool:
    return event.get("type") in STARTED or (event.get("type") == "service_phase" and event.get("phase") == "healthy")
