"""What `--host` and `--limit` name: a host, a group, a unit, a comma list or a glob, as inventory hosts."""

from __future__ import annotations

import fnmatch

from deployer.config.models import Inventory, Unit
from deployer.config.units import every_unit
from deployer.errors import ConfigError

GLOB_CHARS = "*?["


def resolve(inventory: Inventory, spec: str, *, limit: str | None = None) -> list[str]:
    """The hosts spec names, in the order it names them, each once; --limit keeps only the hosts it names too."""
    hosts = _expand(inventory, spec)
    if limit is None:
        return hosts
    kept = set(_expand(inventory, limit))
    narrowed = [host for host in hosts if host in kept]
    if not narrowed:
        raise ConfigError(f"--limit {limit!r} leaves no host of {spec!r}")
    return narrowed


def _expand(inventory: Inventory, spec: str) -> list[str]:
    names = [part.strip() for part in spec.split(",") if part.strip()]
    if not names:
        raise ConfigError(f"the host selection {spec!r} is empty")
    found: dict[str, None] = {}
    for name in names:
        found.update(dict.fromkeys(_one(inventory, name, ())))
    return list(found)


def _one(inventory: Inventory, name: str, through: tuple[str, ...]) -> list[str]:
    if name in inventory.hosts:
        return [name]
    if name in inventory.units:
        return inventory.units[name].hosts()
    if name in inventory.groups:
        # load_inventory refused cycles; `through` only guards a model built without it.
        if name in through:
            raise ConfigError(f"groups form a cycle: {' -> '.join((*through, name))}")
        return [host for member in inventory.groups[name] for host in _one(inventory, member, (*through, name))]
    if any(char in name for char in GLOB_CHARS):
        matched = [host for host in inventory.hosts if fnmatch.fnmatchcase(host, name)]
        if not matched:
            raise ConfigError(f"glob {name!r} matches no host (hosts: {', '.join(inventory.hosts) or 'none'})")
        return matched
    known = ", ".join([*inventory.hosts, *inventory.groups, *inventory.units]) or "none"
    raise ConfigError(f"{name!r} is not a host, group or unit of the inventory (known: {known})")


def units_of(inventory: Inventory, hosts: list[str]) -> dict[str, list[str]]:
    """Every unit that a selected host belongs to, with all of its hosts: a unit restarts whole or not at all."""
    chosen = set(hosts)
    return {name: unit.hosts() for name, unit in inventory.units.items() if chosen & set(unit.hosts())}


def whole_units(inventory: Inventory, hosts: list[str]) -> dict[str, list[str]]:
    """units_of, refusing a selection that takes part of a unit (its services restart together)."""
    units = units_of(inventory, hosts)
    for name, members in units.items():
        missing = [host for host in members if host not in hosts]
        if missing:
            raise ConfigError(f"the selection takes part of unit {name!r} ({', '.join(members)}) but not "
                              f"{', '.join(missing)}: a unit is deployed and restarted whole; select {name!r}")
    return units


def run_units(inventory: Inventory, hosts: list[str]) -> dict[str, Unit]:
    """The units a run over hosts works on as units: each unit of them whole (whole_units), and each plain host of
    them behind a router as a unit of one (config.units.unit_of_one), so that it leaves its router around its
    restart as a unit does."""
    every = every_unit(inventory.units, inventory.hosts)
    return {name: every[name] for name in [*whole_units(inventory, hosts), *(h for h in hosts if h in every)]}
