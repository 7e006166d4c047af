"""The recorded runs as a person names and picks them: a run or a fleet run by `last` or by any unique beginning
of its id, wherever a command takes a run id, and the runs that `runs list` shows."""

from __future__ import annotations

from typing import TYPE_CHECKING

from deployer.errors import ConfigError
from deployer.fleet.record import FLEET, FleetRecord
from deployer.run.shown import FAILED, REFUSED, shown_state
from deployer.runlog import EVENTS, read_run
from deployer.runstate import Phase

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from deployer.fleet.record import FleetState
    from deployer.runlog import Run

LAST = "last"
STATES = (*(phase.value for phase in Phase), FAILED, REFUSED)
NAMED = 10  # the ids an ambiguous beginning names: enough to pick from, never a screenful


class UnknownRun(ConfigError):
    """No run of the runs dir has that id, or an id that begins so."""


def run_ids(runs_dir: Path) -> list[str]:
    """Every run and fleet run of the runs dir, oldest first (ids sort in start order)."""
    if not runs_dir.is_dir():
        return []
    return sorted(p.name for p in runs_dir.iterdir() if (p / EVENTS).is_file() or (p / FLEET).is_file())


def resolve(runs_dir: Path, given: str, host: str | None = None) -> str:
    """The whole id of the run that `given` names: `last` (see newest), an id, or the beginning of exactly one."""
    if given == LAST:
        return newest(runs_dir, host)
    ids = run_ids(runs_dir)
    found = [given] if given in ids else [run_id for run_id in ids if run_id.startswith(given)]
    if not found:
        raise UnknownRun(f"no run {given!r} in {runs_dir} (see 'deployer runs list')")
    if len(found) > 1:
        older = f" and {len(found) - NAMED} older" if len(found) > NAMED else ""
        raise ConfigError(f"run id {given!r} is ambiguous: {len(found)} runs in {runs_dir} begin so, "
                          f"{', '.join(found[-NAMED:])}{older}; give more of the id")
    return found[0]


def to_undo(runs_dir: Path, given: str, host: str | None = None) -> tuple[str, list[str]]:
    """resolve() for a rollback: `last` is the newest run that left a commit to roll back (last_to_undo), with the
    newer runs it passed over."""
    return last_to_undo(runs_dir, host) if given == LAST else (resolve(runs_dir, given, host), [])


def newest(runs_dir: Path, host: str | None = None) -> str:
    """The newest run on host; without a host, the newest run or fleet run started by a command of its own (a
    fleet's sub-runs, which start after it, are the fleet's)."""
    for run_id, _ in _newest_first(runs_dir, host):
        return run_id
    on = f" on {host}" if host is not None else ""
    raise ConfigError(f"no run{on} in {runs_dir} (see 'deployer runs list')")


def last_to_undo(runs_dir: Path, host: str | None = None) -> tuple[str, list[str]]:
    """What `rollback last` rolls back: the newest apply (run or fleet run, as newest() picks them) whose commit
    still stands, and the newer runs it passed over, each as `ID (state)`: a rollback of the newest run whatever
    it was would most often be refused (an unchanged or refused run made no commit) or undo an undo."""
    skipped: list[str] = []
    for run_id, run in _newest_first(runs_dir, host):
        if isinstance(run, FleetRecord):
            fleet = run.state
            if fleet.kind == "apply" and not fleet.rolled_back_by and any(
                    one.committed and one.rollback_status != "successful" for one in fleet.hosts.values()):
                return run_id, skipped
            skipped.append(f"{run_id} (fleet {fleet.kind}, {fleet.status})")
            continue
        state = shown_state(run)
        if run.start.get("kind", "apply") == "apply" and run.git.get("after") and state != Phase.rolled_back.value \
                and not any(link.get("status") == "successful" for link in run.all("rolled_back_by")):
            return run_id, skipped
        skipped.append(f"{run_id} ({run.start.get('kind', 'apply')}, {state})")
    on = f" on {host}" if host is not None else ""
    raise ConfigError(f"no run{on} in {runs_dir} left a commit to roll back (see 'deployer runs list')")


def _newest_first(runs_dir: Path, host: str | None) -> Iterator[tuple[str, Run | FleetRecord]]:
    """Runs on host, newest first; without a host, every run and fleet run started by a command of its own."""
    for run_id in reversed(run_ids(runs_dir)):
        if (runs_dir / run_id / FLEET).is_file():
            if host is None:
                yield run_id, FleetRecord.load(runs_dir, run_id)
            continue
        run = read_run(runs_dir, run_id)
        if run.start.get("host") == host if host is not None else not run.start.get("fleet"):
            yield run_id, run


def listed(runs: list[Run], fleets: list[FleetState], host: str | None, states: tuple[str, ...],
           last: int | None, *, refused: bool = False) -> tuple[list[Run], list[FleetState]]:
    """What `runs list` shows of these: the runs on host in one of states, and the fleet runs with such a host
    (each only if given); of each, the last newest. Refusals (the lock held, an unknown host key) changed
    nothing and are no part of the history: only with `refused` (--all), or asked for by their state."""
    unknown = sorted(set(states) - set(STATES))
    if unknown:
        raise ConfigError(f"--state {', '.join(unknown)}: no run has that state; the states are {', '.join(STATES)}")

    def chosen(on: str | None, state: str) -> bool:
        return (host is None or on == host) and (state in states if states else refused or state != REFUSED)

    kept = [run for run in runs if chosen(run.start.get("host"), shown_state(run))]
    kept_fleets = [fleet for fleet in fleets if (host is None and not states)
                   or any(chosen(name, one.state) for name, one in fleet.hosts.items())]
    return (kept[-last:], kept_fleets[-last:]) if last else (kept, kept_fleets)
