"""known_hosts: an unknown key is refused (or pinned, under accept-new, and said); a changed key always refused."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from deployer.command import quote
from deployer.errors import ConfigError, ConnectError, HostKeyError
from deployer.transport.ssh.config import Endpoint
from deployer.transport.ssh.paramiko_lean import paramiko
from deployer.transport.ssh.params import HostKeyPolicy

HostKeyPinned = Callable[[str, str, str], None]

_known_hosts_lock = threading.Lock()


def fingerprint(key: paramiko.PKey) -> str:
    """`<keytype> SHA256:<base64>`, as `ssh-keygen -l` shows it."""
    return f"{key.get_name()} {key.fingerprint}"


class KnownHosts:
    """One known_hosts file as a host's connections (each jump host's and the target's) check keys in it."""

    def __init__(self, name: str, path: str, policy: HostKeyPolicy, on_pinned: HostKeyPinned | None) -> None:
        self.name = name  # the inventory host, for messages
        self.path = path
        self._policy = policy
        self._on_pinned = on_pinned

    def guard(self, client: paramiko.SSHClient, ep: Endpoint) -> None:
        """Load the pinned keys into client, and decide there about a key they lack (never auto-add)."""
        keys = client.get_host_keys()
        try:
            if os.path.exists(self.path):
                keys.load(self.path)
        except (OSError, paramiko.SSHException, paramiko.hostkeys.InvalidHostKey) as exc:
            raise ConfigError(f"{self.name}: cannot read known_hosts {self.path}: "
                              f"{type(exc).__name__}: {exc}; fix or remove the bad line") from exc
        client.set_missing_host_key_policy(_HostKeyGate(lambda entry, key: self._missing_host_key(ep, entry, key)))

    def changed_key_message(self, ep: Endpoint, got: paramiko.PKey, expected: paramiko.PKey) -> str:
        return (
            f"{self.name}: HOST KEY CHANGED for {ep.entry}; refusing to connect "
            "(under every host_key_policy).\n"
            f"  known_hosts {self.path} pins: {fingerprint(expected)}\n"
            f"  the server presented:       {fingerprint(got)}\n"
            "  Either the host was reinstalled or someone is intercepting the connection. Only if\n"
            "  you have verified the new key out of band, remove the old entry with\n"
            f"    ssh-keygen -R {quote([ep.entry])} -f {quote([self.path])}\n"
            "  and connect once with --accept-new-host-key.")

    def _unknown_key_message(self, ep: Endpoint, key: paramiko.PKey) -> str:
        return (
            f"{self.name}: host key of {ep.entry} is not in {self.path}; refusing to "
            "connect (host_key_policy: reject). Nothing was sent to it.\n"
            f"  The server presented: {fingerprint(key)}\n"
            "  Compare it out of band (on the host: ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub),\n"
            "  then accept it by setting `host_key_policy: accept-new` for this host in the\n"
            "  inventory, or by passing --accept-new-host-key.")

    def _missing_host_key(self, ep: Endpoint, entry: str, key: paramiko.PKey) -> None:
        if self._policy != "accept-new":
            raise HostKeyError(self._unknown_key_message(ep, key))
        self._pin(ep, entry, key)

    def _pin(self, ep: Endpoint, entry: str, key: paramiko.PKey) -> None:
        """Append key for entry to known_hosts (created 0600), then tell the caller."""
        name = paramiko.HostKeys.hash_host(entry) if ep.hash_known_hosts else entry
        line = f"{name} {key.get_name()} {key.get_base64()}\n"
        path = self.path
        try:
            with _known_hosts_lock:
                os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    # A file whose last line lacks its newline would swallow ours.
                    if os.fstat(fd).st_size and not _ends_with_newline(path):
                        line = "\n" + line
                    os.write(fd, line.encode())
                finally:
                    os.close(fd)
        except OSError as exc:
            raise ConnectError(f"{self.name}: cannot pin the host key of {entry} into {path}: "
                               f"{exc}") from None
        if self._on_pinned is not None:
            self._on_pinned(entry, key.get_name(), key.fingerprint)


class _HostKeyGate(paramiko.MissingHostKeyPolicy):
    """paramiko's missing-host-key hook: reject, or pin under accept-new. Never auto-add.

    paramiko calls it only for a host with no known key; a different key for a known host
    raises BadHostKeyException before this, under every policy."""

    def __init__(self, decide: Callable[[str, paramiko.PKey], None]) -> None:
        self._decide = decide

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        # hostname is already the known_hosts entry: `[host]:port` off port 22.
        self._decide(hostname, key)


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"
