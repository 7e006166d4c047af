"""`plan`: a dry run of a playbook (or of a run's rollback) on each host it names, changing nothing: its diffs,
the projected diff --stat and each step's actions as data, each service's last time to healthy, and the routers
a restart would leave with nothing behind them (downtime). Failed when a projected change breaks the playbook's
bounds or does not compile here, so a CI job can gate on it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deployer.app.downtime import fleet_downtime, lone_downtime, routed_part
from deployer.app.setting import Setting, build_of, inventory_of, select_hosts
from deployer.errors import ConfigError

if TYPE_CHECKING:
    from deployer.build import Build
    from deployer.config.models import Inventory, Unit
    from deployer.fleet.apply import Downtime, RolloutPlan
    from deployer.run.engine import Engine
    from deployer.run.plan import PlanReport
    from deployer.steps.context import Listener
    from deployer.steps.services.budgets import Timing


@dataclass(frozen=True, kw_only=True)
class PlanOptions(Setting):
    """playbook on host (a host, group, unit, comma list or glob: every host's plan), or the rollback of the run
    rollback_of (`last`, or any unique beginning of a run id; host: another host than the run's)."""

    playbook: str | Path | None = None
    host: str | None = None
    rollback_of: str | None = None


@dataclass(frozen=True)
class HostPlan:
    """One host's plan (report.actions: every action exactly, as data), and its services' last times to
    healthy."""

    report: PlanReport
    timings: list[Timing]

    def document(self) -> dict[str, Any]:
        return {**self.report.document(), "time_to_healthy": [one.document() for one in self.timings]}


@dataclass(frozen=True)
class PlanOutcome:
    """Every host's plan, in the order named, and the downtime the run would cause. alone: one host's plan (its
    document is that host's, not a list of hosts)."""

    plans: list[HostPlan]
    downtime: list[Downtime]
    alone: bool
    rollout: RolloutPlan | None = None  # a fleet's: its batches and the capacity each leaves serving

    @property
    def failed(self) -> list[str]:
        """What breaks the bounds or does not compile, each problem (over several hosts: `HOST: problem`)."""
        return [problem if self.alone else f"{plan.report.host_name}: {problem}"
                for plan in self.plans for problem in plan.report.failed_here]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    @property
    def error(self) -> str | None:
        return "; ".join(self.failed) or None

    def document(self) -> dict[str, Any]:
        judged = {"downtime": [one.document() for one in self.downtime], "exit_code": self.exit_code,
                  "error": self.error}
        if self.alone:
            return {**self.plans[0].document(), **judged}
        rollout = {} if self.rollout is None else {"rollout": self.rollout.document()}
        return {"hosts": [plan.document() for plan in self.plans], **rollout, **judged}


def plan(options: PlanOptions, *, listener: Listener | None = None) -> PlanOutcome:
    """The plan options ask for; a config or a run that cannot be planned raises its DeployerError."""
    from deployer.config.units import every_unit

    build = build_of(options, listener)
    if options.rollback_of:  # its host alone behind its router: downtime, as `rollback` refuses it
        return rollback_plan(build, options, options.rollback_of, listener)
    if not options.playbook or not options.host:
        raise ConfigError("plan needs PLAYBOOK and --host (or --rollback RUN_ID)")
    loaded, hosts = select_hosts(options, options.host)
    engines = build.engines(Path(options.playbook), {name: loaded.hosts[name] for name in hosts})
    if len(hosts) == 1:
        alone = {n: u for n, u in every_unit(loaded.units, loaded.hosts).items() if u.hosts() == hosts}
        return plan_one(build, engines[hosts[0]], alone, loaded)
    from deployer.config import targets

    return plan_fleet(build, engines, targets.run_units(loaded, hosts), loaded)


def rollback_plan(build: Build, options: PlanOptions, given: str, listener: Listener | None) -> PlanOutcome:
    from deployer import runlog
    from deployer.app.rollbacks import undone
    from deployer.run import rollback as rollbacks

    run = runlog.read_run(build.runs_dir, undone(build.runs_dir, given, options.host, listener))
    engine = build.for_run(run, options.host)
    loaded = inventory_of(options, engine.host_name)  # only that host's selector listed
    routed = routed_part(loaded, engine.host_name)
    report = rollbacks.plan(engine, run)
    return PlanOutcome([HostPlan(report, timings_of(build, engine))],
                       lone_downtime(build, engine, dict([routed] if routed else []), loaded, command="rollback"),
                       alone=True)


def plan_one(build: Build, engine: Engine, units: dict[str, Unit], inventory: Inventory) -> PlanOutcome:
    """One host's plan; units: its unit, if it is one alone (or the run's, for an apply's dry run)."""
    report = engine.plan()
    return PlanOutcome([HostPlan(report, timings_of(build, engine))], lone_downtime(build, engine, units, inventory),
                       alone=True)


def plan_fleet(build: Build, engines: dict[str, Engine], units: dict[str, Unit], inventory: Inventory) -> PlanOutcome:
    """A fleet's plan: every host's, and the routers a batch leaves with no unit behind it."""
    from deployer.fleet.apply import for_units, planned_rollout

    downtime = fleet_downtime(build, engines, units, inventory)
    rollout = planned_rollout(list(engines), units, next(iter(engines.values())).playbook.model.rollout)
    for_units(engines, units)
    plans = [HostPlan(engine.plan(), timings_of(build, engine)) for engine in engines.values()]
    reports = {one.report.host_name: one.report for one in plans}
    for name, unit in units.items():  # a unit that changes restarts as one: its hosts that hold the fix too
        if not all(reports[host].already_applied for host in unit.hosts()):
            for host in unit.hosts():
                reports[host].restarts_with = name if reports[host].already_applied else None
    return PlanOutcome(plans, downtime, alone=False, rollout=rollout)


def timings_of(build: Build, engine: Engine) -> list[Timing]:
    """The last time to healthy of each of the engine's services, from this machine's runs."""
    from deployer.steps.services.budgets import last_times

    return last_times(build.runs_dir, engine.host_name, engine.host)
