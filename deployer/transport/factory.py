"""Open the transport an inventory host asks for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from deployer.config import Host
from deployer.context import EventBus
from deployer.errors import ConfigError
from deployer.transport.base import Transport
from deployer.transport.local import LocalTransport

if TYPE_CHECKING:
    from deployer.agent.client import Hello


def open_transport(name: str, host: Host, bus: EventBus, *, accept_new_host_key: bool = False) -> Transport:
    transport = _open(name, host, bus, accept_new_host_key)

    def started(hello: Hello) -> None:
        # Which agent ran, by the sha256 of its source, as whom and under which python.
        bus.emit("agent", sha256=hello.sha256, version=hello.version, python=hello.python,
                 executable=hello.executable, pid=hello.pid, uid=hello.uid, euid=hello.euid)

    transport.on_agent = started
    return transport


def _open(name: str, host: Host, bus: EventBus, accept_new_host_key: bool) -> Transport:
    if host.transport == "local":
        return LocalTransport(name, python=host.python, become=host.become)
    from deployer.transport.ssh import SSHTransport  # paramiko is slow to import; local runs skip it

    def pinned(entry: str, key_type: str, fingerprint: str) -> None:
        bus.emit("host_key_pinned", entry=entry, key_type=key_type, fingerprint=fingerprint)

    address = host.address or name
    if not address:
        raise ConfigError(f"host {name!r} has no address")
    return SSHTransport(name=name, address=address, port=host.port, user=host.user,
                        identity_file=host.identity_file, known_hosts=host.known_hosts, ssh_config=host.ssh_config,
                        host_key_policy="accept-new" if accept_new_host_key else host.host_key_policy,
                        become=host.become, on_host_key_pinned=pinned, python=host.python)
