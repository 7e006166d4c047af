"""The inventory's `routers:` (what sends a unit its traffic, and how a worker is taken out and put back), and the
entries of a unit's `workers:` (which of its services the router knows, as what)."""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

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


def metrics_origin(health: str | None) -> str:
    """http://HOST:PORT of a worker service's health URL (checked when the inventory loaded): where its own
    gauges are read, on its host's loopback, and by default the URL the router names it by."""
    assert health is not None
    return http_origin(health)
