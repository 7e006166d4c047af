"""The commands that work on targets: plan, apply, check, rollback, recover."""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import click

from deployer.app.downtime import fleet_downtime, lone_downtime, refuse_lone, routed_part
from deployer.app.setting import setting_up
from deployer.cli.options import (
    accept_option,
    complete_runs,
    health_timeout_option,
    host_option,
    inventory_option,
    json_option,
    limit_option,
    parallel_option,
    runs_dir_option,
)
from deployer.cli.output import emit_json, failures_to_exit_codes
from deployer.cli.running import builder, pin_notice, run_fleet, run_with_view

if TYPE_CHECKING:
    from collections.abc import Sequence

    from deployer.build import Build
    from deployer.config.models import Inventory, Unit
    from deployer.fleet.apply import Downtime
    from deployer.run.engine import Engine
    from deployer.run.plan import PlanReport
    from deployer.steps.services.budgets import Timing
    from deployer.transport.early import KnownGood
    from deployer.transport.factory import Opening


verbose_option = click.option("--verbose", "-v", is_flag=True, help="With a dry run: every action exactly, as "
                              "apply does it and its run log records it (the full command lines), not a line per "
                              "thing a step does.")


def select_hosts(host_spec: str, limit: str | None, inventory: str | None) -> tuple[Inventory, list[str]]:
    """The inventory and the hosts --host (a host, group, unit, comma list or glob) and --limit name."""
    from deployer.config import targets
    from deployer.config.models import load_inventory
    from deployer.config.paths import find_inventory

    loaded = load_inventory(find_inventory(inventory))
    return loaded, targets.resolve(loaded, host_spec, limit=limit)


def timings_of(build: Build, engine: Engine) -> list[Timing]:
    """The last time to healthy of each of the engine's services, from this machine's runs."""
    from deployer.steps.services.budgets import last_times

    return last_times(build.runs_dir, engine.host_name, engine.host)


def show_plan(report: PlanReport, as_json: bool, timings: list[Timing], downtime: Sequence[Downtime] = (),
              verbose: bool = False) -> None:
    """The plan (and the router its restart leaves with nothing behind it); exit 1 when the projected change breaks
    the playbook's bounds or does not compile here, so a CI job can gate on it."""
    from deployer.ui.console import make_console
    from deployer.ui.plan import show_plan as render
    failed = "; ".join(report.failed_here) or None
    if as_json:
        emit_json({**report.document(), "time_to_healthy": [t.document() for t in timings],
                   "downtime": [one.document() for one in downtime], "exit_code": 1 if failed else 0, "error": failed})
    else:
        console = make_console()
        render(console, report, timings, verbose=verbose)
        for down in downtime:
            console.print(down.describe(), markup=False, highlight=False)
    if failed:
        sys.exit(1)


def show_plans(build: Build, engines: dict[str, Engine], units: dict[str, Unit], inventory: Inventory,
               as_json: bool, verbose: bool = False) -> None:
    """A fleet's plan (`plan`, `apply --dry-run`): every host's, and the routers a batch leaves with no unit behind
    it; exit 1 when any host's projected change breaks the bounds or does not compile."""
    from deployer.fleet.apply import for_units
    from deployer.ui.console import make_console
    from deployer.ui.plan import show_plan as render
    downtime = fleet_downtime(build, engines, units, inventory)
    for_units(engines, units)
    reports = [(engine.plan(), timings_of(build, engine)) for engine in engines.values()]
    failed = [f"{r.host_name}: {problem}" for r, _ in reports for problem in r.failed_here]
    if as_json:
        emit_json({"hosts": [{**r.document(), "time_to_healthy": [one.document() for one in t]} for r, t in reports],
                   "downtime": [one.document() for one in downtime], "exit_code": 1 if failed else 0,
                   "error": "; ".join(failed) or None})
    else:
        console = make_console()
        for one, timings in reports:
            render(console, one, timings, verbose=verbose)
        for down in downtime:
            console.print(down.describe(), markup=False, highlight=False)
    if failed:
        sys.exit(1)


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
    from deployer import runlog
    from deployer.config import targets
    from deployer.config.models import load_inventory
    from deployer.config.paths import find_inventory
    from deployer.config.units import every_unit
    from deployer.errors import ConfigError
    from deployer.run import rollback as rollbacks

    build = builder(inventory, runs_dir, accept_new_host_key)
    if rollback_of:  # its host alone behind its router: downtime, as `rollback` refuses it
        run = runlog.read_run(build.runs_dir, undone(build.runs_dir, rollback_of, host_name))
        engine = build.for_run(run, host_name)
        loaded = load_inventory(find_inventory(inventory))
        routed = routed_part(loaded, engine.host_name)
        show_plan(rollbacks.plan(engine, run), as_json, timings_of(build, engine),
                  lone_downtime(build, engine, dict([routed] if routed else []), loaded, command="rollback"), verbose)
        return
    if not playbook or not host_name:
        raise ConfigError("plan needs PLAYBOOK and --host (or --rollback RUN_ID)")
    loaded, hosts = select_hosts(host_name, None, inventory)
    engines = build.engines(Path(playbook), {name: loaded.hosts[name] for name in hosts})
    if len(hosts) == 1:
        engine = engines[hosts[0]]
        alone = {n: u for n, u in every_unit(loaded.units, loaded.hosts).items() if u.hosts() == hosts}
        show_plan(engine.plan(), as_json, timings_of(build, engine), lone_downtime(build, engine, alone, loaded),
                  verbose)
        return
    show_plans(build, engines, targets.run_units(loaded, hosts), loaded, as_json, verbose)


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
@verbose_option
@json_option()
@failures_to_exit_codes
def apply(playbook: str, host_name: str, limit: str | None, parallel: int, inventory: str | None,
          runs_dir: str | None, accept_new_host_key: bool, allow_dirty: bool, restart: bool, dry_run: bool,
          allow_downtime: bool, health_timeout_s: float | None, verbose: bool, as_json: bool) -> None:
    """Run the chain: compile, upload, compile there, bound, commit, restart, verify.

    A fix already applied (every file holds its bytes at HEAD) changes nothing: the run ends `unchanged`, exit 0,
    and restarts nothing unless --restart."""
    known = early = None
    try:
        with setting_up():
            if not dry_run and not accept_new_host_key and os.environ.get("DEPLOYER_EARLY") != "off":
                # A config checked before: its connection opens first.
                from deployer.transport.early import KnownGood

                known = KnownGood.of(click.get_current_context().params, playbook, inventory)
                early = known.opening() if known is not None else None
            from deployer.config import targets
            build = builder(inventory, runs_dir, accept_new_host_key, health_timeout_s)
            loaded, hosts = select_hosts(host_name, limit, inventory)
            units = targets.run_units(loaded, hosts)  # a host behind a router among them, as a unit of one
            if not dry_run:
                notice_unended(build.runs_dir, hosts)
            engines = build.engines(Path(playbook), {name: loaded.hosts[name] for name in hosts},
                                    allow_dirty=allow_dirty, restart=restart)
        if len(hosts) == 1:  # one host: a plain run, as before fleets existed
            engine = engines[hosts[0]]
            if dry_run:
                show_plan(engine.plan(), as_json, timings_of(build, engine),
                          lone_downtime(build, engine, units, loaded), verbose)
            else:
                apply_one(build, engine, as_json, units, loaded, allow_downtime=allow_downtime, known=known,
                          early=early)
            return
    finally:
        if early is not None:  # not taken (a config that no longer passes, another host): closed unused
            early.discard()
    from deployer.fleet.runner import FleetCancel

    if dry_run:
        show_plans(build, engines, units, loaded, as_json, verbose)
        return
    fleet = build.fleet_apply(engines, units, parallel=parallel, cancel=FleetCancel(), listeners=[], inventory=loaded,
                              allow_downtime=allow_downtime)
    run_fleet(hosts, fleet.cancel, as_json, fleet.listeners, fleet.run)


def apply_one(build: Build, engine: Engine, as_json: bool, units: dict[str, Unit] | None = None,
              inventory: Inventory | None = None, *, allow_downtime: bool = False, known: KnownGood | None = None,
              early: Opening | None = None) -> None:
    """A single-host apply whose connection opens while the rest of the run sets up (checked config first), or
    opened already (early: known's record, taken once the checks pass); a host behind a router (units: its unit of
    one, or its one-host unit) runs as its unit, out of the router around its restart; alone behind it, that is
    downtime, refused unless allow_downtime (as a fleet's batch is)."""
    with setting_up():
        run = engine.apply
        behind = {name: unit for name, unit in (units or {}).items() if unit.router is not None}
        if behind and inventory is not None:
            from deployer.fleet.apply import for_units
            from deployer.fleet.unit import alone

            refuse_lone(engine.host_name, behind, inventory, allow_downtime)
            for_units({engine.host_name: engine}, behind)
            ((name, unit),) = behind.items()
            run = partial(alone, name, unit, engine, build.routers(inventory))
        engine.check_host()  # a config problem stops the run before anything connects (or runs, early)
        engine.host.secrets()  # so does a secret that does not resolve (its env var unset)
        if known is not None:  # every check passed: the next apply with this key connects before it loads
            known.record(engine.host_name, engine.host)
        opening = build.opening(engine, early)  # imports the transport's module (paramiko) here
    try:
        run_with_view(engine, as_json, run)
    finally:
        opening.discard()


def undone(runs_dir: Path, run_id: str, host_name: str | None) -> str:
    """The run a rollback's plan undoes; `last` says which newer runs it passed over, that left no commit."""
    from deployer.app.rollbacks import undone as chosen

    return chosen(runs_dir, run_id, host_name, pin_notice)


def notice_unended(runs_dir: Path, hosts: list[str]) -> None:
    """A killed run of this machine on these hosts is named before the next apply there (it left no trace on
    the target to stop it)."""
    from deployer.run.unended import unended_runs
    from deployer.ui.console import show_notice

    for host in hosts:
        for run_id, gone in unended_runs(runs_dir, host):
            show_notice(f"run {run_id} on {host} never ended (killed?): its log has no run_end, so `runs verify` "
                        f"fails until it is ended with: deployer recover {run_id}" if gone else
                        f"run {run_id} on {host} has no run_end, and its record names no process of this boot of "
                        "this machine, so whether it still runs (elsewhere) is not known here; once it has stopped, "
                        f"end it with: deployer recover {run_id}")


@click.command()
@click.argument("playbook", type=click.Path(dir_okay=False), required=False)
@host_option(required=True, help="A host, group or unit, a comma list, or a glob (gpu-*): one row per host.")
@parallel_option
@inventory_option
@runs_dir_option
@accept_option
@json_option()
@failures_to_exit_codes
def check(playbook: str | None, host_name: str, parallel: int, inventory: str | None, runs_dir: str | None,
          accept_new_host_key: bool, as_json: bool) -> None:
    """Can I deploy here now? Read-only on the target: host key, auth, python, repo, lock, services, metrics,
    and each service's last time to healthy (from the runs dir) against its health budget.

    --accept-new-host-key pins an unknown key into the local known_hosts (said in a notice).

    Exits 0 when all is well, otherwise with the exit code of the first problem (over several hosts: of
    the first host, in selection order, that has one)."""
    from deployer import runlog
    from deployer.check import check_hosts
    from deployer.config import targets
    from deployer.steps.playbook import load_playbook
    from deployer.ui.check import show_check, show_check_group
    from deployer.ui.console import make_console

    loaded, hosts = select_hosts(host_name, None, inventory)
    steps = load_playbook(Path(playbook)) if playbook else None
    build = builder(inventory, None, accept_new_host_key)
    for step in steps[1] if steps else []:  # a canary `via:` names a router of this inventory
        step.reach_routers(lambda: build.routers(loaded))
    group = check_hosts({name: loaded.hosts[name] for name in hosts}, steps,
                        connect=build.connector,
                        units={name: loaded.units[name] for name in targets.units_of(loaded, hosts)},
                        listeners=[pin_notice], parallel=parallel, runs_dir=runlog.runs_dir_from(runs_dir))
    if len(hosts) == 1:  # one host: its own report, as before groups existed
        (result,) = group.reports
        emit_json(result.as_json()) if as_json else show_check(make_console(), result)
    elif as_json:
        emit_json(group.as_json())
    else:
        show_check_group(make_console(), group)
    sys.exit(group.exit_code)


COMMANDS = (plan, apply, check)
