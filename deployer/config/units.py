"""A unit: services on different hosts that restart as one, and the router (if any) that sends it traffic."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from deployer.config.gang import GangFields
from deployer.config.routers import BehindRouter, Router, RouterWorker
from deployer.config.yamlsrc import Loc


class Unit(GangFields, BehindRouter, BaseModel):
    """Services on different hosts that restart as one (prefill on one node, decode on another), or a gang."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)  # config.models.Strict's

    services: list[str] = Field(min_length=1, description="Its services, each HOST:SERVICE, in start order.")
    metrics: str | None = Field(default=None, description="The host of the unit whose metrics baseline and drain read.")
    # router: and workers: (BehindRouter): the inventory's router that sends the unit traffic, its workers there
    group_label: str | None = Field(default=None, min_length=1, description=(
        "A pod label that pairs the pods of the unit's selector hosts (kubernetes hosts with pod.selector), such "
        "as leaderworkerset.sigs.k8s.io/group-index: one unit per value of it, named UNIT.VALUE, each with that "
        "value's pods of every host, and a group UNIT of them. Without it a unit takes every pod its selector "
        "hosts select."))

    def members(self) -> list[tuple[str, str]]:
        return [(entry.partition(":")[0], entry.partition(":")[2]) for entry in self.services]

    def hosts(self) -> list[str]:
        return list(dict.fromkeys(host for host, _ in self.members()))


def unit_of_hosts(units: Mapping[str, Unit]) -> dict[str, str]:
    """host -> the unit it belongs to (what a fleet's webhook documents name beside each host)."""
    return {host: name for name, unit in units.items() for host in unit.hosts()}


def units_behind(routers: Iterable[str], units: Mapping[str, Unit]) -> dict[str, list[str]]:
    """router -> every unit of the inventory behind it (a unit outside a run still serves through it)."""
    return {name: [unit for unit, spec in units.items() if spec.router == name] for name in routers}


class RoutedHost(Protocol):
    """An inventory host as far as its router is read here (config.models.Host, which imports this module)."""

    @property
    def router(self) -> str | None: ...

    @property
    def workers(self) -> list[RouterWorker]: ...

    @property
    def services(self) -> Mapping[str, Any]: ...  # each service with its `health` URL


def unit_of_one(name: str, host: RoutedHost) -> Unit:
    """A plain host behind a router as a unit of one, named as the host (every service of it, in its order): what
    takes a unit out of its router around its restart (fleet.router, fleet.unit) then takes the host out too."""
    # Built from checked fields, unvalidated: a host without services has no unit of one, but still its checks.
    return Unit.model_construct(services=[f"{name}:{service}" for service in host.services], router=host.router,
                                workers=host.workers)


def part_on(unit: Unit, host: str) -> Unit:
    """A unit's services and router workers on one host: what the rollback of that host's run alone restarts (out of
    the unit's router meanwhile; behind none when no worker of the unit is on the host)."""
    workers = [worker for worker in unit.workers if worker.service.partition(":")[0] == host]
    return Unit.model_construct(services=[f"{h}:{service}" for h, service in unit.members() if h == host],
                                router=unit.router if workers else None, workers=workers)


def every_unit(units: Mapping[str, Unit], hosts: Mapping[str, RoutedHost]) -> dict[str, Unit]:
    """The inventory's units, and each plain host that names its router as a unit of one."""
    return {**units, **{name: unit_of_one(name, host) for name, host in hosts.items() if host.router is not None}}


def check_routers(units: Mapping[str, Unit], hosts: Mapping[str, RoutedHost], routers: Mapping[str, Router],
                  refuse: Callable[[Loc, str], None]) -> None:
    """Every unit's and plain host's router and workers (check_unit_router); a host of a unit names none (the
    unit's router sends it traffic)."""
    health = {h: {s: v.health for s, v in host.services.items()} for h, host in hosts.items()}
    for name, unit in units.items():
        check_unit_router(name, unit, routers, health, refuse)
    in_unit = {host: name for name, unit in units.items() for host in unit.hosts()}
    for name, host in hosts.items():
        if name in in_unit and (host.router is not None or host.workers):
            refuse(("hosts", name, "router" if host.router is not None else "workers"),
                   f"host {name!r} is in unit {in_unit[name]!r}: name the router and workers on the unit")
        elif host.router is not None or host.workers:
            check_unit_router(name, unit_of_one(name, host), routers, health, refuse, kind="host")


def check_unit_router(name: str, unit: Unit, routers: Mapping[str, Router],
                      health: Mapping[str, Mapping[str, str | None]], refuse: Callable[[Loc, str], None],
                      kind: Literal["unit", "host"] = "unit") -> None:
    """A unit's router is in `routers:` and on a known host; each worker is a service of the unit with a health URL.
    health: each inventory host's services' health URLs. kind host: a plain host's unit of one, refused where the
    host is written (hosts.NAME)."""
    at: Loc = (f"{kind}s", name)
    if unit.router is None:
        if unit.workers:
            refuse((*at, "workers"), f"workers need the {kind}'s router: name one in `router:`")
        return
    router = routers.get(unit.router)
    if router is None:
        refuse((*at, "router"), f"{unit.router!r} is not in routers: ({', '.join(routers) or 'none'})")
    elif router.host not in health:
        refuse(("routers", unit.router, "host"), f"host {router.host!r} is not in the inventory")
    if not unit.workers:
        refuse((*at, "workers"), f"a {kind} behind a router names its workers (service, worker_type)")
    for index, worker in enumerate(unit.workers):
        loc: Loc = (*at, "workers", index, "service")
        if worker.service not in unit.services:
            have = ", ".join(unit.services) or "none"
            refuse(loc, f"{worker.service!r} is not a service of {kind} {name!r} ({have})")
            continue
        host, _, service = worker.service.partition(":")
        url = health.get(host, {}).get(service)
        if url is None or not url.startswith("http://"):
            refuse(loc, f"{worker.service}: no http health URL (its in-flight gauges are read beside it)")
