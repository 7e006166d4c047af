"""`rollback`: revert a run's files to before it by a new commit, restart, and prove the revert; a fleet run's
hosts each (those that committed, or those named). A host behind a router leaves it around its restart, and
alone behind it that is downtime, refused unless allowed. Also the deploys a host's git history names."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from deployer.app.downtime import refuse_lone, routed_part
from deployer.app.outcome import FleetOutcome, RunOutcome
from deployer.app.setting import RevertSetting, Setting, build_of, inventory_of
from deployer.app.watch import Watch, Watched, watching
from deployer.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from deployer.build import Build
    from deployer.config.notify import Notify
    from deployer.run.engine import Engine
    from deployer.run.rollback import Deploy
    from deployer.steps.context import Listener

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RollbackOptions(RevertSetting):
    """run_id: the run or fleet run to undo: `last` (the newest that left a commit to roll back, on host if
    given), or any unique beginning of an id. host: the host (default: the run's); of a fleet run, the hosts to
    roll back (a name, group, list or glob; default: each that committed). force: even over files changed since
    the run. allow_downtime: even when no other unit serves behind the router meanwhile."""

    run_id: str
    host: str | None = None
    force: bool = False
    allow_downtime: bool = False
    parallel: int | None = None  # hosts of a fleet run rolled back at once (None: the fleet's default)


def rollback(options: RollbackOptions, *, listener: Listener | None = None,
             watch: Watch | None = None) -> RunOutcome | FleetOutcome:
    """Roll back as options say. A refusal before the rollback starts (no such run, downtime, a config error)
    raises its DeployerError; once it started, its outcome says how it went (a failed check: exit 5)."""
    from deployer import runlog
    from deployer.fleet.record import is_fleet

    build = build_of(options, listener, options.health_timeout_s, options.revert_checks())
    run_id = undone(build.runs_dir, options.run_id, options.host, listener)
    if is_fleet(build.runs_dir, run_id):
        return rollback_fleet(build, options, run_id, listener, watch)
    run = runlog.read_run(build.runs_dir, run_id)
    engine = build.for_run(run, options.host)
    loaded = inventory_of(options, engine.host_name)  # only that host's selector listed
    routed = routed_part(loaded, engine.host_name)
    if routed is not None:  # a host behind a router, or its part of a unit: out of the router around the restart
        from deployer.fleet.unit import alone

        name, unit = routed
        refuse_lone(engine.host_name, {name: unit}, loaded, options.allow_downtime)  # alone behind it: downtime
        return RunOutcome(watched_run(build, engine, loaded.notify, watch, partial(
            alone, name, unit, engine, build.routers(loaded), rollback_of=run, force=options.force)))
    from deployer.run import rollback as rollbacks

    return RunOutcome(watched_run(build, engine, loaded.notify, watch,
                                  lambda: rollbacks.rollback(engine, run, force=options.force)))


def rollback_fleet(build: Build, options: RollbackOptions, fleet_id: str, listener: Listener | None,
                   watch: Watch | None) -> FleetOutcome:
    from deployer.config import targets
    from deployer.config.units import every_unit, unit_of_hosts
    from deployer.fleet import followup
    from deployer.fleet.record import FleetRecord, claimed
    from deployer.fleet.runner import DEFAULT_PARALLEL, FleetCancel

    loaded = inventory_of(options)
    chosen = targets.resolve(loaded, options.host) if options.host else None
    from deployer.fleet.notify import notifying

    cancel = FleetCancel()
    listeners: list[Listener] = [listener] if listener is not None else []
    units = every_unit(loaded.units, loaded.hosts)
    unit_of = unit_of_hosts(units)
    # Under the fleet run's claim: a resume going on meanwhile would roll the fix out further while this rolls it
    # back, and each would write its own view of fleet.json.
    with claimed(build.runs_dir, fleet_id, "deployer rollback"):
        state = FleetRecord.load(build.runs_dir, fleet_id).state
        if state.pause is not None:  # rolled back, it would stay resumable: a resume would ship the fix again
            raise ConfigError(f"fleet run {fleet_id} is paused: end it with `deployer rollout abort {fleet_id}`, "
                              "which rolls back every host that committed and ends it aborted (no resume after)")
        hosts = chosen or list(state.hosts)
        with notifying(loaded.notify, "fleet", listeners, runs_dir=build.runs_dir, say=build.listeners,
                       units=unit_of), watching(watch, Watched("fleet", hosts, cancel, listeners)):
            return FleetOutcome(followup.rollback_fleet(
                build.runs_dir, fleet_id, build.sub_run, hosts=chosen, force=options.force,
                parallel=options.parallel or DEFAULT_PARALLEL, listeners=listeners, cancel=cancel,
                units=units, routers=build.routers(loaded), allow_downtime=options.allow_downtime))


def watched_run(build: Build, engine: Engine, notify: Notify | None, watch: Watch | None, run: Callable[[], T]) -> T:
    """A single host's rollback or recover: watched, and heard by the inventory's webhooks as an apply is."""
    from deployer.fleet.notify import notifying

    with notifying(notify, "host", engine.listeners, runs_dir=build.runs_dir, say=build.listeners), \
            watching(watch, Watched("host", [engine.host_name], engine.cancel, engine.listeners)):
        return run()


def undone(runs_dir: Path, given: str, host: str | None, listener: Listener | None) -> str:
    """The run a rollback (or its plan) undoes; `last` says, as a notice event, which newer runs it passed over,
    that left no commit."""
    from deployer.app.runs import to_undo

    chosen, skipped = to_undo(runs_dir, given, host)
    if skipped and listener is not None:
        listener({"type": "notice", "message": f"last: run {chosen}, the newest that left a commit to roll back; "
                                               f"passed over {', '.join(skipped)}"})
    return chosen


@dataclass(frozen=True, kw_only=True)
class DeploysOptions(Setting):
    """The host whose git history is read (no runs dir needed: the commits carry their run ids)."""

    host: str


@dataclass(frozen=True)
class DeploysOutcome:
    """The deployer commits on a host, newest first, as its git log names them."""

    host: str
    deploys: list[Deploy]
    exit_code: int = 0

    def document(self) -> dict[str, Any]:
        return {"host": self.host, "deploys": [vars(d) for d in self.deploys], "exit_code": 0, "error": None}


def deploys(options: DeploysOptions, *, listener: Listener | None = None) -> DeploysOutcome:
    from deployer.run import rollback as rollbacks

    host, transport = build_of(options, listener).connection(options.host)
    with transport:
        return DeploysOutcome(options.host, rollbacks.list_deploys(transport, host.repo))
