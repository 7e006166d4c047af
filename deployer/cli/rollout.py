"""`deployer rollout resume|abort FLEET_ID`: a fleet run paused by its rollout goes on, or ends rolled back."""

from __future__ import annotations

import sys

import click

from deployer.cli.options import (
    accept_option,
    complete_runs,
    follow_up_options,
    inventory_option,
    json_option,
    lock_wait_option,
    parallel_option,
    revert_check_options,
    runs_dir_option,
)
from deployer.cli.output import emit_json, failures_to_exit_codes
from deployer.cli.running import pin_notice, show_outcome, watcher


@click.group()
def rollout() -> None:
    """Go on with a paused fleet run, or abort it (exit 8 said it paused: see `deployer runs show FLEET_ID`)."""


@rollout.command()
@click.argument("fleet_id", shell_complete=complete_runs)
@lock_wait_option
@parallel_option
@inventory_option
@runs_dir_option
@accept_option
@json_option()
@failures_to_exit_codes
def resume(fleet_id: str, lock_wait_s: float, parallel: int, inventory: str | None, runs_dir: str | None,
           accept_new_host_key: bool, as_json: bool) -> None:
    """Go on with the paused fleet run FLEET_ID (or any unique beginning of its id) from the batch it paused
    before, with the playbook and inventory it was applied with (-i: another inventory). A host its analysis held
    (inconclusive) is approved: its commit stays. A run a signal stopped (Ctrl-C) goes on too, doing again the hosts
    it stopped before their commit. Refused when the playbook or a file it ships changed since the run started, and
    while another resume or abort of the run is going on (exit 3)."""
    from deployer.app.rollouts import ResumeOptions, resume

    show_outcome(resume(ResumeOptions(fleet_id=fleet_id, lock_wait_s=lock_wait_s, parallel=parallel,
                                      inventory=inventory, runs_dir=runs_dir,
                                      accept_new_host_key=accept_new_host_key),
                        listener=pin_notice, watch=watcher(as_json)), as_json)


@rollout.command()
@click.argument("fleet_id", shell_complete=complete_runs)
@click.option("--force", is_flag=True, help="Roll back even if a run's files changed since.")
@click.option("--allow-downtime", is_flag=True, help="Roll back a unit even when no other unit serves behind its "
                                                     "router meanwhile.")
@revert_check_options
@follow_up_options
@json_option()
@failures_to_exit_codes
def abort(fleet_id: str, force: bool, allow_downtime: bool, parallel: int, inventory: str | None,
          runs_dir: str | None, accept_new_host_key: bool, health_timeout_s: float | None, as_json: bool,
          skip_checks: tuple[str, ...], baselines: tuple[str, ...]) -> None:
    """End the paused (or interrupted) fleet run FLEET_ID aborted: every host of it that committed is rolled back
    (a revert commit, restart, checks), as `deployer rollback FLEET_ID` does; the hosts it never reached stay
    untouched. A finished fleet run is rolled back with `deployer rollback FLEET_ID`."""
    from deployer.app.rollouts import AbortOptions, abort
    from deployer.cli.options import baselines_from
    from deployer.ui.console import make_console, say, show_error

    outcome = abort(AbortOptions(fleet_id=fleet_id, force=force, allow_downtime=allow_downtime, parallel=parallel,
                                 inventory=inventory, runs_dir=runs_dir, accept_new_host_key=accept_new_host_key,
                                 health_timeout_s=health_timeout_s, skip_checks=frozenset(skip_checks),
                                 baselines=baselines_from(baselines)),
                    listener=pin_notice, watch=watcher(as_json))
    if as_json:
        emit_json(outcome.document())
    else:
        if outcome.rollback is not None:
            from deployer.ui.fleet import show_fleet

            show_fleet(make_console(), outcome.rollback)
        say(f"fleet run {outcome.run_id}: {outcome.state.error}")
        if outcome.error:
            show_error(outcome.error)
    sys.exit(outcome.exit_code)


COMMANDS = (rollout,)
