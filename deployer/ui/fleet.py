"""A fleet run's report: one row per host, and the fleets list."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console

from deployer.ui.console import columns

if TYPE_CHECKING:  # the fleet modules are not loaded by a single-host run
    from deployer.fleet.record import FleetState


def show_fleet(console: Console, state: FleetState) -> None:
    """The per-host table at the end of a fleet run."""
    rows = []
    for name, run in state.hosts.items():
        rolled = f"{run.rollback_status} {run.rollback_run_id or ''}".strip() if run.rollback_status else "-"
        error = (run.error or "").splitlines()[0] if run.error else ""
        rows.append((name, str(run.batch + 1), state.shown(name), run.run_id or "-",
                     str(run.git_after or "-")[:12],
                     "-" if run.elapsed_s is None else f"{run.elapsed_s:.1f}s", rolled, error))
    columns(console, ("host", "batch", "state", "run", "commit", "time", "rollback", "error"), rows)
    style = {"successful": "green", "paused": "yellow"}.get(state.status, "red")
    console.print(f"fleet run {state.fleet_id} ({state.kind}): [{style}]{state.status}[/{style}] "
                  f"(exit {state.exit_code})")
    unchanged = [name for name, run in state.hosts.items() if run.state == "unchanged"]
    with_unit = [name for name in unchanged if restarted_with_unit(state, name)]
    for hosts, how in ((with_unit, "; restarted with its unit"), ([n for n in unchanged if n not in with_unit], "")):
        if hosts:  # exit 0 as the hosts the fix reached, but nothing was changed there
            console.print(f"unchanged: {', '.join(hosts)} (already applied{how})", markup=False, highlight=False)
    untouched = state.untouched()
    if untouched:
        console.print(f"never touched: {', '.join(untouched)}", markup=False, highlight=False)
    if state.rolled_back_by:
        console.print(f"rolled back by fleet run {', '.join(state.rolled_back_by)}", markup=False)
    for line in pause_lines(state):
        console.print(line, markup=False, highlight=False)


def pause_lines(state: FleetState) -> list[str]:
    """A rollout's pauses as a person reads them later (`runs show`): each ended one and how; the open one with why,
    since when, what comes next and the two commands that end it (exit 8 alone says none of that)."""
    lines = []
    for pause in state.pauses:
        where = before(state, pause.before_batch)
        if pause.ended is None:
            lines.append(f"paused {where} since {pause.since}: {pause.reason}")
            if held := state.held():
                lines.append(f"held for approval: {', '.join(held)} (resume approves them)")
            lines.append(f"go on with: deployer rollout resume {state.fleet_id}")
            lines.append(f"or roll back every host that committed: deployer rollout abort {state.fleet_id}")
        else:
            how = {"resume": "resumed", "abort": "aborted", "timer": "its time up, went on"}.get(
                str(pause.ended_by), str(pause.ended_by))
            lines.append(f"paused {where} from {pause.since}: {pause.reason}; {how} at {pause.ended}")
    if state.status == "aborted" and state.error:  # which rollback undid it, or that nothing had committed
        lines.append(state.error)
    return lines


def before(state: FleetState, number: int) -> str:
    """Where a pause stands: before batch N (counted from 1, as the table) and its hosts, or after the last."""
    if number >= len(state.batches):
        return "after its last batch"
    return f"before batch {number + 1} ({', '.join(state.batches[number])})"


def restarted_with_unit(state: FleetState, host: str) -> bool:
    """An unchanged host whose unit changed elsewhere in this run: the unit restarted as one, this host too."""
    return any(state.hosts[other].changed for hosts in state.units.values() if host in hosts for other in hosts)


def show_fleets(console: Console, fleets: list[FleetState]) -> None:
    rows = [(f.fleet_id, f.status, f.kind + (f" of {f.of_fleet}" if f.of_fleet else ""), f.playbook,
             " ".join(f"{h}:{f.shown(h)}{'/rolled-back' if r.rollback_status == 'successful' else ''}"
                      for h, r in f.hosts.items())) for f in fleets]
    columns(console, ("fleet run", "status", "kind", "playbook", "hosts"), rows)
    for fleet in fleets:  # a paused run waits for a person: what for, and the commands, under the table
        if (pause := fleet.pause) is not None:
            console.print(f"{fleet.fleet_id} paused {before(fleet, pause.before_batch)} since {pause.since}: "
                          f"{pause.reason}; deployer rollout resume {fleet.fleet_id} | deployer rollout abort "
                          f"{fleet.fleet_id}", markup=False, highlight=False, soft_wrap=True)
