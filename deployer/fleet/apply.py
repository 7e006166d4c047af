"""`deployer apply` over several hosts: one Engine (one sub-run, lock, state, log) per host, spread over them
by the playbook's rollout strategy. With `on_failure: rollback_fleet`, a fleet run that fails rolls back every
host of it that committed (restarted and verified again) through the single-host rollback.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from deployer.config.models import Rollout, Unit
from deployer.errors import ConfigError
from deployer.fleet.followup import roll_back_hosts
from deployer.fleet.record import UNTOUCHED, FleetRecord, FleetState, new_state
from deployer.fleet.runner import DEFAULT_PARALLEL, FleetCancel, FleetRunner, finish, tagged
from deployer.fleet.strategies import strategy_for
from deployer.fleet.unit import UnitRun, steps_for
from deployer.run.engine import Engine, RunResult
from deployer.steps.base import Effect
from deployer.steps.context import Listener


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

    def run(self) -> FleetState:
        members = {name: sorted(unit.hosts()) for name, unit in self.units.items()}
        for_units(self.engines, self.units)
        for engine in self.engines.values():  # every host's config is sound before any host connects
            engine.check_host()
        hosts = list(self.engines)
        first = next(iter(self.engines.values()))
        strategy = strategy_for(self.rollout)
        state = new_state("apply", first.playbook.model.name, first.operator, hosts,
                          strategy.batches(hosts, members), self.parallel, units=members)
        record = FleetRecord.create(self.runs_dir, state)
        for engine in self.engines.values():
            engine.cancel = self.cancel.child()
            tagged(engine, state.fleet_id, self.listeners)
        runner = FleetRunner(record, strategy, self.parallel, self.cancel, self.listeners)
        runner.emit("fleet_start", hosts=hosts, batches=state.batches, kind="apply")
        runner.run(lambda host, _: self.engines[host].apply(), self._unit)
        if self.on_failure == "rollback_fleet" and any(r.status != "successful" for r in state.hosts.values()
                                                       if r.status != UNTOUCHED):
            roll_back_hosts(record, runner, self.engines, self.units, force=False)
        finish(record, self.cancel)
        runner.emit("fleet_end", status=state.status, exit_code=state.exit_code)
        return state

    def _unit(self, name: str, fleet_id: str, report: Callable[[str, RunResult], None]) -> None:
        unit = self.units[name]
        UnitRun(name, unit, {h: self.engines[h] for h in unit.hosts()}, self.on_failure).run(report)


def for_units(engines: dict[str, Engine], units: dict[str, Unit]) -> None:
    """Each unit host's engine keeps the steps it runs itself: the unit's checks only on its metrics host."""
    for name, unit in units.items():
        for host in unit.hosts():
            engine = engines[host]
            if not any(s.effect == Effect.commits for s in engine.steps):
                raise ConfigError(f"unit {name}: the playbook has no commit step; a unit restarts after its "
                                  "hosts' commits")
            engine.steps = steps_for(engine.steps, name, unit, host)
