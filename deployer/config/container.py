"""The container a host's agent runs in, or that a service is: its engine, its name, the engine's command."""

from __future__ import annotations

import posixpath
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

# What docker and podman accept as a container's name (or id): a name here cannot be read as an option.
CONTAINER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class Container(BaseModel):
    """A container on the host: a host's `container:` (the agent runs in it, `<engine> exec -i <name>`, and the
    host's repo, python and paths are the container's; not a transport kind, it wraps the host's own), or a
    service's (the service is the container, stopped and started by its engine)."""

    # config.models.Strict's settings (that module imports this one)
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    engine: Literal["docker", "podman"] = Field(description="The container engine: docker or podman.")
    name: Annotated[str, StringConstraints(pattern=CONTAINER_NAME, max_length=253)] = Field(description=(
        "The container's name (or id)."))
    # a second CLI can shadow it, or a podman-docker shim sit at /usr/bin/docker
    engine_path: str | None = Field(default=None, description=(
        "The engine's command on the host (absolute), when it is not the first docker or podman on its PATH."))

    @field_validator("engine_path")
    @classmethod
    def _absolute_engine(cls, path: str | None) -> str | None:
        if path is not None and not posixpath.isabs(path):
            raise ValueError("must be an absolute path on the host")
        return path

    @property
    def command(self) -> str:
        return self.engine_path or self.engine
