"""What an SSH connection is opened with, apart from the host model it comes from: an early connection has it
before any model is loaded (transport/early.py), and compares it with the model's once the config is."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from deployer.config.models import SshHost

HostKeyPolicy = Literal["reject", "accept-new"]
MAX_TIMEOUT_S = 86400.0  # a record's connect timeout beyond a day (or not finite) is not one this machine wrote
_OPTIONAL_STR = (str, type(None))
# Each field's types, for a record read back from a file: bool is an int to isinstance, so a port is checked apart.
_TYPES: dict[str, tuple[type, ...]] = {
    "address": (str,), "user": _OPTIONAL_STR, "identity_file": _OPTIONAL_STR, "known_hosts": _OPTIONAL_STR,
    "ssh_config": _OPTIONAL_STR, "host_key_policy": (str,), "connect_timeout_s": (float, int), "become": (bool,),
    "python": (str,),
}


@dataclass(frozen=True)
class SshParams:
    """The fields of a `transport: ssh` host that its connection and its agent's start read."""

    address: str  # the host's address, or its inventory name when it has none
    port: int | None
    user: str | None
    identity_file: str | None
    known_hosts: str | None
    ssh_config: str | None
    host_key_policy: HostKeyPolicy
    connect_timeout_s: float
    become: bool
    python: str

    @classmethod
    def of(cls, name: str, host: SshHost) -> SshParams:
        return cls(address=host.address or name, port=host.port, user=host.user, identity_file=host.identity_file,
                   known_hosts=host.known_hosts, ssh_config=host.ssh_config, host_key_policy=host.host_key_policy,
                   connect_timeout_s=host.connect_timeout_s, become=host.become, python=host.python)

    def document(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_document(cls, data: object) -> SshParams | None:
        """The params a record holds, or None where it holds something else (a field missing, extra or mistyped)."""
        names = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or set(data) != names:
            return None
        port = data["port"]
        if port is not None and (type(port) is not int or not 1 <= port <= 65535):
            return None
        if any(not isinstance(data[name], types) or (types != (bool,) and isinstance(data[name], bool))
               for name, types in _TYPES.items()):
            return None
        if (not data["address"] or data["host_key_policy"] not in ("reject", "accept-new")
                or not 0 < data["connect_timeout_s"] <= MAX_TIMEOUT_S):
            return None
        return cls(**{**data, "connect_timeout_s": float(data["connect_timeout_s"])})
