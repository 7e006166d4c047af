"""Transport kinds by the name a host's `transport:` gives, each the module that opens it.

A kind's module has `open_host(name, host, bus, accept_new_host_key) -> Transport`: it makes the pipe to the
target's python and says the connection's facts (TransportInfo). Modules are named, not imported, here: a kind
is imported only when a host of it is opened (paramiko's import alone costs what a local run does). A new kind
(`docker exec -i`, `kubectl exec -i`) is its module, its host model in config/models.py, and one line below.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol

from deployer.transport.base import Transport

KINDS: dict[str, str] = {
    "ssh": "deployer.transport.ssh.transport",
    "local": "deployer.transport.local",
}


class Emitter(Protocol):
    def emit(self, kind: str, /, **data: Any) -> None: ...


# The host is the kind's own model (SshHost for ssh); the model's discriminator chose it by the same name.
Opener = Callable[[str, Any, Emitter, bool], Transport]


def opener(kind: str) -> Opener:
    """The kind's open_host, its module imported now."""
    found: Opener = importlib.import_module(KINDS[kind]).open_host
    return found
