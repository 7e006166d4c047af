"""Services on the target, one module per way of managing one (a command deployer starts, a systemd unit), and
co_restart, which restarts them together. Which manager runs a service is decided here, in one place: a new
kind of service is one new module and one line in MANAGERS."""

from __future__ import annotations

from deployer.steps.context import Context
from deployer.steps.services.command import CommandManager
from deployer.steps.services.container import ContainerManager
from deployer.steps.services.kubernetes import PodContainerManager
from deployer.steps.services.manager import Manager
from deployer.steps.services.systemd import SystemdManager

# Asked in turn; the inventory gives each service exactly one way to run it.
MANAGERS: tuple[type[Manager], ...] = (SystemdManager, ContainerManager, PodContainerManager, CommandManager)


def manager_for(ctx: Context, name: str, step: str = "status", timeout: float = 60.0) -> Manager:
    service = ctx.host.services[name]
    cls = next(m for m in MANAGERS if m.manages(service))
    return cls(ctx, name, service, step, timeout)
