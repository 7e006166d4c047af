"""`deployer runs`: the recorded runs, listed, shown and verified."""

from __future__ import annotations

import sys

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
from deployer.cli.running import pin_notice


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
    from deployer.app.runs import HistoryOptions, history
    from deployer.ui.console import make_console, say
    from deployer.ui.fleet import show_fleets
    from deployer.ui.report import show_runs

    found = history(HistoryOptions(runs_dir=runs_dir, host=host_name, states=states, last=last, refused=refused))
    if as_json:
        emit_json(found.document())
    elif not found.runs and not found.fleets:  # an empty header would not say where it looked
        say(f"no runs in {found.runs_dir}{' match the filters' if host_name or states else ''}")
    else:
        console = make_console()
        show_runs(console, found.runs, found.cut)
        if found.fleets:
            console.print()
            show_fleets(console, found.fleets)


@runs.command("show")
@click.argument("run_id", shell_complete=complete_runs)
@host_option(help="With `last`: the newest run on this host (a fleet run's sub-run there).")
@runs_dir_option
@inventory_option
@json_option("Print the raw events.")
@failures_to_exit_codes
def runs_show(run_id: str, host_name: str | None, runs_dir: str | None, inventory: str | None,
              as_json: bool) -> None:
    """Show one run: steps, outcome, commits, links, and its metric samples as a chart (a fleet run: its hosts).
    A run into a pod reads the pod now (kubectl get pod, where the inventory's host runs kubectl) and says whether
    the run's files are still there.

    RUN_ID: `last` (the newest run; with --host, the newest on that host), or any unique beginning of a run id."""
    from deployer.app.runs import recorded
    from deployer.ui.console import make_console
    from deployer.ui.fleet import show_fleet
    from deployer.ui.report import show_run

    shown = recorded(run_id, runs_dir, inventory, target=not as_json, host=host_name)
    if as_json:
        emit_json(shown.document())
    elif shown.fleet is not None:
        show_fleet(make_console(), shown.fleet)
    elif shown.run is not None:
        show_run(make_console(), shown.run, shown.target)


@runs.command("verify")
@click.argument("run_id", shell_complete=complete_runs)
@host_option(help="With `last`: the newest run on this host (a fleet run's sub-run there).")
@runs_dir_option
@click.option("--target", "on_target", is_flag=True,
              help="Also compare the log with the run's commits on its host (Deployer-Log trailers, end note, "
                   "seal), and say what the target vouched for.")
@inventory_option
@json_option()
@failures_to_exit_codes
def runs_verify(run_id: str, host_name: str | None, runs_dir: str | None, on_target: bool, inventory: str | None,
                as_json: bool) -> None:
    """Check the run log's hash chain and its artifacts (every sub-run of a fleet run); exit 5 when altered.

    RUN_ID: `last` (the newest run; with --host, the newest on that host), or any unique beginning of a run id."""
    from deployer.app.runs import VerifyOptions, verify
    from deployer.ui.console import say, show_error

    found = verify(VerifyOptions(run_id=run_id, on_target=on_target, inventory=inventory, runs_dir=runs_dir,
                                 host=host_name), listener=pin_notice)
    if as_json:
        emit_json(found.document())
    if found.exit_code:
        if not as_json:
            for problem in found.errors:
                show_error(problem)
        sys.exit(found.exit_code)
    if not as_json:
        say(f"run {found.run_id}: log verifies (its hash chain and artifacts"
            f"{'' if on_target else '; --target also checks it against the target history'})")
        for host, checked in (found.vouched or {}).items():
            say(f"on {host}, the target vouches for it:")
            for line in checked:
                say(f"  {line}")


COMMANDS = (runs,)
