"""A unit: services on different hosts that restart as one, and the router (if any) that sends it traffic."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from deployer.config.routers import RouterWorker


class Unit(BaseModel):
    """Services on different hosts that restart as one (prefill on one node, decode on another)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)  # config.models.Strict's

    services: list[str] = Field(min_length=1)  # "host:service", in start order
    metrics: str | None = None  # the host whose metrics drain and baseline read
    router: str | None = None  # the inventory's router that sends the unit traffic (config/routers.py)
    workers: list[RouterWorker] = Field(default_factory=list)  # its services as the router knows them

    def members(self) -> list[tuple[str, str]]:
        return [(entry.partition(":")[0], entry.partition(":")[2]) for entry in self.services]

    def hosts(self) -> list[str]:
        return list(dict.fromkeys(host for host, _ in self.members()))
