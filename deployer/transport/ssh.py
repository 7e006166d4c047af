"""A target reached over SSH: one authenticated paramiko connection, one exec channel for the agent.

The constructor connects eagerly, so an unreachable host, a refused host key or a failed login
surfaces at preflight, before any step has run. The agent (deployer/agent) then runs on one exec
channel of that connection and carries every command, upload and check; port forwards (for a
storm) are further channels. There are no reconnects: a lost connection is a TransportError
rather than a silent second handshake, and the agent exits when its channel closes.

paramiko is used directly rather than through fabric's Connection: fabric auto-adds unknown
host keys, puts environment values on the command line and writes files in place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from deployer.command import quote
from deployer.errors import ConfigError, ConnectError, HostKeyError, TransportError
from deployer.transport.base import Transport, TransportInfo
from deployer.transport.paramiko_lean import allow_match_exec, paramiko
from deployer.transport.pipes import ChannelPipe, Pipe

# paramiko reports every refused tunnel connection (a service still starting) on stderr through
# logging's last-resort handler; those outcomes reach callers as errors already.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

HostKeyPolicy = Literal["reject", "accept-new"]
HostKeyPinned = Callable[[str, str, str], None]
_Sock: TypeAlias = "socket.socket | paramiko.Channel | paramiko.ProxyCommand"

SSH_PORT = 22
KEEPALIVE_S = 30
CHUNK = 65536

_known_hosts_lock = threading.Lock()


def fingerprint(key: paramiko.PKey) -> str:
    """`<keytype> SHA256:<base64>`, as `ssh-keygen -l` shows it."""
    return f"{key.get_name()} {key.fingerprint}"


def host_entry(hostname: str, port: int) -> str:
    """The known_hosts name OpenSSH uses: bare for port 22, `[host]:port` otherwise."""
    return hostname if port == SSH_PORT else f"[{hostname}]:{port}"


@dataclass(frozen=True)
class _Endpoint:
    """One SSH hop with ~/.ssh/config applied and explicit values on top."""

    label: str  # what the user asked for, for messages
    hostname: str
    port: int
    user: str
    key_name: str  # HostKeyAlias, else hostname: what known_hosts is keyed on
    identity_files: tuple[str, ...]
    identities_only: bool
    proxy_command: str | None
    hash_known_hosts: bool

    @property
    def where(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"

    @property
    def entry(self) -> str:
        return host_entry(self.key_name, self.port)


class SSHTransport(Transport):
    """One host through a single SSH connection: the agent's exec channel, and port forwards."""

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
        self._policy: HostKeyPolicy = host_key_policy
        self._on_pinned = on_host_key_pinned
        self._lock = threading.Lock()
        self._forwards: dict[tuple[str, int], _Forward] = {}
        self._clients: list[paramiko.SSHClient] = []  # jump hosts first, the target last
        self._closed = False

        config = _load_ssh_config(ssh_config)
        if identity_file is not None and not os.path.isfile(os.path.expanduser(identity_file)):
            raise ConfigError(f"{name}: identity file {identity_file} does not exist")
        target = _resolve(config, address, port=port, user=user,
                          identity_files=(identity_file,) if identity_file else None)
        self._known_hosts = os.path.expanduser(
            known_hosts or _first(config.lookup(address).get("userknownhostsfile"))
            or "~/.ssh/known_hosts")
        jumps = _proxy_jumps(config, address, fallback_identities=target.identity_files)
        self.target = target

        fingerprints: list[str] = []
        try:
            sock: _Sock | None = None
            for hop in jumps:
                hop_transport = self._connect(hop, sock)
                fingerprints.append(fingerprint(hop_transport.get_remote_server_key()))
                sock = self._open_direct(hop_transport, hop, target.hostname, target.port)
            self._transport = self._connect(target, sock)
        except BaseException:
            self._close_clients()
            raise
        self._transport.set_keepalive(KEEPALIVE_S)
        extra = {"address": address, "hostname": target.hostname, "port": str(target.port),
                 "user": target.user, "known_hosts": self._known_hosts}
        if jumps:
            extra["proxy_jump"] = ",".join(hop.where for hop in jumps)
            extra["proxy_jump_host_keys"] = ",".join(fingerprints)
        if become:
            extra["become"] = "sudo"
        self.info = TransportInfo(
            kind="ssh", target=name,
            host_key_fingerprint=fingerprint(self._transport.get_remote_server_key()),
            extra=extra)

    # -- connecting -------------------------------------------------------------------------

    def _connect(self, ep: _Endpoint, sock: _Sock | None) -> paramiko.Transport:
        """An authenticated connection to ep, over sock (a jump channel) or a new TCP socket."""
        timeout = self._connect_timeout
        client = paramiko.SSHClient()
        self._clients.append(client)
        keys = client.get_host_keys()
        try:
            if os.path.exists(self._known_hosts):
                keys.load(self._known_hosts)
        except (OSError, paramiko.SSHException, paramiko.hostkeys.InvalidHostKey) as exc:
            raise ConfigError(f"{self.name}: cannot read known_hosts {self._known_hosts}: "
                              f"{type(exc).__name__}: {exc}; fix or remove the bad line") from exc
        client.set_missing_host_key_policy(
            _HostKeyGate(lambda entry, key: self._missing_host_key(ep, entry, key)))

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
                channel_timeout=timeout)
        except HostKeyError:
            raise
        except paramiko.BadHostKeyException as exc:
            raise HostKeyError(self._changed_key_message(ep, exc.key, exc.expected_key)) from None
        except paramiko.AuthenticationException as exc:
            if watchdog.expired:
                raise self._timed_out(ep, "authentication") from None
            raise ConnectError(self._auth_failed_message(ep, exc)) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if watchdog.expired:
                raise self._timed_out(ep, "the SSH handshake or authentication") from None
            raise ConnectError(f"{self.name}: SSH handshake with {ep.where} failed: "
                               f"{_describe(exc)}") from None
        finally:
            watchdog.cancel()
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectError(f"{self.name}: connection to {ep.where} closed right after login")
        return transport

    def _open_socket(self, ep: _Endpoint) -> _Sock:
        if ep.proxy_command:
            try:
                proxy = paramiko.ProxyCommand(ep.proxy_command)
            except (OSError, paramiko.SSHException) as exc:
                raise ConnectError(f"{self.name}: ProxyCommand {ep.proxy_command!r} for {ep.where} "
                                   f"failed to start: {exc}") from None
            return proxy
        try:
            sock = socket.create_connection((ep.hostname, ep.port), timeout=self._connect_timeout)
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
                               f"{self._connect_timeout:g}s (host down, firewall, wrong address?)") from None
        except OSError as exc:
            raise ConnectError(f"{self.name}: cannot reach {ep.hostname}:{ep.port}: {_describe(exc)}") from None

    def _open_direct(self, via: paramiko.Transport, hop: _Endpoint, hostname: str,
                     port: int) -> paramiko.Channel:
        try:
            return via.open_channel(
                "direct-tcpip", (hostname, port), ("127.0.0.1", 0), timeout=self._connect_timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectError(f"{self.name}: jump host {hop.where} could not reach "
                               f"{hostname}:{port}: {_describe(exc)}") from None

    def _timed_out(self, ep: _Endpoint, phase: str) -> ConnectError:
        return ConnectError(f"{self.name}: {phase} with {ep.where} did not complete within "
                            f"{self._connect_timeout:g}s (the host's connect_timeout_s)")

    def _auth_failed_message(self, ep: _Endpoint, exc: Exception) -> str:
        tried = [f"identity file {path}" for path in ep.identity_files]
        if not ep.identities_only:
            tried.append("ssh-agent keys")
        if not ep.identity_files:
            tried.append("~/.ssh/id_* keys")
        return (f"{self.name}: authentication as {ep.user!r} on {ep.hostname}:{ep.port} failed "
                f"({exc}); tried {', '.join(tried)}. Check the user name and that the public key "
                f"is in ~{ep.user}/.ssh/authorized_keys on the target.")

    def _changed_key_message(self, ep: _Endpoint, got: paramiko.PKey, expected: paramiko.PKey) -> str:
        return (
            f"{self.name}: HOST KEY CHANGED for {ep.entry}; refusing to connect "
            "(under every host_key_policy).\n"
            f"  known_hosts {self._known_hosts} pins: {fingerprint(expected)}\n"
            f"  the server presented:       {fingerprint(got)}\n"
            "  Either the host was reinstalled or someone is intercepting the connection. Only if\n"
            "  you have verified the new key out of band, remove the old entry with\n"
            f"    ssh-keygen -R {quote([ep.entry])} -f {quote([self._known_hosts])}\n"
            "  and connect once with --accept-new-host-key.")

    def _unknown_key_message(self, ep: _Endpoint, key: paramiko.PKey) -> str:
        return (
            f"{self.name}: host key of {ep.entry} is not in {self._known_hosts}; refusing to "
            "connect (host_key_policy: reject). Nothing was sent to it.\n"
            f"  The server presented: {fingerprint(key)}\n"
            "  Compare it out of band (on the host: ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub),\n"
            "  then accept it by setting `host_key_policy: accept-new` for this host in the\n"
            "  inventory, or by passing --accept-new-host-key.")

    def _missing_host_key(self, ep: _Endpoint, entry: str, key: paramiko.PKey) -> None:
        if self._policy != "accept-new":
            raise HostKeyError(self._unknown_key_message(ep, key))
        self._pin(ep, entry, key)

    def _pin(self, ep: _Endpoint, entry: str, key: paramiko.PKey) -> None:
        """Append key for entry to known_hosts (created 0600), then tell the caller."""
        name = paramiko.HostKeys.hash_host(entry) if ep.hash_known_hosts else entry
        line = f"{name} {key.get_name()} {key.get_base64()}\n"
        path = self._known_hosts
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

    # -- running commands -------------------------------------------------------------------

    def _pipe(self, argv: Sequence[str]) -> Pipe:
        """One exec channel on the shared connection, running argv: the agent's pipe."""
        chan = self._open_channel()
        try:
            self._exec_bounded(chan, quote(argv))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            _close_quietly(chan)
            raise TransportError(f"{self.name}: could not start the agent: {_describe(exc)}") from None
        return ChannelPipe(chan)

    def _open_channel(self, timeout: float | None = None) -> paramiko.Channel:
        if self._closed:
            raise TransportError(f"{self.name}: transport is closed")
        if not self._transport.is_active():
            raise TransportError(f"{self.name}: SSH connection to {self.target.where} was lost")
        try:
            return self._transport.open_session(timeout=min(self._connect_timeout, timeout or self._connect_timeout))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(f"{self.name}: could not open a channel to {self.target.where}: "
                                 f"{_describe(exc)}") from None

    def _exec_bounded(self, chan: paramiko.Channel, line: str) -> None:
        """exec_command waits for the server's reply without a timeout; a target that stopped
        answering (a partition, a frozen sshd) would hang the run. Past connect_timeout the
        connection is closed: it is unusable anyway, and every waiter then fails at once."""
        timer = threading.Timer(self._connect_timeout, self._transport.close)
        timer.daemon = True
        timer.start()
        try:
            chan.exec_command(line)
        finally:
            timer.cancel()
        if not self._transport.is_active():
            raise paramiko.SSHException(f"no answer from the target within {self._connect_timeout:g}s")

    def forward(self, remote_port: int, remote_host: str = "127.0.0.1") -> int:
        key = (remote_host, remote_port)
        with self._lock:
            if self._closed:
                raise TransportError(f"{self.name}: transport is closed")
            existing = self._forwards.get(key)
            if existing is None or existing.stopped:
                existing = _Forward(self._transport, remote_host, remote_port,
                                    self._connect_timeout)
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
        self._close_clients()

    def _close_clients(self) -> None:
        # Target first, then the jump hosts it was tunnelled through.
        while self._clients:
            # Closing must not mask the error that got us here.
            with contextlib.suppress(Exception):
                self._clients.pop().close()


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


class _HostKeyGate(paramiko.MissingHostKeyPolicy):
    """paramiko's missing-host-key hook: reject, or pin under accept-new. Never auto-add.

    paramiko calls it only for a host with no known key; a different key for a known host
    raises BadHostKeyException before this, under every policy."""

    def __init__(self, decide: Callable[[str, paramiko.PKey], None]) -> None:
        self._decide = decide

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        # hostname is already the known_hosts entry: `[host]:port` off port 22.
        self._decide(hostname, key)


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


class _Forward:
    """A 127.0.0.1 listener whose connections each become a direct-tcpip channel."""

    def __init__(self, transport: paramiko.Transport, remote_host: str, remote_port: int,
                 timeout: float) -> None:
        self._transport = transport
        self._remote = (remote_host, remote_port)
        self._timeout = timeout
        self._lock = threading.Lock()
        self._open: set[socket.socket | paramiko.Channel] = set()  # closed on stop
        self.stopped = False
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        # Polling as well as close()'s shutdown: shutdown wakes accept() on Linux, not everywhere.
        self._listener.settimeout(0.25)
        self.local_port: int = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept_loop, daemon=True,
                         name=f"forward-{self.local_port}").start()

    def _accept_loop(self) -> None:
        while not self.stopped:
            try:
                client, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                self.stopped = True  # a dead listener must not be handed out again by forward()
                break
            threading.Thread(target=self._serve, args=(client, peer), daemon=True).start()

    def _serve(self, client: socket.socket, peer: tuple[str, int]) -> None:
        client.settimeout(None)
        try:
            chan = self._transport.open_channel("direct-tcpip", self._remote, peer,
                                                timeout=self._timeout)
        except (paramiko.SSHException, OSError, EOFError):
            client.close()  # the target refused; the local client sees a closed connection
            return
        with self._lock:
            if self.stopped:
                _close_quietly(chan)
                client.close()
                return
            self._open.update((client, chan))
        done = threading.Semaphore(0)

        def abort() -> None:
            # One direction failed: end the other too instead of leaving it blocked in recv().
            _shutdown(client, socket.SHUT_RDWR)
            _close_quietly(chan)

        threading.Thread(target=self._pump, daemon=True,
                         args=(client.recv, chan.sendall, chan.shutdown_write, abort, done)).start()
        self._pump(chan.recv, client.sendall, lambda: _shutdown(client, socket.SHUT_WR), abort, done)
        done.acquire()
        done.acquire()
        with self._lock:
            self._open.discard(client)
            self._open.discard(chan)
        _close_quietly(chan)
        client.close()

    @staticmethod
    def _pump(recv: Callable[[int], bytes], send: Callable[[bytes], object],
              eof: Callable[[], object], abort: Callable[[], None], done: threading.Semaphore) -> None:
        """Copy one direction; pass a clean end-of-stream on as a half-close."""
        try:
            while data := recv(CHUNK):
                send(data)
            eof()
        except (OSError, EOFError, paramiko.SSHException):
            abort()
        finally:
            done.release()

    def close(self) -> None:
        with self._lock:
            self.stopped = True
            pending = list(self._open)
            self._open.clear()
        # shutdown, unlike close, stops listening at once and wakes threads blocked in
        # accept() or recv() on these sockets.
        _shutdown(self._listener, socket.SHUT_RDWR)
        self._listener.close()
        for item in pending:
            if isinstance(item, socket.socket):
                _shutdown(item, socket.SHUT_RDWR)
            _close_quietly(item)


def _close_quietly(item: socket.socket | paramiko.Channel) -> None:
    # A channel on a dead connection raises EOFError on close; it is closed all the same.
    with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
        item.close()


def _shutdown(sock: socket.socket, how: int) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(how)


# -- ~/.ssh/config ------------------------------------------------------------------------------

def _load_ssh_config(path: str | None) -> paramiko.SSHConfig:
    if path is None:
        default = os.path.expanduser("~/.ssh/config")
        if not os.path.isfile(default):
            return paramiko.SSHConfig()
        path = default
    path = os.path.expanduser(path)
    try:
        with open(path) as handle:  # as paramiko's from_path would, but read once for both uses
            text = handle.read()
        allow_match_exec(text)
        return paramiko.SSHConfig.from_text(text)
    except FileNotFoundError:
        raise ConfigError(f"ssh config {path} does not exist") from None
    except (OSError, ValueError, paramiko.SSHException) as exc:
        raise ConfigError(f"cannot parse ssh config {path}: {exc}") from None


def _resolve(config: paramiko.SSHConfig, address: str, *, port: int | None, user: str | None,
             identity_files: tuple[str, ...] | None) -> _Endpoint:
    """address through `Host` blocks; explicit (non-None) values win over the config."""
    found = config.lookup(address)
    hostname = str(found.get("hostname", address))
    if identity_files is None:
        # OpenSSH skips configured identity files that do not exist; so do we.
        configured: object = found.get("identityfile")  # a list at runtime, despite the stub
        paths = configured if isinstance(configured, list) else [configured] if configured else []
        identity_files = tuple(p for p in (os.path.expanduser(str(f)) for f in paths) if os.path.isfile(p))
    else:
        identity_files = tuple(os.path.expanduser(f) for f in identity_files)
    proxy_command = found.get("proxycommand")
    if proxy_command is not None and (found.get("proxyjump") or str(proxy_command).lower() == "none"):
        proxy_command = None
    return _Endpoint(
        label=address, hostname=hostname,
        port=port if port is not None else int(found.get("port", SSH_PORT)),
        user=user or str(found.get("user") or getpass.getuser()),
        key_name=str(found.get("hostkeyalias") or hostname),
        identity_files=identity_files,
        identities_only=str(found.get("identitiesonly", "no")).lower() == "yes",
        proxy_command=None if proxy_command is None else str(proxy_command),
        hash_known_hosts=str(found.get("hashknownhosts", "no")).lower() == "yes")


def _proxy_jumps(config: paramiko.SSHConfig, address: str, *,
                 fallback_identities: tuple[str, ...]) -> list[_Endpoint]:
    """The ProxyJump hops for address, each resolved through the config itself.

    A hop's own ProxyJump is not followed (one level of `Host` lookups, as most bastion
    setups need). A hop with no IdentityFile of its own uses the target's key."""
    value = config.lookup(address).get("proxyjump")
    if not value or str(value).lower() == "none":
        return []
    hops: list[_Endpoint] = []
    for spec in str(value).split(","):
        user, host, port = _parse_jump(spec.strip())
        hop = _resolve(config, host, port=port, user=user, identity_files=None)
        if not hop.identity_files and fallback_identities:
            hop = dataclasses.replace(hop, identity_files=fallback_identities)
        hops.append(hop)
    return hops


def _parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:port]`, `[user@][v6addr]:port` or `ssh://[user@]host[:port]`."""
    if spec.startswith("ssh://"):
        spec = spec[len("ssh://"):]
    user: str | None = None
    if "@" in spec:
        user, spec = spec.rsplit("@", 1)
    port_text = ""
    if spec.startswith("["):
        host, _, rest = spec[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif spec.count(":") == 1:
        host, port_text = spec.split(":")
    else:
        host = spec
    if port_text and not port_text.isdigit():
        raise ConfigError(f"cannot parse the ProxyJump port in {spec!r}")
    port = int(port_text) if port_text else None
    if not host:
        raise ConfigError(f"cannot parse ProxyJump host {spec!r}")
    return user, host, port


def _first(value: object) -> str | None:
    """First path of a (possibly multi-valued) config option such as UserKnownHostsFile."""
    if not value:
        return None
    text = value[0] if isinstance(value, list) else value
    return str(text).split()[0]


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
