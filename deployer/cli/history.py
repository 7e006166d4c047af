"""`deployer runs`: the recorded runs, listed, shown and verified."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from deployer.cli.options import (
    complete_runs,
    complete_states,
    host_option,
    inventory_option,
    json_option,
    runs_dir_option,
)
from deployer.cli.output import emit_json, failures_to_exit_codes
from deployer.cli.running import builder

if TYPE_CHECKING:
    from pathlib import Path


@click.group()
def runs() -> None:
    """Inspect run logs."""


@runs.command("list")
@host_option(help="Only the runs on this host, and the fleet runs that include it.")
@click.option("--state", "states", multiple=True, metavar="STATE", shell_complete=complete_states,
              help="Only the runs in this state (repeatable), and the fleet runs with a host in it.")
@click.option("--last", type=click.IntRange(1), metavar="N", help="Only the N newest runs (and fleet runs).")
@click.option("--all", "refused", is_flag=True, help="Also the refused runs (the lock held, an unknown host key: "
                                                    "stopped before their first step, having changed nothing).")
@runs_dir_option
@json_option()
@failures_to_exit_codes
def runs_list(host_name: str | None, states: tuple[str, ...], last: int | None, refused: bool, runs_dir: str | None,
              as_json: bool) -> None:
    """List recorded runs, oldest first (the runs dir: see --runs-dir), each with every commit it made; refused
    runs only with --all (or --state refused)."""
    from deployer import runlog
    from deployer.app.runs import listed
    from deployer.fleet.record import list_fleets
    from deployer.run.shown import shown_state
    from deployer.ui.console import make_console, say
    from deployer.ui.fleet import show_fleets
    from deployer.ui.report import show_runs

    root = runlog.runs_dir_from(runs_dir)
    found, fleets = listed(runlog.list_runs(root), list_fleets(root), host_name, states, last, refused=refused)
    if as_json:
        emit_json({"runs_dir": str(root),
                   "runs": [{"run_id": r.run_id, "state": shown_state(r), "status": r.status,
                             "host": r.start.get("host"), "kind": r.start.get("kind", "apply"),
                             "playbook": r.start.get("playbook_name"), "fleet": r.start.get("fleet"),
                             "git": r.git, "commits": r.commits} for r in found],
                   "fleets": [f.document() for f in fleets]})
    elif not found and not fleets:  # an empty header would not say where it looked
        say(f"no runs in {root}{' match the filters' if host_name or states else ''}")
    else:
        console = make_console()
        show_runs(console, found)
        if fleets:
            console.print()
            show_fleets(console, fleets)


@runs.command("show")
@click.argument("run_id", shell_complete=complete_runs)
@runs_dir_option
@json_option("Print the raw events.")
@failures_to_exit_codes
def runs_show(run_id: str, runs_dir: str | None, as_json: bool) -> None:
    """Show one run: steps, outcome, commits, links, and its metric samples as a chart (a fleet run: its hosts).

    RUN_ID: `last` (the newest run), or any unique beginning of a run id."""
    from deployer import runlog
    from deployer.app.runs import resolve
    from deployer.fleet.record import FleetRecord, is_fleet
    from deployer.ui.console import make_console
    from deployer.ui.fleet import show_fleet
    from deployer.ui.report import show_run

    root = runlog.runs_dir_from(runs_dir)
    run_id = resolve(root, run_id)
    if is_fleet(root, run_id):
        state = FleetRecord.load(root, run_id).state
        emit_json(state.document()) if as_json else show_fleet(make_console(), state)
        return
    run = runlog.read_run(root, run_id)
    if as_json:
        emit_json(run.events)
    else:
        show_run(make_console(), run)


@runs.command("verify")
@click.argument("run_id", shell_complete=complete_runs)
@runs_dir_option
@click.option("--target", "on_target", is_flag=True,
              help="Also compare the log with the run's commits on its host (Deployer-Log trailers, end note, "
                   "seal), and say what the target vouched for.")
@inventory_option
@json_option()
@failures_to_exit_codes
def runs_verify(run_id: str, runs_dir: str | None, on_target: bool, inventory: str | None, as_json: bool) -> None:
    """Check the run log's hash chain and its artifacts (every sub-run of a fleet run); exit 5 when altered.

    RUN_ID: `last` (the newest run), or any unique beginning of a run id."""
    from deployer import runlog
    from deployer.app.runs import resolve
    from deployer.fleet.followup import verify_fleet
    from deployer.fleet.record import is_fleet
    from deployer.ui.console import say, show_error

    root = runlog.runs_dir_from(runs_dir)
    vouched: dict[str, list[str]] = {}  # host -> what its target vouched for

    def verify_one(runs_path: Path, one: str) -> list[str]:
        found = runlog.verify(runs_path, one)
        if on_target:
            from deployer.run import rollback as rollbacks
            run = runlog.read_run(runs_path, one)
            checked = vouched.setdefault(str(run.start.get("host")), [])
            found += rollbacks.verify_on_target(builder(inventory, runs_dir, False).for_run(run), run, checked)
        return found

    unreachable: dict[str, str] = {}
    run_id = resolve(root, run_id)
    if is_fleet(root, run_id):
        per_host, unreachable = verify_fleet(root, run_id, verify_one)
        problems = [f"{host}: {problem}" for host, found in per_host.items() for problem in found]
    else:
        problems = verify_one(root, run_id)
    # A tampered log (5) outweighs a host whose history could not be read (4, as for a single run).
    exit_code = 5 if problems else 4 if unreachable else 0
    errors = problems + [f"{host}: not verified against the target: {why}" for host, why in unreachable.items()]
    if as_json:
        emit_json({"run_id": run_id, "problems": problems, "unreachable": unreachable, "exit_code": exit_code,
                   "error": "; ".join(errors) or None, **({"on_target": vouched} if on_target else {})})
    if exit_code:
        if not as_json:
            for problem in errors:
                show_error(problem)
        sys.exit(exit_code)
    if not as_json:
        say(f"run {run_id}: log verifies (its hash chain and artifacts"
            f"{'' if on_target else '; --target also checks it against the target history'})")
        for host, checked in vouched.items():
            say(f"on {host}, the target vouches for it:")
            for line in checked:
                say(f"  {line}")


COMMANDS = (runs,)
