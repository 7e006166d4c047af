"""Target kinds by the name a host's `transport:` gives, each the module that owns it.

A kind's module has `open_host(name, host, bus, accept_new_host_key) -> Transport` (the pipe to the target's
python, and the connection's facts as TransportInfo) and `rows(transport, host, dests) -> list[Row]` (its own
rows of `deployer check`: how it was reached, where the playbook's dests live; a failed one ends that host's
check). Modules are named, not imported, here: a kind is imported only when a host of it is opened (paramiko's
import alone costs what a local run does).

Each kind's host model is config.models.HOST_MODELS[kind], and the inventory's union is built from that: the
inventory is loaded, checked and turned into JSON Schema in config/, a room below this one, which must know every
kind without importing a kind's exec (ssh's is paramiko). So the model is the kind's by its name, kept where the
loader can read it; a test holds the two registries to the same names. A new kind is its module here, its model
in HOST_MODELS, and one line in each.

`container:` is not a kind: it wraps the exec of whichever kind reached the host (`<engine> exec -i` in front of
the agent's bootstrap: transport/container.py), as `kubernetes` wraps a local or ssh transport in `kubectl exec -i`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, Protocol

from deployer.transport.base import Transport

KINDS: dict[str, str] = {
    "ssh": "deployer.transport.ssh.transport",
    "local": "deployer.transport.local",
    "kubernetes": "deployer.transport.kubernetes",
}
# Not a kind: a wrapper any kind's host may have (Host.container), named here so that no one adds it above.
WRAPPERS: dict[str, str] = {"container": "deployer.transport.container"}


class Emitter(Protocol):
    def emit(self, kind: str, /, **data: Any) -> None: ...


class Row(NamedTuple):
    """A row of `deployer check`, as its report adds it."""

    name: str
    status: Literal["ok", "warn", "fail", "skip"]
    detail: str
    exit_code: int = 0


# The host is the kind's own model (SshHost for ssh); the model's discriminator chose it by the same name.
Opener = Callable[[str, Any, Emitter, bool], Transport]
Rows = Callable[[Transport, Any, list[str]], list[Row]]  # the host, and the playbook's dests


def opener(kind: str) -> Opener:
    """The kind's open_host, its module imported now."""
    found: Opener = importlib.import_module(KINDS[kind]).open_host
    return found


def rows(kind: str) -> Rows:
    """The kind's check rows, its module imported now."""
    found: Rows = importlib.import_module(KINDS[kind]).rows
    return found
