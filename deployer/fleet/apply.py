"""`deployer apply` over several hosts: one Engine (one sub-run, lock, state, log) per host, spread over them
by the playbook's rollout strategy. With `on_failure: rollback_fleet`, a fleet run that fails rolls back every
host of it that committed (restarted and verified again) through the single-host rollback.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployer.config.models import Unit
from deployer.config.rollout import Rollout
from deployer.config.routers import Router
from deployer.errors import ConfigError
from deployer.fleet.followup import roll_back_hosts
from deployer.fleet.record import UNTOUCHED, FleetRecord, FleetState, claimed, new_state
from deployer.fleet.router import Routers
from deployer.fleet.runner import DEFAULT_PARALLEL, FleetCancel, FleetRunner, finish, tagged
from deployer.fleet.strategies import (
    BatchPlan,
    Serving,
    Strategy,
    batch_plans,
    downtime,
    mixed_pairing,
    no_unit_serves,
    refuse_downtime,
    strategy_for,
)
from deployer.fleet.unit import UnitRun, steps_for
from deployer.run.engine import Engine, RunResult
from deployer.runlog import utc_now
from deployer.steps.base import Effect
from deployer.steps.context import Listener, LoadedPlaybook
from deployer.transport.base import Transport


@dataclass
class FleetApply:
    """`deployer apply` over several hosts."""

    engines: dict[str, Engine]  # host -> its engine, in selection order
    runs_dir: Path
    rollout: Rollout
    on_failure: str
    parallel: int = DEFAULT_PARALLEL
    cancel: FleetCancel = field(default_factory=FleetCancel)
    listeners: list[Listener] = field(default_factory=list)
    units: dict[str, Unit] = field(default_factory=dict)  # every unit a host of the run belongs to (whole)
    routers: dict[str, Router] = field(default_factory=dict)  # the inventory's
    behind: dict[str, list[str]] = field(default_factory=dict)  # router -> every inventory unit behind it
    connect: Callable[[str], Transport] | None = None  # to a router's host outside the unit
    allow_downtime: bool = False  # a batch may take every unit behind a router out of it
    source: dict[str, Any] = field(default_factory=dict)  # what `rollout resume` rebuilds the run from (record.py)

    def run(self) -> FleetState:
        members = {name: sorted(unit.hosts()) for name, unit in self.units.items()}
        self._ready()
        hosts = list(self.engines)
        first = next(iter(self.engines.values()))
        strategy = strategy_for(self.rollout, serving_of(self.units))
        batches = strategy.batches(hosts, members)
        refuse_downtime(batches, members, self.behind, self.allow_downtime)
        state = new_state("apply", first.playbook.model.name, first.operator, hosts, batches, self.parallel,
                          units=members, source={**self.source, "shipped": shipped(first.playbook)})
        record = FleetRecord.create(self.runs_dir, state)
        runner = self._runner(record, strategy)
        runner.emit("fleet_start", hosts=hosts, batches=state.batches, kind="apply")
        # Held while the run goes: its timed pause is recorded as it waits, and no resume may take it meanwhile.
        with claimed(self.runs_dir, state.fleet_id, "deployer apply"):
            return self._drive(record, runner, 0)

    def resume(self, record: FleetRecord) -> FleetState:
        """`deployer rollout resume`: the paused run goes on from the batch it paused before, in the batches it
        recorded; a host an inconclusive analysis held is approved (its commit kept, no longer a failure)."""
        state, pause = record.state, record.state.pause
        if pause is None:
            raise ConfigError(f"fleet run {state.fleet_id} is not paused (it is {state.status})")
        self._ready()
        now = utc_now()
        approved = state.held()
        for host in approved:
            state.hosts[host].approved = now
        pause.ended, pause.ended_by = now, "resume"
        state.status, state.exit_code, state.error = "running", None, None
        record.save()
        runner = self._runner(record, strategy_for(self.rollout, serving_of(self.units)))
        runner.emit("fleet_resumed", batch=pause.before_batch, reason=pause.reason, approved=approved,
                    hosts=list(state.hosts), batches=state.batches)
        return self._drive(record, runner, pause.before_batch)

    def _ready(self) -> None:
        for_units(self.engines, self.units)
        for engine in self.engines.values():  # every host's config is sound before any host connects
            engine.check_host()

    def _runner(self, record: FleetRecord, strategy: Strategy) -> FleetRunner:
        for engine in self.engines.values():
            engine.cancel = self.cancel.child()
            tagged(engine, record.state.fleet_id, self.listeners)
        return FleetRunner(record, strategy, self.parallel, self.cancel, self.listeners)

    def _drive(self, record: FleetRecord, runner: FleetRunner, start: int) -> FleetState:
        """The batches from `start`, then (unless paused) on_failure's fleet rollback, the end and its event."""
        state = record.state
        # One connection to each router's host for the whole run, its rollback included, closed however it ends.
        with Routers(self.routers, self.connect).sharing() as routers:
            runner.run(lambda host, _: self.engines[host].apply(), functools.partial(self._unit, routers),
                       start=start)
            if state.pause is None and self.on_failure == "rollback_fleet" and any(
                    r.status != "successful" and not r.approved for r in state.hosts.values()
                    if r.status != UNTOUCHED):
                roll_back_hosts(record, runner, self.engines, self.units, force=False, routers=routers)
        finish(record, self.cancel)
        runner.emit("fleet_end", status=state.status, exit_code=state.exit_code)
        return state

    def _unit(self, routers: Routers, name: str, fleet_id: str, report: Callable[[str, RunResult], None]) -> None:
        unit = self.units[name]
        routing = routers.for_unit(name, unit, self.engines)
        UnitRun(name, unit, {h: self.engines[h] for h in unit.hosts()}, self.on_failure, routing=routing).run(report)

@dataclass(frozen=True)
class Downtime:
    """A router that one batch leaves with no unit behind it: how long, from its units' last times to healthy."""

    router: str
    units: list[str]
    expected_s: float | None  # None: some service of them has no recorded time to healthy yet
    command: str = "apply"  # what needs --allow-downtime for it (a rollback's plan: "rollback")

    def document(self) -> dict[str, object]:
        return {"router": self.router, "units": self.units, "expected_s": self.expected_s}

    @property
    def what(self) -> str:
        return no_unit_serves(self.router, self.units)

    def describe(self) -> str:
        how_long = f"about {self.expected_s:g}s" if self.expected_s is not None else "for an unknown time"
        return f"{self.what}: downtime, {how_long} ({self.command} needs --allow-downtime)"


def planned_downtime(engines: dict[str, Engine], units: dict[str, Unit], rollout: Rollout,
                     behind: dict[str, list[str]], runs_dir: Path) -> list[Downtime]:
    """`plan`'s view of the downtime `apply` refuses: each such router, and the time its units took to be healthy
    the last time (a unit's services start one after the other, so their times add up)."""
    from deployer.steps.services.budgets import last_times

    members = {name: sorted(unit.hosts()) for name, unit in units.items()}
    found = []
    batches = strategy_for(rollout, serving_of(units)).batches(list(engines), members)
    for router, names in downtime(batches, members, behind).items():
        times = {(host, t.service): t.seconds for name in names for host in members[name]
                 for t in last_times(runs_dir, host, engines[host].host)}
        needed = [(host, service) for name in names for host, service in units[name].members()]
        seconds = sum(times[m] for m in needed) if all(m in times for m in needed) else None
        found.append(Downtime(router, names, None if seconds is None else round(seconds, 3)))
    return found


@dataclass(frozen=True)
class RolloutPlan:
    """`plan`'s view of how a fleet run spreads: its batches, what each leaves serving behind its routers, the
    routers that may pair a patched worker with an unpatched one meanwhile, and its pauses (batch index -> seconds,
    None: until a person resumes)."""

    batches: list[BatchPlan]
    pairing: list[str]
    pauses: dict[int, float | None] = field(default_factory=dict)

    def document(self) -> dict[str, object]:
        return {"batches": [batch.document() for batch in self.batches], "pairing": self.pairing,
                "pauses": [{"before_batch": n, "duration_s": d} for n, d in self.pauses.items()]}

    def pause_before(self, number: int) -> str | None:
        """The pause before batch `number` (from 0) in plan's words."""
        if number not in self.pauses:
            return None
        seconds = self.pauses[number]
        return "pause until resumed (deployer rollout resume FLEET_ID)" if seconds is None else \
            f"pause {seconds:g}s"


def planned_rollout(hosts: list[str], units: dict[str, Unit], rollout: Rollout) -> RolloutPlan:
    members = {name: sorted(unit.hosts()) for name, unit in units.items()}
    serving = serving_of(units)
    plans = batch_plans(strategy_for(rollout, serving).batches(hosts, members), members, serving)
    pauses = {n: pause.duration for n, pause in rollout.pauses().items() if 0 < n < len(plans)}
    return RolloutPlan(plans, mixed_pairing(plans, serving), pauses)


def shipped(playbook: LoadedPlaybook) -> dict[str, str]:
    """Each file the playbook ships (a files: src, or its patch) -> the sha256 of the bytes the run ships: a resume
    compares them, since the playbook's own bytes do not change when a file it names does."""
    base = playbook.path.parent
    named = {str((base / spec.src).resolve()): playbook.sources[spec.dest] for spec in playbook.model.files}
    if playbook.model.patch is not None and playbook.patch is not None:
        named[str((base / playbook.model.patch).resolve())] = playbook.patch
    return {path: hashlib.sha256(data).hexdigest() for path, data in named.items()}


def serving_of(units: dict[str, Unit]) -> dict[str, Serving]:
    return {name: Serving.of(unit) for name, unit in units.items()}


def for_units(engines: dict[str, Engine], units: dict[str, Unit]) -> None:
    """Each unit host's engine keeps the steps it runs itself: the unit's checks only on its metrics host."""
    for name, unit in units.items():
        for host in unit.hosts():
            engine = engines[host]
            if not any(s.effect == Effect.commits for s in engine.steps):
                raise ConfigError(f"unit {name}: the playbook has no commit step; a unit restarts after its "
                                  "hosts' commits")
            engine.steps = steps_for(engine.steps, name, unit, host)
