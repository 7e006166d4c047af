"""The container a host's agent runs in, or that a service is: its engine, its name, the engine's command."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from typing import Annotated, Literal, Protocol

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


class _Service(Protocol):
    """What check_own_containers reads of a service (config.models.Service, which imports this module)."""

    @property
    def container(self) -> Container | None: ...

    @property
    def gpus(self) -> object: ...


class _Host(Protocol):
    """What check_own_containers reads of a host (config.models.Host)."""

    @property
    def container(self) -> Container | None: ...

    @property
    def services(self) -> Mapping[str, _Service]: ...


def check_own_containers(hosts: Mapping[str, _Host], refuse: Callable[[tuple[str, ...], str], None]) -> None:
    """On a host with `container:`, the agent runs inside that container, where no engine runs: a service there may
    be a container only when it is that very one (its main process is the server; its engine's stop and start
    then run beside it, on the host), through the same engine, once, first among the host's services (the others
    run inside it: stopped before it, started after it), and without `gpus:` (their wait needs the agent its stop
    ends; the stop ends every process in it)."""
    for name, host in hosts.items():
        around = host.container
        if around is None:
            continue
        own = [s for s, service in host.services.items() if service.container is not None
               and service.container.name == around.name]
        for index, (service_name, service) in enumerate(host.services.items()):
            box, loc = service.container, ("hosts", name, "services", service_name, "container")
            if box is None:
                continue
            if box.name != around.name:
                refuse(loc, f"container {box.name} is not the host's container {around.name}: the agent runs inside "
                            f"{around.name}, where no engine runs. Name the host's own container here (its main "
                            f"process is the server), or put {box.name}'s service on a host entry without "
                            "`container:` (the same address), whose agent runs on the host")
            elif (box.engine, box.command) != (around.engine, around.command):
                said = f"{{engine: {around.engine}, name: {around.name}" + \
                    (f", engine_path: {around.engine_path}}}" if around.engine_path else "}")
                refuse(loc, f"names the host's container {around.name} through {box.command}, but the host reaches "
                            f"it through {around.command}: write `container: {said}`")
            elif service_name != own[0]:
                refuse(loc, f"the host's container {around.name} is already service {own[0]}: a container is one "
                            "service")
            elif index != 0:
                refuse(loc, f"the host's own container must be its first service (its other services run inside it: "
                            f"a restart stops them before it and starts them after it): move {service_name} above "
                            f"{next(iter(host.services))}")
            elif service.gpus:
                refuse(("hosts", name, "services", service_name, "gpus"),
                       f"the host's own container {around.name} cannot wait for its GPUs: the wait runs through the "
                       "agent inside it, which its stop ends (and the stop ends every process in it, so its GPUs "
                       "are released with it): drop `gpus:` here")
