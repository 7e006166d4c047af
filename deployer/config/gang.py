"""A gang: one model served by ranks on several hosts (SGLang `--nnodes 2 --node-rank N --dist-init-addr ...`),
declared on a unit. Its ranks wait for each other at the rendezvous, so they are stopped together and started
concurrently, never one healthy before the next; only the leader (rank 0) serves HTTP, so health is asked of
it alone, and the other ranks' liveness is their process."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class GangFields(BaseModel):
    """A unit's `gang: true` and `leader: HOST:SERVICE` (config.models.Unit takes these)."""

    model_config = ConfigDict(defer_build=True)  # a mixin: only Unit's validator is ever built and used

    gang: bool = Field(default=False, description=(
        "true: the unit is one model served by ranks on several hosts, stopped together and started concurrently."))
    leader: str | None = Field(default=None, description=(
        "The gang's member (HOST:SERVICE) that serves HTTP: its health says the gang is up."))

    @model_validator(mode="after")
    def _leader_of_the_gang(self) -> GangFields:
        services: list[str] = getattr(self, "services", [])
        if self.gang and self.leader is None:
            raise ValueError("a gang names its leader: `leader: HOST:SERVICE` (the rank that serves HTTP)")
        if self.leader is not None and not self.gang:
            raise ValueError("`leader` is for a gang: add `gang: true`")
        if self.leader is not None and self.leader not in services:
            raise ValueError(f"leader {self.leader!r} is not one of the unit's services ({', '.join(services)})")
        return self

    def gang_leader(self) -> tuple[str, str] | None:
        """(host, service) of the leader when the unit is a gang."""
        if self.leader is None:
            return None
        host, _, service = self.leader.partition(":")
        return host, service
