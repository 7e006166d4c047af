"""The one place engines, transports and fleets are made from a config.

The CLI's commands and the demo both make theirs here, so a new transport kind or a new engine field is
wired once, and every engine of a command gets the same runs dir, listeners and host-key choice."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from deployer.command import Masker
from deployer.config.models import Host, get_host, load_inventory
from deployer.config.paths import find_inventory
from deployer.errors import ConfigError
from deployer.run.engine import Connector, Engine
from deployer.run.revert_checks import RevertChecks
from deployer.runstate import RunRecord
from deployer.steps.cancel import CancelToken
from deployer.steps.context import EventBus, Listener, LoadedPlaybook
from deployer.steps.optional import reach_routers
from deployer.steps.playbook import load_playbook, parse_playbook
from deployer.transport.factory import Opening, open_transport

if TYPE_CHECKING:  # a single-host run never loads the fleet modules
    from deployer.config.models import Inventory, Unit
    from deployer.fleet.apply import FleetApply
    from deployer.fleet.router import Routers
    from deployer.fleet.runner import FleetCancel
    from deployer.runlog import Run
    from deployer.steps.base import Step
    from deployer.transport.base import Transport


@dataclass(frozen=True)
class Build:
    """What every engine and connection of one command is made with."""

    runs_dir: Path
    inventory: str | None = None  # the inventory file asked for; find_inventory picks the default
    accept_new_host_key: bool = False
    listeners: tuple[Listener, ...] = ()  # on every engine's events, and on a bare connection's
    health_timeout_s: float | None = None  # every service's health budget for this command (--health-timeout)
    revert_checks: RevertChecks | None = None  # a rollback's checks as the command gives them (--skip-check ...)

    def host(self, name: str) -> Host:
        path = find_inventory(self.inventory)
        inventory = load_inventory(path)
        if name not in inventory.hosts:  # a selector's pod (HOST.POD) is a host once its pods are listed
            from deployer.transport.kubernetes import expand_selectors

            inventory = expand_selectors(inventory, [name])  # that selector's pods only
        return get_host(inventory, name, path)

    def connector(self, name: str, host: Host) -> Connector:
        return lambda bus: open_transport(name, host, bus, accept_new_host_key=self.accept_new_host_key)

    def engine(self, name: str, host: Host, playbook: LoadedPlaybook, steps: list[Step], *,
               allow_dirty: bool = False, restart: bool = False, cancel: CancelToken | None = None) -> Engine:
        # Each engine its own list: a command adds its live view to the one engine it shows.
        engine = Engine(host_name=name, host=self.budgeted(host), playbook=playbook, steps=steps,
                        listeners=list(self.listeners), runs_dir=self.runs_dir, allow_dirty=allow_dirty,
                        restart=restart,
                        connect=self.connector(name, host), cancel=cancel if cancel is not None else CancelToken())
        if self.health_timeout_s is not None:  # the run log says the budgets were not the inventory's
            engine.run_tags["health_timeout_s"] = self.health_timeout_s
        if self.revert_checks is not None:
            self.revert_checks.refuse_unknown(steps)
            engine.revert_checks = self.revert_checks
        for step in steps:  # a canary `via:` a router of the inventory; read only if one names a router
            reach_routers(step, self.inventory_routers)
        return engine

    def inventory_routers(self) -> Routers:
        return self.routers(load_inventory(find_inventory(self.inventory)))

    def budgeted(self, host: Host) -> Host:
        """host with every service's health budget replaced by --health-timeout's, when given."""
        if self.health_timeout_s is None:
            return host
        services = {name: service.model_copy(update={"health_timeout_s": self.health_timeout_s})
                    for name, service in host.services.items()}
        return host.model_copy(update={"services": services})

    def engines(self, playbook_path: Path, hosts: dict[str, Host], *, allow_dirty: bool = False,
                restart: bool = False, cancel: CancelToken | None = None) -> dict[str, Engine]:
        """One engine per host, in the order given, sharing the playbook (loaded once) and nothing else."""
        playbook, steps = load_playbook(playbook_path)
        return {name: self.engine(name, host, playbook, steps, allow_dirty=allow_dirty, restart=restart,
                                  cancel=cancel)
                for name, host in hosts.items()}

    def opening(self, engine: Engine, early: Opening | None = None) -> Opening:
        """engine's connection opened, and its agent started, on a thread now, while the run sets up; the
        engine claims it when it connects. The caller discards it if the run never did. An early opening
        (transport/early.py) is taken when it connected as engine's host says to, and dropped when not."""
        if early is not None and early.fits(engine.host_name, engine.host):
            early.release(engine.host)
            opening = early
        else:
            if early is not None:
                early.discard()
            opening = Opening.of(engine.host_name, engine.host, accept_new_host_key=self.accept_new_host_key)
        engine.connect = opening
        return opening

    def for_run(self, run: Run, host_name: str | None = None) -> Engine:
        """An engine on the run's host (or host_name), with the run's own copy of its playbook."""
        name = host_name or recorded_host(run)
        host = self.host(name)
        copy = run.dir / "playbook.yaml"
        model, steps, _ = parse_playbook(copy)
        loaded = LoadedPlaybook(path=copy, raw=copy.read_bytes(), model=model, sources={}, patch=None)
        return self.engine(name, host, loaded, steps)

    def sub_run(self, host: str, run_id: str) -> Engine:
        """For a fleet's follow-up: the engine of one sub-run, on its host, with its own playbook copy."""
        from deployer.runlog import read_run

        return self.for_run(read_run(self.runs_dir, run_id), host)

    def to_recover(self, run: Run, host_name: str | None = None) -> Engine:
        """The engine that recovers run. Killed before it kept its playbook's copy, the run had not reached
        the target's lock yet, so an engine with no playbook does."""
        if (run.dir / "playbook.yaml").is_file():
            return self.for_run(run, host_name)
        return self.bare(host_name or recorded_host(run))

    def bare(self, name: str) -> Engine:
        """An engine without the cut run's playbook: for recovering a run whose run dir is on another machine.
        Its playbook (kept in the recover's run dir) restarts every service of the host: what a rollback
        restarts and verifies after its revert."""
        from deployer.run.restart import restart_playbook

        host = self.host(name)
        loaded, steps = restart_playbook(list(host.services), None, name="recover",
                                         description="recover from the intent record on the target")
        return self.engine(name, host, loaded, steps)

    def restart(self, name: str, services: list[str], checks_from: Path | None = None) -> Engine:
        """`deployer restart`: an engine whose playbook restarts services (none named: every service of the
        host) and runs the checks that the playbook at checks_from runs after its commit."""
        from deployer.run.restart import restart_playbook

        host = self.host(name)
        chosen = services or list(host.services)
        with_checks = f" -p {checks_from}" if checks_from is not None else ""
        loaded, steps = restart_playbook(chosen, checks_from, description=f"deployer restart --host {name} "
                                                                          f"{' '.join(chosen)}{with_checks}")
        return self.engine(name, host, loaded, steps)

    def restart_unit(self, name: str, unit: Unit, services: list[str],
                     checks_from: Path | None = None) -> dict[str, Engine]:
        """`deployer restart --host UNIT`: one engine per host of the unit, each with its part of the unit's
        restart (services: default every one of the unit) and the checks on the unit's metrics host."""
        from deployer.fleet.unit import steps_for

        chosen = services or list(dict.fromkeys(service for _, service in unit.members()))
        engines = {host: self.restart(host, chosen, checks_from) for host in unit.hosts()}
        for host, engine in engines.items():
            engine.steps = steps_for(engine.steps, name, unit, host)
        return engines

    def connection(self, name: str) -> tuple[Host, Transport]:
        """A connection to an inventory host outside any run (listing, lock inspection)."""
        host = self.host(name)
        return host, self.connector(name, host)(self.bus(name, host))

    def bus(self, name: str, host: Host) -> EventBus:
        """The events of work on host outside any run: its secrets masked, to this command's listeners."""
        bus = EventBus(Masker(host.secrets()), name)
        bus.listeners.extend(self.listeners)
        return bus

    def routers(self, inventory: Inventory) -> Routers:
        """The inventory's routers, reached outside a unit on a connection of their own."""
        from deployer.fleet.router import Routers

        return Routers(dict(inventory.routers), lambda name: self.connection(name)[1])

    def fleet_apply(self, engines: dict[str, Engine], units: dict[str, Unit], *, parallel: int,
                    cancel: FleetCancel, listeners: list[Listener], inventory: Inventory | None = None,
                    allow_downtime: bool = False) -> FleetApply:
        """An apply over several hosts, as their (shared) playbook's rollout and on_failure say; the inventory's
        routers take each unit behind one out of it around its restart."""
        from deployer.fleet.apply import FleetApply

        model = next(iter(engines.values())).playbook.model
        from deployer.config.units import every_unit, units_behind

        routers = inventory.routers if inventory is not None else {}
        behind = {} if inventory is None else units_behind(inventory.routers,
                                                          every_unit(inventory.units, inventory.hosts))
        return FleetApply(engines, self.runs_dir, model.rollout, model.on_failure, parallel, cancel=cancel,
                          listeners=listeners, units=units, routers=routers, behind=behind,
                          connect=lambda name: self.connection(name)[1], allow_downtime=allow_downtime)


def recorded_host(run: Run) -> str:
    """The host a run was for: its run_start names it, or, killed before it wrote one, its state record."""
    record = RunRecord.load(run.dir)
    host = run.start.get("host") or (record.state.host if record is not None else None)
    if not isinstance(host, str):
        raise ConfigError(f"run {run.run_id} names no host (its log and record are empty): pass --host H")
    return host
