"""What a run's log says it left serving: the process it started for each service, on its commit or on its
revert. A later run that finishes its work (recover of a cut run, a rollback again after one that stopped half
way) keeps those where they are still that process and healthy, rather than take them down a second time."""

from __future__ import annotations

from pathlib import Path

from deployer.runlog import EVENTS, Run, read_run

# Each names the new process a start brought up, in the order a start logs them: its phase `healthy` (what the
# live view shows), then service_healthy, then service_started. A kill may come between any two.
STARTED = ("service_healthy", "service_started")


def logged(runs_dir: Path, run_id: str) -> Run | None:
    """run_id's log, where this machine has it."""
    return read_run(runs_dir, run_id) if (runs_dir / run_id / EVENTS).is_file() else None


def started(run: Run | None, on_revert: bool) -> dict[str, int]:
    """The process run started for each service on its commit, or, on_revert, on its revert (its rollback's steps,
    which run after the revert commit); nothing without its log. Its health's answer names it as well as its
    start's record: a run killed between them left only the first (`service_phase` healthy, `service_healthy`,
    then `service_started`).
    A pid its log also names as started on the commit is never taken as the revert's, nor one it stopped as
    started at all (a start that found the old process serving still: a log is input)."""
    if run is None:
        return {}
    starts = [(str(e.get("step", "")).split(":")[0] == "rollback", e["service"], e["pid"])
              for e in run.events if _names_started(e)
              and isinstance(e.get("service"), str) and isinstance(e.get("pid"), int)]
    stopped = {e.get("pid") for e in run.all("service_phase") if e.get("phase") == "stopping"}
    on_commit = {pid for reverting, _, pid in starts if not reverting}
    return {service: pid for reverting, service, pid in starts
            if reverting == on_revert and pid not in stopped and not (on_revert and pid in on_commit)}


def _names_started(event: dict[str, object]) -> bool:
    return event.get("type") in STARTED or (event.get("type") == "service_phase" and event.get("phase") == "healthy")
