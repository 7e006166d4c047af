"""The commands that run a playbook: plan, apply (and its dry run)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from deployer.cli.options import (
    accept_option,
    complete_runs,
    health_timeout_option,
    host_option,
    inventory_option,
    json_option,
    limit_option,
    lock_wait_option,
    parallel_option,
    runs_dir_option,
)
from deployer.cli.output import emit_json, failures_to_exit_codes
from deployer.cli.running import pin_notice, show_outcome, watcher

if TYPE_CHECKING:
    from deployer.app.plans import PlanOutcome


verbose_option = click.option("--verbose", "-v", is_flag=True, help="With a dry run: every action exactly, as "
                              "apply does it and its run log records it (the full command lines), not a line per "
                              "thing a step does.")


@click.command()
@click.argument("playbook", type=click.Path(dir_okay=False), required=False)
@host_option()
@click.option("--rollback", "rollback_of", metavar="RUN_ID", help="Preview the rollback of a run instead (`last`: "
              "the newest run that left a commit to roll back, on --host if given; or any unique beginning of a run "
              "id).", shell_complete=complete_runs)
@inventory_option
@runs_dir_option
@accept_option
@verbose_option
@json_option(help="Print one machine-readable JSON object (also on failure): every action exactly, and each step's "
                  "brief lines.")
@failures_to_exit_codes
def plan(playbook: str | None, host_name: str | None, rollback_of: str | None, inventory: str | None,
         runs_dir: str | None, accept_new_host_key: bool, verbose: bool, as_json: bool) -> None:
    """Dry run: diffs, the projected diff --stat and each step's actions (every host of a group); changes nothing.

    Each step shows a line per thing it does (what runs where, what is sent, what is waited for), every change to
    the target among them; --verbose shows every action exactly, as apply does it and its run log records it.
    Exits 1 when the projected change breaks the playbook's diff_bounds."""
    from deployer.app.plans import PlanOptions, plan

    show_plan(plan(PlanOptions(playbook=playbook, host=host_name, rollback_of=rollback_of, inventory=inventory,
                               runs_dir=runs_dir, accept_new_host_key=accept_new_host_key), listener=pin_notice),
              as_json, verbose)


@click.command()
@click.argument("playbook", type=click.Path(dir_okay=False))
@host_option(required=True, help="A host, group or unit, a comma list, or a glob (gpu-*); several hosts make "
                                 "a fleet run.")
@limit_option
@parallel_option
@inventory_option
@runs_dir_option
@accept_option
@click.option("--allow-dirty", is_flag=True, help="Ship even over uncommitted changes in the target files.")
@click.option("--restart", is_flag=True, help="When the fix is already applied (every file holds its bytes at "
                                              "HEAD), restart and check the services all the same; the run still "
                                              "ends `unchanged`.")
@click.option("--dry-run", is_flag=True, help="Same as `deployer plan` (with --verbose: every action exactly).")
@click.option("--allow-downtime", is_flag=True, help="Restart units even when no other unit serves behind their "
                                                     "router meanwhile.")
@health_timeout_option
@lock_wait_option
@verbose_option
@json_option()
@failures_to_exit_codes
def apply(playbook: str, host_name: str, limit: str | None, parallel: int, inventory: str | None,
          runs_dir: str | None, accept_new_host_key: bool, allow_dirty: bool, restart: bool, dry_run: bool,
          allow_downtime: bool, health_timeout_s: float | None, lock_wait_s: float, verbose: bool,
          as_json: bool) -> None:
    """Run the chain: compile, upload, compile there, bound, commit, restart, verify.

    A fix already applied (every file holds its bytes at HEAD) changes nothing: the run ends `unchanged`, exit 0,
    and restarts nothing unless --restart."""
    from deployer.app.applies import ApplyOptions, apply
    from deployer.app.plans import PlanOutcome

    outcome = apply(ApplyOptions(playbook=playbook, host=host_name, limit=limit, parallel=parallel,
                                 inventory=inventory, runs_dir=runs_dir, accept_new_host_key=accept_new_host_key,
                                 allow_dirty=allow_dirty, restart=restart, allow_downtime=allow_downtime,
                                 health_timeout_s=health_timeout_s, dry_run=dry_run, lock_wait_s=lock_wait_s),
                    listener=pin_notice, watch=watcher(as_json))
    if isinstance(outcome, PlanOutcome):
        show_plan(outcome, as_json, verbose)
        return
    show_outcome(outcome, as_json)


def show_plan(outcome: PlanOutcome, as_json: bool, verbose: bool) -> None:
    """Every host's plan, and the routers its run leaves with nothing behind them; exit 1 when a projected change
    breaks the playbook's bounds or does not compile here, so a CI job can gate on it."""
    from deployer.ui.console import make_console
    from deployer.ui.plan import show_plan as render
    from deployer.ui.plan import show_rollout

    if as_json:
        emit_json(outcome.document())
    else:
        console = make_console()
        for one in outcome.plans:
            render(console, one.report, one.timings, verbose=verbose)
        if outcome.rollout is not None:
            show_rollout(console, outcome.rollout)
        for down in outcome.downtime:
            console.print(down.describe(), markup=False, highlight=False)
    if outcome.exit_code:
        sys.exit(outcome.exit_code)


COMMANDS = (plan, apply)
