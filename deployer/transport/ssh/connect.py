"""The authenticated SSH connection to a target, through its ProxyJump hops, within connect_timeout.

paramiko is used directly rather than through fabric's Connection: fabric auto-adds unknown
host keys, puts environment values on the command line and writes files in place.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any, TypeAlias, cast

from deployer.errors import ConnectError, HostKeyError
from deployer.transport.ssh.config import Endpoint
from deployer.transport.ssh.hostkeys import KnownHosts, fingerprint
from deployer.transport.ssh.paramiko_lean import paramiko
from deployer.transport.ssh.pipelined_auth import PipelinedAuthTransport

_Sock: TypeAlias = "socket.socket | paramiko.Channel | paramiko.ProxyCommand"


class Link:
    """One connection to target, tunnelled through each jump host in turn; its clients close together."""

    def __init__(self, name: str, target: Endpoint, jumps: list[Endpoint], known_hosts: KnownHosts,
                 timeout: float) -> None:
        self.name = name
        self._known_hosts = known_hosts
        self._timeout = timeout
        self._clients: list[paramiko.SSHClient] = []  # jump hosts first, the target last
        self.jump_fingerprints: list[str] = []
        try:
            sock: _Sock | None = None
            for hop in jumps:
                hop_transport = self._connect(hop, sock)
                self.jump_fingerprints.append(fingerprint(hop_transport.get_remote_server_key()))
                sock = self._open_direct(hop_transport, hop, target.hostname, target.port)
            self.transport = self._connect(target, sock)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        # Target first, then the jump hosts it was tunnelled through.
        while self._clients:
            # Closing must not mask the error that got us here.
            with contextlib.suppress(Exception):
                self._clients.pop().close()

    def _connect(self, ep: Endpoint, sock: _Sock | None) -> paramiko.Transport:
        """An authenticated connection to ep, over sock (a jump channel) or a new TCP socket."""
        timeout = self._timeout
        client = paramiko.SSHClient()
        self._clients.append(client)
        self._known_hosts.guard(client, ep)

        if sock is None:
            sock = self._open_socket(ep)
        # paramiko's timeouts are per phase (banner, kex, auth); the watchdog bounds their sum,
        # so a login that stalls anywhere still fails within connect_timeout.
        watchdog = _Watchdog(timeout, sock)
        try:
            client.connect(
                ep.key_name, port=ep.port, username=ep.user, sock=sock,
                # paramiko accepts a list of key files; the stub only admits one.
                key_filename=list(ep.identity_files) or None,  # type: ignore[arg-type]
                allow_agent=not ep.identities_only,
                look_for_keys=not ep.identity_files,
                timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
                channel_timeout=timeout, transport_factory=cast(Any, PipelinedAuthTransport))
        except HostKeyError:
            raise
        except paramiko.BadHostKeyException as exc:
            raise HostKeyError(self._known_hosts.changed_key_message(ep, exc.key, exc.expected_key)) from None
        except paramiko.AuthenticationException as exc:
            if watchdog.expired:
                raise self._timed_out(ep, "authentication") from None
            raise ConnectError(self._auth_failed_message(ep, exc)) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if watchdog.expired:
                raise self._timed_out(ep, "the SSH handshake or authentication") from None
            raise ConnectError(f"{self.name}: SSH handshake with {ep.where} failed: "
                               f"{describe(exc)}") from None
        finally:
            watchdog.cancel()
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectError(f"{self.name}: connection to {ep.where} closed right after login")
        return transport

    def _open_socket(self, ep: Endpoint) -> _Sock:
        if ep.proxy_command:
            try:
                proxy = paramiko.ProxyCommand(ep.proxy_command)
            except (OSError, paramiko.SSHException) as exc:
                raise ConnectError(f"{self.name}: ProxyCommand {ep.proxy_command!r} for {ep.where} "
                                   f"failed to start: {exc}") from None
            return proxy
        try:
            sock = socket.create_connection((ep.hostname, ep.port), timeout=self._timeout)
            # Small request/reply packets (channel opens, exec, exit status): without NODELAY
            # Nagle and delayed ACKs add tens of milliseconds to every command.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return _QuickAckSocket.adopt(sock)
        except socket.gaierror as exc:
            raise ConnectError(f"{self.name}: cannot resolve host name {ep.hostname!r} "
                               f"(from {ep.label!r}): {exc.strerror}") from None
        except ConnectionRefusedError:
            raise ConnectError(f"{self.name}: connection refused by {ep.hostname}:{ep.port}: "
                               "nothing listens there (is sshd running, is the port right?)") from None
        except TimeoutError:
            raise ConnectError(f"{self.name}: no answer from {ep.hostname}:{ep.port} within "
                               f"{self._timeout:g}s (host down, firewall, wrong address?)") from None
        except OSError as exc:
            raise ConnectError(f"{self.name}: cannot reach {ep.hostname}:{ep.port}: {describe(exc)}") from None

    def _open_direct(self, via: paramiko.Transport, hop: Endpoint, hostname: str,
                     port: int) -> paramiko.Channel:
        try:
            return via.open_channel(
                "direct-tcpip", (hostname, port), ("127.0.0.1", 0), timeout=self._timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectError(f"{self.name}: jump host {hop.where} could not reach "
                               f"{hostname}:{port}: {describe(exc)}") from None

    def _timed_out(self, ep: Endpoint, phase: str) -> ConnectError:
        return ConnectError(f"{self.name}: {phase} with {ep.where} did not complete within "
                            f"{self._timeout:g}s (the host's connect_timeout_s)")

    def _auth_failed_message(self, ep: Endpoint, exc: Exception) -> str:
        tried = [f"identity file {path}" for path in ep.identity_files]
        if not ep.identities_only:
            tried.append("ssh-agent keys")
        if not ep.identity_files:
            tried.append("~/.ssh/id_* keys")
        return (f"{self.name}: authentication as {ep.user!r} on {ep.hostname}:{ep.port} failed "
                f"({exc}); tried {', '.join(tried)}. Check the user name and that the public key "
                f"is in ~{ep.user}/.ssh/authorized_keys on the target.")


class _QuickAckSocket(socket.socket):
    """A TCP socket that acknowledges what it reads at once: TCP_QUICKACK after every read.

    sshd leaves Nagle on for a session without a pty, so a small packet it sends while an earlier one is
    unacknowledged waits for our ACK, which Linux delays up to 40 ms. On 127.0.0.1 the handshake took
    ~65 ms and the first channel open ~45 ms that way; acknowledged at once, ~20 ms and ~2 ms. The option
    does not stick (the kernel goes back to delayed ACKs), hence after every read."""

    @classmethod
    def adopt(cls, sock: socket.socket) -> socket.socket:
        if not hasattr(socket, "TCP_QUICKACK"):  # Linux only
            return sock
        timeout = sock.gettimeout()
        adopted = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        adopted.settimeout(timeout)
        return adopted

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        self.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        return data


class _Watchdog:
    """Closes the socket if the whole connect has not finished in time."""

    def __init__(self, timeout: float, sock: _Sock) -> None:
        self.fired = False
        self._deadline = time.monotonic() + timeout
        self._done = False
        self._lock = threading.Lock()
        self._sock = sock
        self._timer = threading.Timer(timeout, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
        # Whatever state it is in, it is unusable now.
        with contextlib.suppress(Exception):
            self._sock.close()

    @property
    def expired(self) -> bool:
        """Fired, or past the deadline: one of paramiko's own phase timeouts (each as long as the whole)
        may run out a moment before the timer does, and it is the same timeout."""
        return self.fired or time.monotonic() >= self._deadline

    def cancel(self) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()


def describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
