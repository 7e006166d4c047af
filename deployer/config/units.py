"""A unit: services on different hosts that restart as one, and the router (if any) that sends it traffic."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field

from deployer.config.gang import GangFields
from deployer.config.routers import Router, RouterWorker
from deployer.config.yamlsrc import Loc


class Unit(GangFields, BaseModel):
    """Services on different hosts that restart as one (prefill on one node, decode on another), or a gang."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)  # config.models.Strict's

    services: list[str] = Field(min_length=1)  # "host:service", in start order
    metrics: str | None = None  # the host whose metrics drain and baseline read
    router: str | None = None  # the inventory's router that sends the unit traffic (config/routers.py)
    workers: list[RouterWorker] = Field(default_factory=list)  # its services as the router knows them

    def members(self) -> list[tuple[str, str]]:
        return [(entry.partition(":")[0], entry.partition(":")[2]) for entry in self.services]

    def hosts(self) -> list[str]:
        return list(dict.fromkeys(host for host, _ in self.members()))


def units_behind(routers: Iterable[str], units: Mapping[str, Unit]) -> dict[str, list[str]]:
    """router -> every unit of the inventory behind it (a unit outside a run still serves through it)."""
    return {name: [unit for unit, spec in units.items() if spec.router == name] for name in routers}


def check_unit_router(name: str, unit: Unit, routers: Mapping[str, Router],
                      health: Mapping[str, Mapping[str, str | None]], refuse: Callable[[Loc, str], None]) -> None:
    """A unit's router is in `routers:` and on a known host; each worker is a service of the unit with a health URL.
    health: each inventory host's services' health URLs."""
    if unit.router is None:
        if unit.workers:
            refuse(("units", name, "workers"), "workers need the unit's router: name one in `router:`")
        return
    router = routers.get(unit.router)
    if router is None:
        refuse(("units", name, "router"), f"{unit.router!r} is not in routers: ({', '.join(routers) or 'none'})")
    elif router.host not in health:
        refuse(("routers", unit.router, "host"), f"host {router.host!r} is not in the inventory")
    if not unit.workers:
        refuse(("units", name, "workers"), "a unit behind a router names its workers (service, worker_type)")
    for index, worker in enumerate(unit.workers):
        loc: Loc = ("units", name, "workers", index, "service")
        if worker.service not in unit.services:
            refuse(loc, f"{worker.service!r} is not a service of unit {name!r} ({', '.join(unit.services)})")
            continue
        host, _, service = worker.service.partition(":")
        url = health.get(host, {}).get(service)
        if url is None or not url.startswith("http://"):
            refuse(loc, f"{worker.service}: no http health URL (its in-flight gauges are read beside it)")
