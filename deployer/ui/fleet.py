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
        rows.append((name, str(run.batch + 1), run.state, run.run_id or "-", str(run.git_after or "-")[:12],
                     "-" if run.elapsed_s is None else f"{run.elapsed_s:.1f}s", rolled, error))
    columns(console, ("host", "batch", "state", "run", "commit", "time", "rollback", "error"), rows)
    style = "green" if state.status == "successful" else "red"
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


def restarted_with_unit(state: FleetState, host: str) -> bool:
    """An unchanged host whose unit changed elsewhere in this run: the unit restarted as one, this host too."""
    return any(state.hosts[other].changed for hosts in state.units.values() if host in hosts for other in hosts)


def show_fleets(console: Console, fleets: list[FleetState]) -> None:
    rows = [(f.fleet_id, f.status, f.kind + (f" of {f.of_fleet}" if f.of_fleet else ""), f.playbook,
             " ".join(f"{h}:{r.state}{'/rolled-back' if r.rollback_status == 'successful' else ''}"
                      for h, r in f.hosts.items())) for f in fleets]
    columns(console, ("fleet run", "status", "kind", "playbook", "hosts"), rows)
