"""`apply`: run a playbook's chain (compile, upload, compile there, bound, commit, restart, verify) on one host or
a fleet. One host: its connection opens while the run sets up (a config checked before: before it even loads,
transport/early.py), and a host behind a router runs as its unit of one, out of the router around its restart,
refused when that leaves the router with nothing behind it unless downtime is allowed. Several hosts: a fleet run,
as the playbook's rollout says. A dry run is the plan of the same hosts and units.

Nothing heavy is imported at the top: the early connection opens first, and the rest loads meanwhile."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from deployer.app.outcome import FleetOutcome, RunOutcome
from deployer.app.setting import Setting, build_of, select_hosts, setting_up
from deployer.app.watch import Watch, Watched, watching

if TYPE_CHECKING:
    from deployer.app.plans import PlanOutcome
    from deployer.build import Build
    from deployer.config.models import Inventory, Unit
    from deployer.config.rollout import Rollout
    from deployer.run.engine import Engine
    from deployer.steps.context import Listener
    from deployer.transport.early import KnownGood
    from deployer.transport.factory import Opening


@dataclass(frozen=True, kw_only=True)
class ApplyOptions(Setting):
    """playbook on host (a host, group or unit, a comma list, or a glob: several hosts make a fleet run), narrowed
    to those limit names too. allow_dirty: ship even over uncommitted changes in the target files; restart: a fix
    already applied restarts and checks the services all the same; allow_downtime: restart units even when no
    other unit serves behind their router meanwhile; health_timeout_s: every service's health budget, for this
    run only; parallel: hosts worked on at once (None: the fleet's default); dry_run: the plan instead."""

    playbook: str | Path
    host: str
    limit: str | None = None
    parallel: int | None = None
    allow_dirty: bool = False
    restart: bool = False
    allow_downtime: bool = False
    health_timeout_s: float | None = None
    dry_run: bool = False
    lock_wait_s: float = 0.0  # seconds each host's run waits for a deploy lock another run holds (0: refused at once)


def apply(options: ApplyOptions, *, listener: Listener | None = None,
          watch: Watch | None = None) -> RunOutcome | FleetOutcome | PlanOutcome:
    """Apply as options say (dry_run: the PlanOutcome). A refusal before the run starts (a config error, downtime
    not allowed, an unknown host key) raises its DeployerError; once it started, its outcome says how it went
    (exit 0 also when the fix was applied already: the run ends `unchanged`, changed False)."""
    known = early = None
    try:
        with setting_up():
            if not options.dry_run and not options.accept_new_host_key and os.environ.get("DEPLOYER_EARLY") != "off":
                # A config checked before: its connection opens first.
                from deployer.transport.early import KnownGood

                inventory = str(options.inventory) if options.inventory is not None else None
                known = KnownGood.of(asdict(options), str(options.playbook), inventory)
                early = known.opening() if known is not None else None
            from deployer.config import targets
            build = build_of(options, listener, options.health_timeout_s)
            loaded, hosts = select_hosts(options, options.host, options.limit)
            units = targets.run_units(loaded, hosts)  # a host behind a router among them, as a unit of one
            if not options.dry_run:
                notice_unended(build.runs_dir, hosts, listener)
            engines = build.engines(Path(options.playbook), {name: loaded.hosts[name] for name in hosts},
                                    allow_dirty=options.allow_dirty, restart=options.restart)
            for engine in engines.values():
                engine.lock_wait_s = options.lock_wait_s
        if len(hosts) == 1:  # one host: a plain run, as before fleets existed
            engine = engines[hosts[0]]
            say_steps_not_taken(engine.playbook.model.rollout, hosts[0], listener)
            if options.dry_run:
                from deployer.app.plans import plan_one

                return plan_one(build, engine, units, loaded)
            return apply_one(build, engine, units, loaded, allow_downtime=options.allow_downtime, known=known,
                             early=early, watch=watch)
    finally:
        if early is not None:  # not taken (a config that no longer passes, another host): closed unused
            early.discard()
    if options.dry_run:
        from deployer.app.plans import plan_fleet

        return plan_fleet(build, engines, units, loaded)
    from deployer.fleet.runner import DEFAULT_PARALLEL, FleetCancel

    fleet = build.fleet_apply(engines, units, parallel=options.parallel or DEFAULT_PARALLEL, cancel=FleetCancel(),
                              listeners=[], inventory=loaded, allow_downtime=options.allow_downtime)
    from deployer.app.rollouts import source_of

    fleet.source = source_of(options.playbook, options.inventory, allow_dirty=options.allow_dirty,
                             restart=options.restart, allow_downtime=options.allow_downtime,
                             health_timeout_s=options.health_timeout_s)
    from deployer.config.units import unit_of_hosts
    from deployer.fleet.notify import notifying

    unit_of = unit_of_hosts(units)
    with notifying(loaded.notify, "fleet", fleet.listeners, runs_dir=build.runs_dir, say=build.listeners,
                   units=unit_of), watching(watch, Watched("fleet", hosts, fleet.cancel, fleet.listeners)):
        return FleetOutcome(fleet.run())


def apply_one(build: Build, engine: Engine, units: dict[str, Unit], inventory: Inventory, *, allow_downtime: bool,
              known: KnownGood | None, early: Opening | None, watch: Watch | None) -> RunOutcome:
    """A single-host apply whose connection opens while the rest of the run sets up (checked config first), or
    opened already (early: known's record, taken once the checks pass); a host behind a router (units: its unit of
    one, or its one-host unit) runs as its unit, out of the router around its restart; alone behind it, that is
    downtime, refused unless allow_downtime (as a fleet's batch is)."""
    with setting_up():
        run = engine.apply
        behind = {name: unit for name, unit in units.items() if unit.router is not None}
        if behind:
            from deployer.app.downtime import refuse_lone
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
        from deployer.fleet.notify import notifying

        with notifying(inventory.notify, "host", engine.listeners, runs_dir=build.runs_dir, say=build.listeners), \
                watching(watch, Watched("host", [engine.host_name], engine.cancel, engine.listeners)):
            return RunOutcome(run())
    finally:
        opening.discard()


def say_steps_not_taken(rollout: Rollout, host: str, listener: Listener | None) -> None:
    """A playbook whose rollout pauses, applied to one host: a plain run, which has no batch to pause between (a
    fleet run of one host refuses such steps; a hot-fix of one host with the fleet's playbook is no mistake)."""
    if rollout.pauses() and listener is not None:
        listener({"type": "notice", "message": f"rollout.steps are not taken: {host} alone is a plain run, not a "
                  "fleet run in batches, so it does not pause (an analysis of it that is inconclusive still holds "
                  "its commit for a person, exit 7)"})


def notice_unended(runs_dir: Path, hosts: list[str], listener: Listener | None) -> None:
    """A killed run of this machine on these hosts is named (a notice event) before the next apply there (it left
    no trace on the target to stop it)."""
    from deployer.run.unended import unended_runs

    for host in hosts:
        found = unended_runs(runs_dir, host)
        named = {run.run_id for run, _ in found}
        # A cut recover of a run also named here is ended by that run's recover (it settles its cut recovers): one
        # notice, one command. A log is input: a recover_of that is no string names no run.
        cut_recovers: dict[str, list[str]] = {}
        for run, _ in found:
            if isinstance(of := run.start.get("recover_of"), str) and of in named:
                cut_recovers.setdefault(of, []).append(run.run_id)
        named_by_origin = {run_id for ids in cut_recovers.values() for run_id in ids}
        for run, gone in found:
            run_id = run.run_id
            if listener is None or run_id in named_by_origin:
                continue
            too = f" (which ends its cut recover {', '.join(cut_recovers[run_id])} too)" if run_id in cut_recovers \
                else ""
            listener({"type": "notice", "message": (
                f"run {run_id} on {host} never ended (killed?): its log has no run_end, so `runs verify` "
                f"fails until it is ended with: deployer recover {run_id}{too}" if gone else
                f"run {run_id} on {host} has no run_end, and its record names no process of this boot of "
                "this machine, so whether it still runs (elsewhere) is not known here; once it has stopped, "
                f"end it with: deployer recover {run_id}{too}")})
