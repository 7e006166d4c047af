"""A target reached over SSH: one authenticated paramiko connection, one exec channel for the agent.

The constructor connects eagerly, so an unreachable host, a refused host key or a failed login
surfaces at preflight, before any step has run. The agent (deployer/agent) then runs on one exec
channel of that connection and carries every command, upload and check; port forwards (for a
storm) are further channels. There are no reconnects: a lost connection is a TransportError
rather than a silent second handshake, and the agent exits when its channel closes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from deployer.agent.pipe import Pipe
from deployer.command import quote
from deployer.errors import ConfigError, TransportError
from deployer.transport.base import Transport, TransportInfo
from deployer.transport.kinds import Row
from deployer.transport.ssh.config import known_hosts_file, load_config, proxy_jumps, resolve
from deployer.transport.ssh.connect import Link, describe
from deployer.transport.ssh.execchan import ExecPipe
from deployer.transport.ssh.forward import Forward, close_quietly
from deployer.transport.ssh.hostkeys import HostKeyPinned, KnownHosts, fingerprint
from deployer.transport.ssh.paramiko_lean import paramiko
from deployer.transport.ssh.params import HostKeyPolicy, SshParams

if TYPE_CHECKING:
    from deployer.config.models import SshHost
    from deployer.transport.kinds import Emitter

# paramiko reports every refused tunnel connection (a service still starting) on stderr through
# logging's last-resort handler; those outcomes reach callers as errors already.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

KEEPALIVE_S = 30
# Run on a channel of its own to end what this connection's other sessions run: each session's command is a child
# of the connection's sshd process, the leader of a process group of its own, which goes whole (this one's is
# spared). What a run starts in a session of its own (a service) is out of reach. For a python that never ran the
# agent: one that never reads nor exits does not notice the channel's end, and sshd refuses RFC 4254's "signal" to
# a root login (no privilege separation after it). Linux /proc, POSIX sh, one line, no `!` (a csh login shell).
KILL_SESSIONS = ("c=$$; while :; do p=$(sed -n 's/^PPid:[[:space:]]*//p' /proc/$c/status); "
                 '[ -n "$p" ] && [ "$p" -gt 1 ] || exit 3; case "$(cat /proc/$p/comm)" in sshd*) break ;; esac; '
                 'c=$p; done; for s in $(cat /proc/$p/task/$p/children); do [ "$s" = "$c" ] || kill -9 -"$s"; done')


def open_host(name: str, host: SshHost, bus: Emitter, accept_new_host_key: bool) -> SSHTransport:
    """The registry's opener for `transport: ssh` (transport/kinds.py)."""
    return connect_host(name, SshParams.of(name, host), bus, accept_new_host_key)


def rows(transport: Transport, host: SshHost, dests: list[str]) -> list[Row]:
    """The kind's rows of `check` (transport/kinds.py): the host key it pinned, the login it made."""
    return [Row("host key", "ok", f"pinned: {transport.info.host_key_fingerprint}"),
            Row("auth", "ok", f"logged in to {transport.info.target}")]


def connect_host(name: str, params: SshParams, bus: Emitter, accept_new_host_key: bool) -> SSHTransport:
    """The connection to host name, from its params (an early connection has these before the host's model)."""

    def pinned(entry: str, key_type: str, fingerprint: str) -> None:
        bus.emit("host_key_pinned", entry=entry, key_type=key_type, fingerprint=fingerprint)

    if not params.address:
        raise ConfigError(f"host {name!r} has no address")
    return SSHTransport(name=name, address=params.address, port=params.port, user=params.user,
                        identity_file=params.identity_file, known_hosts=params.known_hosts,
                        ssh_config=params.ssh_config, connect_timeout=params.connect_timeout_s,
                        host_key_policy="accept-new" if accept_new_host_key else params.host_key_policy,
                        become=params.become, on_host_key_pinned=pinned,
                        python=params.python)


class SSHTransport(Transport):
    """One host through a single SSH connection: the agent's exec channel, and port forwards."""

    caches_agent = True  # its 93 KB would cross the link on every run

    def __init__(self, *, name: str, address: str, port: int | None = None,
                 user: str | None = None, identity_file: str | None = None,
                 known_hosts: str | None = None, host_key_policy: HostKeyPolicy = "reject",
                 ssh_config: str | None = None, connect_timeout: float,
                 become: bool = False, on_host_key_pinned: HostKeyPinned | None = None,
                 python: str = "python3") -> None:
        super().__init__(python=python, become=become)
        if host_key_policy not in ("reject", "accept-new"):
            raise ConfigError(f"{name}: host_key_policy must be 'reject' or 'accept-new', "
                              f"not {host_key_policy!r}")
        self.name = name
        self._connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._forwards: dict[tuple[str, int], Forward] = {}
        self._ahead: paramiko.Channel | None = None  # see open_ahead
        self._closed = False

        config = load_config(ssh_config)
        if identity_file is not None and not os.path.isfile(os.path.expanduser(identity_file)):
            raise ConfigError(f"{name}: identity file {identity_file} does not exist")
        target = resolve(config, address, port=port, user=user,
                         identity_files=(identity_file,) if identity_file else None)
        self._known_hosts = known_hosts_file(config, address, known_hosts)
        jumps = proxy_jumps(config, address, fallback_identities=target.identity_files)
        self.target = target

        self._link = Link(name, target, jumps,
                          KnownHosts(name, self._known_hosts, host_key_policy, on_host_key_pinned),
                          connect_timeout)
        self._transport = self._link.transport
        self._transport.set_keepalive(KEEPALIVE_S)
        extra = {"address": address, "hostname": target.hostname, "port": str(target.port),
                 "user": target.user, "known_hosts": self._known_hosts}
        if jumps:
            extra["proxy_jump"] = ",".join(hop.where for hop in jumps)
            extra["proxy_jump_host_keys"] = ",".join(self._link.jump_fingerprints)
        if become:
            extra["become"] = "sudo"
        self.info = TransportInfo(
            kind="ssh", target=name,
            host_key_fingerprint=fingerprint(self._transport.get_remote_server_key()),
            extra=extra)

    def open_ahead(self) -> None:
        """The agent's channel opened now, while the config is loaded again (an early opening's idle time): a
        session channel runs nothing until its exec, and its round trip is then off the agent's start."""
        with contextlib.suppress(TransportError):  # the agent opens its own then, and says why that fails
            channel = self._open_channel()
            with self._lock:
                self._ahead = channel

    def _pipe(self, argv: Sequence[str]) -> Pipe:
        """One exec channel on the shared connection (the one opened ahead, first), running argv."""
        with self._lock:
            chan, self._ahead = self._ahead, None
        if chan is None or chan.closed:
            chan = self._open_channel()
        try:
            return ExecPipe(chan, quote(argv), name=self.name, where=self.target.where,
                            timeout_s=self._connect_timeout, kill=self._kill_sessions)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            close_quietly(chan)
            raise TransportError(f"{self.name}: could not start the agent: {describe(exc)}") from None

    def _open_channel(self, timeout: float | None = None) -> paramiko.Channel:
        if self._closed:
            raise TransportError(f"{self.name}: transport is closed")
        if not self._transport.is_active():
            raise TransportError(f"{self.name}: SSH connection to {self.target.where} was lost")
        try:
            return self._transport.open_session(timeout=min(self._connect_timeout, timeout or self._connect_timeout))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(f"{self.name}: could not open a channel to {self.target.where}: "
                                 f"{describe(exc)}") from None

    def _kill_sessions(self) -> None:
        """KILL_SESSIONS, waited for (bounded); a connection already lost has nothing left to end there."""
        with contextlib.suppress(TransportError, paramiko.SSHException, OSError, EOFError):
            chan = self._open_channel()
            try:
                chan.settimeout(self._connect_timeout)
                chan.exec_command(quote(self._on_host(["sh", "-c", KILL_SESSIONS])))
                chan.recv(1)  # its end, when the kill is done
            finally:
                close_quietly(chan)

    def forward(self, remote_port: int, remote_host: str = "127.0.0.1") -> int:
        key = (remote_host, remote_port)
        with self._lock:
            if self._closed:
                raise TransportError(f"{self.name}: transport is closed")
            existing = self._forwards.get(key)
            if existing is None or existing.stopped:
                existing = Forward(self._transport, remote_host, remote_port, self._connect_timeout)
                self._forwards[key] = existing
            return existing.local_port

    def _close_link(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            forwards = list(self._forwards.values())
            self._forwards.clear()
        for fwd in forwards:
            fwd.close()
        self._link.close()
