"""The inventory's `routers:` (what sends a unit its traffic, and how a worker is taken out and put back), and a
unit's `router:` and `workers:` (which of its services the router knows, as what)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from collections.abc import Callable

    from deployer.config.models import Inventory, Service, Unit
    from deployer.config.yamlsrc import Loc

LOOPBACK = ("127.0.0.1", "localhost", "::1")

# A worker's in-flight requests: SGLang's running and waiting requests and its PD queues, each summed over every
# series (one per rank or scheduler). The router's `inflight:` replaces the list for other servers.
SGLANG_INFLIGHT = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_prefill_bootstrap_queue_reqs",
                   "sglang:num_prefill_inflight_queue_reqs", "sglang:num_decode_prealloc_queue_reqs",
                   "sglang:num_decode_transfer_queue_reqs")


def http_origin(url: str) -> str:
    """http://HOST:PORT of an http URL (no path): what a router names a worker by."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise ValueError(f"{url!r}: expected http://HOST:PORT")
    return f"http://{parts.netloc}"


def _loopback_origin(url: str) -> str:
    origin = http_origin(url)
    if urlsplit(origin).hostname not in LOOPBACK:
        raise ValueError(f"{url!r}: the router is called on its own host's loopback (127.0.0.1, localhost, ::1)")
    return origin


class Router(BaseModel):
    """A router on an inventory host, called there through the agent (loopback only)."""

    model_config = ConfigDict(extra="forbid", frozen=True)  # config.models.Strict's (that module imports this one)

    host: str  # the inventory host whose loopback serves it
    url: Annotated[str, AfterValidator(_loopback_origin)]
    # sglang-gateway: GET/POST /workers, DELETE /workers/{id} (queued, 202); sglang-router: the older
    # POST /add_worker?url=, POST /remove_worker?url=, GET /list_workers.
    api: Literal["sglang-gateway", "sglang-router"] = "sglang-gateway"
    inflight: list[str] = Field(default_factory=lambda: list(SGLANG_INFLIGHT), min_length=1)
    change_timeout_s: float = Field(default=10.0, gt=0)  # a queued removal or addition to show in its list
    drain_timeout_s: float = Field(default=120.0, gt=0)  # a removed worker's in-flight requests to reach 0
    interval_s: float = Field(default=0.2, gt=0)


class RouterWorker(BaseModel):
    """One of a unit's services as its router knows it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    service: str  # "host:service" of the unit
    worker_type: Literal["prefill", "decode", "regular"]
    # As the router reaches it; by default the origin of the service's health URL (router and worker on one node).
    url: Annotated[str, AfterValidator(http_origin)] | None = None
    bootstrap_port: int | None = Field(default=None, ge=1, le=65535)  # a prefill's, sent when it is added back


def units_behind(inventory: Inventory) -> dict[str, list[str]]:
    """router -> every unit of the inventory behind it (a unit outside a run still serves through it)."""
    return {name: [unit for unit, spec in inventory.units.items() if spec.router == name] for name in inventory.routers}


def check_unit_router(inventory: Inventory, name: str, unit: Unit, refuse: Callable[[Loc, str], None]) -> None:
    """A unit's router is in `routers:` and on a known host; each worker is a service of the unit with a health URL."""
    if unit.router is None:
        if unit.workers:
            refuse(("units", name, "workers"), "workers need the unit's router: name one in `router:`")
        return
    router = inventory.routers.get(unit.router)
    if router is None:
        refuse(("units", name, "router"),
               f"{unit.router!r} is not in routers: ({', '.join(inventory.routers) or 'none'})")
    elif router.host not in inventory.hosts:
        refuse(("routers", unit.router, "host"), f"host {router.host!r} is not in the inventory")
    if not unit.workers:
        refuse(("units", name, "workers"), "a unit behind a router names its workers (service, worker_type)")
    for index, worker in enumerate(unit.workers):
        loc: Loc = ("units", name, "workers", index, "service")
        if worker.service not in unit.services:
            refuse(loc, f"{worker.service!r} is not a service of unit {name!r} ({', '.join(unit.services)})")
            continue
        host, _, service = worker.service.partition(":")
        health = inventory.hosts[host].services[service].health if host in inventory.hosts else None
        if health is None or not health.startswith("http://"):
            refuse(loc, f"{worker.service}: no http health URL (its in-flight gauges are read beside it)")


def metrics_origin(service: Service) -> str:
    """http://HOST:PORT of a worker service's health URL (checked when the inventory loaded): where its own
    gauges are read, on its host's loopback, and by default the URL the router names it by."""
    assert service.health is not None
    return http_origin(service.health)
