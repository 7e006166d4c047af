"""Downtime as the use cases see it: a batch (a fleet's, or one host's run) that takes out every unit behind a
router. `plan` (and a dry-run apply) says it with the expected seconds; `apply` and `rollback` refuse it (a
ConfigError, exit 2) unless allowed (--allow-downtime). The counting itself is the fleet's (fleet.strategies,
fleet.apply.planned_downtime)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deployer.build import Build
    from deployer.config.models import Inventory, Unit
    from deployer.fleet.apply import Downtime
    from deployer.run.engine import Engine


def units_behind_routers(inventory: Inventory) -> dict[str, list[str]]:
    """router -> every unit of the inventory behind it (plain hosts behind a router as units of one)."""
    from deployer.config.units import every_unit, units_behind

    return units_behind(inventory.routers, every_unit(inventory.units, inventory.hosts))


def routed_part(inventory: Inventory, host: str) -> tuple[str, Unit] | None:
    """The unit (its name, and its part on host) whose router sends host traffic: a plain host's unit of one, or
    host's part of its unit; None: host is behind no router."""
    from deployer.config.units import every_unit, part_on

    for name, unit in every_unit(inventory.units, inventory.hosts).items():
        if host in unit.hosts():
            part = part_on(unit, host)
            return (name, part) if part.router is not None else None
    return None


def refuse_lone(host: str, units: dict[str, Unit], inventory: Inventory, allowed: bool) -> None:
    """Unless allowed: refuse a one-host run (apply or rollback) whose host's unit (units: it, or the part of it
    on host) is alone behind its router, as a fleet's batch is refused."""
    from deployer.fleet.strategies import refuse_downtime

    refuse_downtime([[host]], {name: unit.hosts() for name, unit in units.items()},
                    units_behind_routers(inventory), allowed)


def lone_downtime(build: Build, engine: Engine, units: dict[str, Unit], inventory: Inventory,
                  command: str = "apply") -> list[Downtime]:
    """A one-host plan's downtime: the router its host (or its unit, or part of one) is alone behind, and for how
    long, as refuse_lone refuses it. units: the run's (empty, or the host's unit); command: what needs
    --allow-downtime for it."""
    if not any(unit.router is not None for unit in units.values()):
        return []  # a plain host's plan never loads the fleet modules
    from dataclasses import replace

    from deployer.fleet.apply import planned_downtime

    found = planned_downtime({engine.host_name: engine}, units, engine.playbook.model.rollout,
                             units_behind_routers(inventory), build.runs_dir)
    return [replace(down, command=command) for down in found]


def fleet_downtime(build: Build, engines: dict[str, Engine], units: dict[str, Unit],
                   inventory: Inventory) -> list[Downtime]:
    """A fleet apply's downtime: each router one of its batches leaves with no unit behind it, and for how long."""
    from deployer.fleet.apply import planned_downtime

    return planned_downtime(engines, units, next(iter(engines.values())).playbook.model.rollout,
                            units_behind_routers(inventory), build.runs_dir)
