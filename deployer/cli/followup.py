"""The commands that act on a recorded run, one host's or a fleet's: rollback, recover."""

from __future__ import annotations

import click

from deployer.cli.options import (
    baselines_from,
    complete_runs,
    follow_up_options,
    host_option,
    json_option,
    revert_check_options,
)
from deployer.cli.output import emit_json, failures_to_exit_codes
from deployer.cli.running import pin_notice, show_outcome, watcher
from deployer.errors import ConfigError


@click.command()
@click.argument("run_id", required=False, shell_complete=complete_runs)
@host_option(help="Host (default: the run's host; required with --list); for a fleet run, the hosts to roll "
                  "back (default: every host that committed).")
@click.option("--list", "list_only", is_flag=True, help="List the deployer commits on the host (from its git log).")
@click.option("--force", is_flag=True, help="Roll back even if the run's files changed since.")
@click.option("--allow-downtime", is_flag=True, help="Roll back a host or unit even when no other unit serves "
                                                     "behind its router meanwhile.")
@revert_check_options
@follow_up_options
@json_option()
@failures_to_exit_codes
def rollback(run_id: str | None, host_name: str | None, list_only: bool, force: bool, parallel: int,
             inventory: str | None, runs_dir: str | None, accept_new_host_key: bool, health_timeout_s: float | None,
             as_json: bool, allow_downtime: bool, skip_checks: tuple[str, ...], baselines: tuple[str, ...]) -> None:
    """Revert RUN_ID's files to before the run by a new commit, restart, and prove the revert.

    RUN_ID may be a fleet run: each of its hosts that committed is rolled back. It may be `last` (the newest run
    that left a commit to roll back, or the newest such on --host: newer runs that left none, such as an unchanged
    or refused apply or a rollback, are passed over and named) or any unique beginning of a run id.

    \b
    What a rollback checks on the reverted build (the old build still has the bug):
      - HEAD and the run's files hold their content from before the run (the revert commit);
      - the playbook's restart: every service's PID changed, health answers, this start's log;
      - the playbook's canary, if it has one;
      - each drain's gauge no worse than the run's baseline before the fix (never the fix's own bound); a drain
        with no recorded baseline is not run, and says so. The storm is never sent to the old build.
    A check that fails leaves the revert standing: the run ends rolled_back with the check named, exit 5.
    --skip-check and --baseline change the checks for this rollback only."""
    from deployer.app.rollbacks import DeploysOptions, RollbackOptions, deploys, rollback

    given = baselines_from(baselines)
    if list_only:
        if not host_name:
            raise ConfigError("--list needs --host")
        listed = deploys(DeploysOptions(host=host_name, inventory=inventory, runs_dir=runs_dir,
                                        accept_new_host_key=accept_new_host_key), listener=pin_notice)
        if as_json:
            emit_json(listed.document())
        else:
            from deployer.ui.console import make_console
            from deployer.ui.report import show_deploys
            show_deploys(make_console(), listed.deploys)
        return
    if not run_id:
        raise ConfigError("give a RUN_ID (see 'deployer runs list' or 'deployer rollback --host H --list')")
    show_outcome(rollback(RollbackOptions(
        run_id=run_id, host=host_name, force=force, allow_downtime=allow_downtime, parallel=parallel,
        inventory=inventory, runs_dir=runs_dir, accept_new_host_key=accept_new_host_key,
        health_timeout_s=health_timeout_s, skip_checks=frozenset(skip_checks), baselines=given),
        listener=pin_notice, watch=watcher(as_json)), as_json)


@click.command()
@click.argument("run_id", required=False, shell_complete=complete_runs)
@host_option(help="Host (default: the run's host); alone, recovers the run its intent record names.")
@click.option("--rollback", "roll_back", is_flag=True, help="If the run's commit exists, revert it, restart, and "
                                                            "prove the revert as `deployer rollback` does.")
@revert_check_options
@follow_up_options
@json_option()
@failures_to_exit_codes
def recover(run_id: str | None, host_name: str | None, roll_back: bool, parallel: int, inventory: str | None,
            runs_dir: str | None, accept_new_host_key: bool, health_timeout_s: float | None, as_json: bool,
            skip_checks: tuple[str, ...], baselines: tuple[str, ...]) -> None:
    """End a cut run (killed, disconnected, disk full) in a consistent state; safe to run twice.

    RUN_ID may be a fleet run: each of its sub-runs that was cut is recovered. It may be `last` (the newest cut run,
    on --host if given) or any unique beginning of a run id; a whole id not in the runs dir is recovered from
    --host's intent record."""
    from deployer.app.recovery import NothingToRecover, RecoveredRun, RecoverOptions, recover
    from deployer.ui.console import say

    outcome = recover(RecoverOptions(
        run_id=run_id, host=host_name, rollback=roll_back, parallel=parallel, inventory=inventory,
        runs_dir=runs_dir, accept_new_host_key=accept_new_host_key, health_timeout_s=health_timeout_s,
        skip_checks=frozenset(skip_checks), baselines=baselines_from(baselines)),
        listener=pin_notice, watch=watcher(as_json))
    if isinstance(outcome, NothingToRecover):  # as `recover RUN` of a settled run says: exit 0
        emit_json(outcome.document()) if as_json else click.echo(outcome.message)
        return
    if isinstance(outcome, RecoveredRun) and not as_json and outcome.exit_code == 0:
        say(outcome.found.summary())
    show_outcome(outcome, as_json)


COMMANDS = (rollback, recover)
