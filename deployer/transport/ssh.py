"""A target reached over SSH: one authenticated paramiko connection, shared by every channel.

The constructor connects eagerly, so an unreachable host, a refused host key or a failed
login surfaces at preflight, before any step has run. After that, every run/put/get/forward
is a new channel on that one connection: there are no reconnects, and a lost connection is
a TransportError rather than a silent second handshake.

paramiko is used directly rather than through fabric's Connection: fabric auto-adds unknown
host keys, and its runner cannot kill a remote process group on timeout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import logging
import os
import posixpath
import shlex
import socket
import stat
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

import paramiko

from deployer.command import quote, shell_line
from deployer.errors import ConfigError, ConnectError, HostKeyError, TransportError
from deployer.transport.base import (
    CAPTURE_BYTES,
    DEFAULT_TIMEOUT_S,
    ExecResult,
    PutResult,
    Stream,
    Transport,
    TransportInfo,
    sha256_hex,
)

# paramiko reports every refused tunnel connection (a service still starting) on stderr through
# logging's last-resort handler; those outcomes reach callers as errors already.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

HostKeyPolicy = Literal["reject", "accept-new"]
HostKeyPinned = Callable[[str, str, str], None]
_Sock: TypeAlias = "socket.socket | paramiko.Channel | paramiko.ProxyCommand"

SSH_PORT = 22
# SFTP calls and helper commands have no caller-supplied timeout; this bounds how long one may
# sit without progress (SFTP) or in total (helper commands) before it counts as a lost target.
IO_TIMEOUT_S = 60.0
KEEPALIVE_S = 30
CHUNK = 65536
# After a kill, how long to wait for the channel to report the death and flush its output.
KILL_GRACE_S = 3.0
# Exit code of the become-mode `get` script when the file is absent (EX_NOINPUT).
ABSENT_EXIT = 66

# Prints its own PID, which is its process group id because it runs under `setsid`, then
# becomes the real command line ($1). The PID is the first line of stdout; run() strips it.
_REPORT_PGID = 'printf "%s\\n" "$$"; exec sh -c "$1"'
# setsid runs as a child of this shell, so it is not a group leader and need not fork: it
# becomes the new group in place, and the shell's wait keeps the exit status (128+n when
# signalled). `exit $?` stops sh from exec'ing setsid, which would make it fork after all.
_OUTER = "if command -v setsid >/dev/null 2>&1; then setsid {inner}; exit $?; fi; exec {inner}"
# Without setsid the reported PID may not lead a group; then at least the command dies.
# `-s KILL --` is the spelling every kill builtin accepts (dash rejects `-KILL --`).
_KILL = 'kill -s KILL -- "-$1" 2>/dev/null || kill -s KILL -- "$1"'
# Reads `K='v'` / `export K` lines from stdin, then becomes argv with stdin at its end.
_ENV_FROM_STDIN = '. /dev/stdin; exec "$@"'
# `sync FILE` flushes just that file on coreutils >= 8.24; older ones ignore the operand.
# Hashing stdin keeps the file name out of the output (sha256sum escapes odd names).
_SYNC_AND_HASH = 'sync -- "$1" 2>/dev/null || sync; exec sha256sum < "$1"'
_BECOME_WRITE = (
    'set -e; dir=$1; dest=$2; tmp=$3; mode=$4; mkdir -p -- "$dir"; '
    'if [ -z "$mode" ]; then if [ -e "$dest" ]; then mode=$(stat -c %a -- "$dest"); else mode=644; fi; fi; '
    '(set -C; umask 077; cat > "$tmp"); '  # noclobber: the temp name is ours alone
    'chmod "$mode" -- "$tmp"; if [ -e "$dest" ]; then chown --reference="$dest" -- "$tmp" 2>/dev/null || :; fi; '
    'sync -- "$tmp" 2>/dev/null || sync; exec sha256sum < "$tmp"'
)
_BECOME_GET = f'[ -e "$1" ] || exit {ABSENT_EXIT}; exec cat -- "$1"'

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
    """Runs commands and moves files on one host through a single SSH connection."""

    def __init__(self, *, name: str, address: str, port: int | None = None,
                 user: str | None = None, identity_file: str | None = None,
                 known_hosts: str | None = None, host_key_policy: HostKeyPolicy = "reject",
                 ssh_config: str | None = None, connect_timeout: float = 10.0,
                 become: bool = False, on_host_key_pinned: HostKeyPinned | None = None) -> None:
        if host_key_policy not in ("reject", "accept-new"):
            raise ConfigError(f"{name}: host_key_policy must be 'reject' or 'accept-new', "
                              f"not {host_key_policy!r}")
        self.name = name
        self._become = become
        self._connect_timeout = connect_timeout
        self._policy: HostKeyPolicy = host_key_policy
        self._on_pinned = on_host_key_pinned
        self._lock = threading.Lock()
        self._sftp_lock = threading.RLock()
        self._sftp: paramiko.SFTPClient | None = None
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
            if watchdog.fired:
                raise self._timed_out(ep, "authentication") from None
            raise ConnectError(self._auth_failed_message(ep, exc)) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if watchdog.fired:
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
            return sock
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
                            f"connect_timeout={self._connect_timeout:g}s")

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

    def run(self, argv: Sequence[str], *, cwd: str | None = None,
            env: Mapping[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT_S,
            stdin: bytes | None = None, capture: int | None = CAPTURE_BYTES) -> ExecResult:
        argv_t = tuple(argv)
        started = time.monotonic()
        deadline = started + timeout
        remote: tuple[str, ...] = argv_t
        if env and stdin is None:
            # Values travel on stdin, not in a command line that `ps` shows every user of the target.
            stdin = "".join(f"{k}={shlex.quote(v)}\nexport {k}\n" for k, v in env.items()).encode()
            remote, env = ("sh", "-c", _ENV_FROM_STDIN, "deployer-env", *argv_t), None
        inner = quote(["sh", "-c", _REPORT_PGID, "deployer", self._command_line(remote, cwd, env)])
        chan = self._open_channel()
        try:
            self._exec_bounded(chan, quote(["sh", "-c", _OUTER.format(inner=inner)]))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            _close_quietly(chan)
            raise TransportError(f"{self.name}: could not start {quote(argv_t)}: {_describe(exc)}") from None
        job = _Job(chan, stdin, capture=capture)
        try:
            finished = job.wait(deadline)
        except BaseException:
            # Interrupted (^C): do not leave the command running on the target.
            self._kill(job)
            _close_quietly(chan)
            raise
        if not finished:
            self._kill(job)
            job.wait(time.monotonic() + KILL_GRACE_S)
            _close_quietly(chan)
            return ExecResult(argv_t, None, job.out.captured(), job.err.captured(),
                              time.monotonic() - started, timed_out=True)
        _close_quietly(chan)
        if job.lost:
            raise TransportError(f"{self.name}: connection lost while running {quote(argv_t)}")
        return ExecResult(argv_t, job.exit_code, job.out.captured(), job.err.captured(),
                          time.monotonic() - started)

    def _command_line(self, argv: Sequence[str], cwd: str | None,
                      env: Mapping[str, str] | None) -> str:
        line = shell_line(argv, cwd=cwd, env=env)
        if self._become:
            # cd and env inside sudo: the directory may be root-only, and sudo resets the env.
            return quote(["sudo", "-n", "--", "sh", "-c", line])
        return line

    def _kill(self, job: _Job) -> None:
        """SIGKILL the command's whole process group on the target, over a fresh channel."""
        pgid = job.pgid(wait=1.0)
        if pgid is None:
            return  # never started; closing the channel is all that is left to do
        argv = ["sh", "-c", _KILL, "deployer-kill", str(pgid)]
        if self._become:
            argv = ["sudo", "-n", "--", *argv]
        # On failure the caller still reports the timeout, and closes the channel.
        with contextlib.suppress(TransportError):
            self._exec_plain(quote(argv), self._connect_timeout)

    def _exec_plain(self, line: str, timeout: float) -> tuple[int | None, bytes, bytes]:
        """Run a helper line without the process-group wrapper (kill must not need killing)."""
        chan = self._open_channel()
        try:
            self._exec_bounded(chan, line)
            job = _Job(chan, None, header=False, capture=CAPTURE_BYTES)
            done = job.wait(time.monotonic() + timeout)
            return job.exit_code if done else None, job.out.captured().kept, job.err.captured().kept
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(f"{self.name}: helper command failed: {_describe(exc)}") from None
        finally:
            _close_quietly(chan)

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

    # -- files ------------------------------------------------------------------------------

    def put(self, data: bytes, dest: str, *, mode: int | None = None,
            timeout: float = DEFAULT_TIMEOUT_S) -> PutResult:
        expected = sha256_hex(data)
        directory = posixpath.dirname(dest) or "."
        # Named after dest for whoever finds a leftover, but short enough for NAME_MAX (255).
        stem = posixpath.basename(dest)[:100]
        tmp = posixpath.join(directory, f".{stem}.deployer-{uuid.uuid4().hex[:12]}.tmp")
        if self._become:
            self._put_become(data, dest, directory, tmp, mode, expected, timeout)
        else:
            self._put_sftp(data, dest, directory, tmp, mode, expected, timeout)
        return PutResult(dest=dest, sha256=expected, size=len(data))

    def _put_sftp(self, data: bytes, dest: str, directory: str, tmp: str, mode: int | None,
                  expected: str, timeout: float) -> None:
        with self._sftp_lock:
            sftp = self._sftp_client(timeout)
            deadline = _SftpDeadline(sftp, timeout)
            try:
                try:
                    self._makedirs(sftp, directory)
                    try:
                        current = sftp.stat(dest)
                    except FileNotFoundError:
                        current = None
                    if mode is None:
                        mode = stat.S_IMODE(current.st_mode or 0o644) if current is not None else 0o644
                except (OSError, paramiko.SSHException, EOFError) as exc:
                    self._after_sftp_error(exc)
                    raise TransportError(f"{self.name}: cannot prepare upload of {dest}: "
                                         f"{deadline.describe(exc)}") from None
                try:
                    # 'x' is O_EXCL; 0600 until the bytes are verified, whatever the final mode.
                    with sftp.open(tmp, "wbx") as handle:
                        handle.chmod(0o600)
                        handle.set_pipelined(True)
                        handle.write(data)
                    sftp.chmod(tmp, mode)
                    if current is not None and current.st_uid is not None and current.st_gid is not None:
                        # Keep the file's owner (a service user's file must not become root's);
                        # only root may give a file away, so a refusal leaves it ours as before.
                        with contextlib.suppress(OSError):
                            sftp.chown(tmp, current.st_uid, current.st_gid)
                    written = self._remote_sha256(sftp, tmp, deadline.left())
                    if written != expected:
                        raise TransportError(f"{self.name}: upload of {dest} did not verify: "
                                             f"sha256 {written} on the target != {expected}")
                    self._rename(sftp, tmp, dest, deadline.left())
                except BaseException as exc:
                    self._discard(sftp if not self._after_sftp_error(exc) else None, tmp)
                    if isinstance(exc, (OSError, paramiko.SSHException, EOFError)):
                        raise TransportError(f"{self.name}: upload of {dest} failed, old file left "
                                             f"untouched: {deadline.describe(exc)}") from None
                    raise
            finally:
                deadline.cancel()

    def _remote_sha256(self, sftp: paramiko.SFTPClient, path: str, timeout: float) -> str:
        code, out, _ = self._exec_plain(
            quote(["sh", "-c", _SYNC_AND_HASH, "deployer-put", path]), timeout)
        digest = out.split(b" ", 1)[0].decode("ascii", "replace")
        if code == 0 and len(digest) == 64:
            return digest
        # No sha256sum on the target: hash what SFTP reads back instead.
        with sftp.open(path, "rb") as handle:
            handle.prefetch()
            return sha256_hex(bytes(handle.read()))

    def _rename(self, sftp: paramiko.SFTPClient, tmp: str, dest: str, timeout: float) -> None:
        try:
            sftp.posix_rename(tmp, dest)
        except OSError as exc:
            if "extension" not in str(exc).lower() and "unsupported" not in str(exc).lower():
                raise
            # A server without posix-rename@openssh.com: rename(2) via mv, still atomic.
            code, _, err = self._exec_plain(quote(["mv", "-f", "-T", "--", tmp, dest]), timeout)
            if code != 0:
                raise OSError(f"mv {tmp} {dest} failed: {err.decode(errors='replace').strip()}") from exc

    def _discard(self, sftp: paramiko.SFTPClient | None, tmp: str) -> None:
        """Remove the temp file: over SFTP if that session is healthy, else with rm."""
        if sftp is not None:
            try:
                sftp.remove(tmp)
                return
            except (OSError, paramiko.SSHException, EOFError):
                pass
        with contextlib.suppress(TransportError):
            self._exec_plain(quote(["rm", "-f", "--", tmp]), self._connect_timeout)

    def _makedirs(self, sftp: paramiko.SFTPClient, directory: str) -> None:
        missing: list[str] = []
        path = directory
        while path not in ("", "/", "."):
            try:
                if not stat.S_ISDIR(sftp.stat(path).st_mode or 0):
                    raise NotADirectoryError(f"{path} exists and is not a directory")
                break
            except FileNotFoundError:
                missing.append(path)
                path = posixpath.dirname(path)
        for path in reversed(missing):
            try:
                sftp.mkdir(path, 0o755)
            except OSError:
                # Created concurrently is fine; anything else shows up at the upload.
                if not stat.S_ISDIR(sftp.stat(path).st_mode or 0):
                    raise

    def _put_become(self, data: bytes, dest: str, directory: str, tmp: str, mode: int | None,
                    expected: str, timeout: float) -> None:
        mode_arg = "" if mode is None else format(mode, "o")
        end = time.monotonic() + timeout
        result = self.run(["sh", "-c", _BECOME_WRITE, "deployer-put", directory, dest, tmp, mode_arg],
                          stdin=data, timeout=timeout)
        try:
            written = result.out.split(" ", 1)[0]
            if not result.ok:
                raise TransportError(f"{self.name}: upload of {dest} failed "
                                     f"({result.describe_exit()}): {result.err.strip()}")
            if written != expected:
                raise TransportError(f"{self.name}: upload of {dest} did not verify: "
                                     f"sha256 {written} on the target != {expected}")
            moved = self.run(["mv", "-f", "-T", "--", tmp, dest], timeout=max(end - time.monotonic(), 1.0))
            if not moved.ok:
                raise TransportError(f"{self.name}: could not move the upload into {dest}: "
                                     f"{moved.err.strip()}")
        except BaseException:
            # Cleanup must not mask the failure being reported.
            with contextlib.suppress(TransportError):
                self.run(["rm", "-f", "--", tmp], timeout=IO_TIMEOUT_S)
            raise

    def get(self, path: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> bytes | None:
        if self._become:
            result = self.run(["sh", "-c", _BECOME_GET, "deployer-get", path], timeout=timeout, capture=None)
            if result.exit_code == ABSENT_EXIT:
                return None
            if not result.ok:
                raise TransportError(f"{self.name}: cannot read {path} ({result.describe_exit()}): "
                                     f"{result.err.strip()}")
            return result.stdout
        with self._sftp_lock:
            sftp = self._sftp_client(timeout)
            deadline = _SftpDeadline(sftp, timeout)
            try:
                with sftp.open(path, "rb") as handle:
                    handle.prefetch()
                    return bytes(handle.read())
            except FileNotFoundError:
                return None
            except BaseException as exc:
                self._after_sftp_error(exc)
                if isinstance(exc, (OSError, paramiko.SSHException, EOFError)):
                    raise TransportError(f"{self.name}: cannot read {path}: {deadline.describe(exc)}") from None
                raise
            finally:
                deadline.cancel()

    def _sftp_client(self, timeout: float) -> paramiko.SFTPClient:
        """The one SFTP session, opened on first use on the shared connection (within timeout)."""
        if self._sftp is None:
            chan = self._open_channel(timeout)
            try:
                chan.settimeout(min(self._connect_timeout, timeout))
                chan.invoke_subsystem("sftp")
                sftp = paramiko.SFTPClient(chan)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                _close_quietly(chan)
                raise TransportError(f"{self.name}: SFTP is not available on {self.target.where}: "
                                     f"{_describe(exc)}") from None
            chan.settimeout(IO_TIMEOUT_S)
            self._sftp = sftp
        return self._sftp

    def _after_sftp_error(self, exc: BaseException) -> bool:
        """Drop the SFTP session unless exc was a plain status reply from the server.

        After a timeout, a broken channel or an interrupt the stream may be mid-reply, and
        the next request would read the wrong answer; a fresh channel is the safe state."""
        channel = self._sftp.get_channel() if self._sftp is not None else None
        alive = channel is not None and not channel.closed  # "Socket is closed" is an OSError too
        server_said_no = alive and isinstance(exc, (OSError, TransportError)) and not isinstance(exc, TimeoutError)
        if not server_said_no:
            self._drop_sftp()
        return not server_said_no

    def _drop_sftp(self) -> None:
        sftp, self._sftp = self._sftp, None
        if sftp is not None:
            with contextlib.suppress(Exception):
                sftp.close()

    # -- forwarding and lifetime ------------------------------------------------------------

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

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            forwards = list(self._forwards.values())
            self._forwards.clear()
        for fwd in forwards:
            fwd.close()
        with self._sftp_lock:
            self._drop_sftp()
        self._close_clients()

    def _close_clients(self) -> None:
        # Target first, then the jump hosts it was tunnelled through.
        while self._clients:
            # Closing must not mask the error that got us here.
            with contextlib.suppress(Exception):
                self._clients.pop().close()


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

    def cancel(self) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()


class _SftpDeadline:
    """Bounds one SFTP operation as a whole: at the caller's timeout it closes the SFTP channel,
    which fails every call blocked on it (a write waiting for window space on a frozen link, a
    read waiting for a reply) at once; the session is then dropped and reopened on next use."""

    def __init__(self, sftp: paramiko.SFTPClient, timeout: float) -> None:
        self.timeout = timeout
        self.end = time.monotonic() + timeout
        chan = sftp.get_channel()
        assert chan is not None, "an open SFTP client has its channel"
        self._watchdog = _Watchdog(timeout, chan)

    def left(self) -> float:
        return max(self.end - time.monotonic(), 0.1)

    def describe(self, exc: BaseException) -> str:
        if self._watchdog.fired:
            return f"did not finish within {self.timeout:g}s"
        return _describe(exc)

    def cancel(self) -> None:
        self._watchdog.cancel()


class _Job:
    """One exec channel: stdin fed, stdout and stderr drained concurrently by threads.

    Concurrent draining matters: a command that fills its stderr pipe while we only read
    stdout would block forever (and so would we)."""

    def __init__(self, chan: paramiko.Channel, stdin: bytes | None, *, header: bool = True,
                 capture: int | None) -> None:
        self._chan = chan
        self.out = Stream(capture)
        self.err = Stream(capture)
        self._header = bytearray() if header else None
        self._pgid: int | None = None
        self._pgid_seen = threading.Event()
        if not header:
            self._pgid_seen.set()
        self._readers = [
            threading.Thread(target=self._drain_stdout, daemon=True),
            threading.Thread(target=self._drain, args=(chan.recv_stderr, self.err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        if stdin:
            threading.Thread(target=self._feed, args=(stdin,), daemon=True).start()
        else:
            # EOF now, so a command that prompts gets end-of-input instead of hanging.
            chan.shutdown_write()

    def _feed(self, data: bytes) -> None:
        try:
            self._chan.sendall(data)
            self._chan.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the command exited without reading it all; its exit status tells the story

    def _drain(self, recv: Callable[[int], bytes], sink: Stream) -> None:
        try:
            while data := recv(CHUNK):
                sink.feed(data)
        except (OSError, EOFError, paramiko.SSHException):
            pass

    def _drain_stdout(self) -> None:
        try:
            while data := self._chan.recv(CHUNK):
                if self._header is None:
                    self.out.feed(data)
                    continue
                self._header += data
                newline = self._header.find(b"\n")
                if newline < 0 and len(self._header) < 32:
                    continue
                first, rest = bytes(self._header[:newline]), bytes(self._header[newline + 1:])
                if newline >= 0 and first.isdigit():
                    self._pgid = int(first)
                    self.out.feed(rest)
                else:
                    # The wrapper did not run (no `sh`?): everything is the command's output.
                    self.out.feed(bytes(self._header))
                self._header = None
                self._pgid_seen.set()
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            if self._header:
                self.out.feed(bytes(self._header))
            self._header = None
            self._pgid_seen.set()

    def wait(self, deadline: float) -> bool:
        """True when the command finished (output drained, exit status in) before deadline."""
        for reader in self._readers:
            reader.join(max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                return False
        return self._chan.status_event.wait(max(0.0, deadline - time.monotonic()))

    def pgid(self, wait: float) -> int | None:
        self._pgid_seen.wait(wait)
        return self._pgid

    @property
    def lost(self) -> bool:
        """The channel ended without an exit status: the connection dropped mid-command."""
        transport = self._chan.get_transport()
        return self._chan.exit_status == -1 and (transport is None or not transport.is_active())

    @property
    def exit_code(self) -> int:
        return self._chan.exit_status


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
        return paramiko.SSHConfig.from_path(path)
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
