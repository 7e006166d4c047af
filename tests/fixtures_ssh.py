"""A throwaway OpenSSH server on 127.0.0.1 for integration tests (a pytest plugin module).

`sshd` (session scope) starts one key-only sshd with its own config, host key, client key and
known_hosts; `ssh_transport` (function scope) is a connected SSHTransport to it.

Locally a missing or broken sshd skips the tests that need it; with CI=true it fails them,
because a CI run that silently skipped every SSH test would prove nothing.
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import pytest
from ports import free_port

from deployer.transport.ssh.transport import SSHTransport

START_DEADLINE_S = 10.0
SFTP_SERVER_CANDIDATES = (
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/libexec/sftp-server",
    "/usr/lib/ssh/sftp-server",
)
# sshd hands sessions a fixed PATH; the fake sudo directory goes first so become=True
# can be exercised on a box without sudo (we are root, so a pass-through is what sudo would do).
SESSION_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FAKE_SUDO = """#!/bin/sh
# Test stand-in for sudo: records the call, insists on the flags deployer uses, then runs argv.
printf '%s %s %s\\n' "$1" "$2" "$3" >> "$(dirname "$0")/sudo.log"
[ "$1" = "-n" ] && [ "$2" = "--" ] || { echo "fake sudo: expected -n --" >&2; exit 1; }
shift 2
exec "$@"
"""


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"sshd fixture unavailable on CI (never skipped there): {reason}", pytrace=False)
    pytest.skip(f"sshd fixture unavailable: {reason}")


def _keygen(path: Path, comment: str) -> str:
    """A fresh ed25519 key pair at path; returns the public key line without its comment."""
    for stale in (path, path.with_name(path.name + ".pub")):
        stale.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True, timeout=30)
    keytype, blob = path.with_name(path.name + ".pub").read_text().split()[:2]
    return f"{keytype} {blob}"


def fingerprint_of(pubkey_line: str) -> str:
    """`<keytype> SHA256:<base64>`, the format SSHTransport reports and ssh-keygen -l prints."""
    keytype, blob = pubkey_line.split()[:2]
    digest = hashlib.sha256(base64.b64decode(blob)).digest()
    return f"{keytype} SHA256:{base64.b64encode(digest).decode().rstrip('=')}"


@dataclass
class SSHD:
    host: str
    port: int
    user: str
    client_key: str  # private key path (public half at client_key + ".pub")
    host_key: str  # private host key path
    host_pubkey_line: str  # "ssh-ed25519 AAAA..."
    known_hosts: str  # pins the current host key as [host]:port
    workdir: str  # scratch space owned by the fixture
    config_path: str
    fake_sudo_log: str  # every call of the test sudo on the target, one line each
    log_path: str  # sshd's own stderr
    sftp_server: str
    # A command prefix for sshd (`ip netns exec NAME`): everything sshd runs lives in that namespace.
    wrap: tuple[str, ...] = ()
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    # (pid, start time) of every process sshd spawned: connection handlers and the commands
    # they ran. They live in sessions of their own, so killing sshd's group misses them.
    _spawned: set[tuple[int, int]] = field(default_factory=set, repr=False)

    @property
    def host_key_entry(self) -> str:
        return f"[{self.host}]:{self.port}"

    @property
    def known_hosts_line(self) -> str:
        return f"{self.host_key_entry} {self.host_pubkey_line}\n"

    @property
    def host_fingerprint(self) -> str:
        return fingerprint_of(self.host_pubkey_line)

    def write_known_hosts(self, path: str | os.PathLike[str]) -> str:
        """Write a known_hosts file at path that pins the current host key; returns the path."""
        Path(path).write_text(self.known_hosts_line)
        os.chmod(path, 0o600)
        return os.fspath(path)

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")

    def sudo_calls(self) -> list[str]:
        """Every call of the test sudo on the target so far, its arguments one line each (none before the first)."""
        path = Path(self.fake_sudo_log)
        return path.read_text().splitlines() if path.exists() else []

    def session_pids(self) -> list[int]:
        """What runs under this sshd now: its sessions and all they started."""
        return [] if self._proc is None else sorted(pid for pid, _ in _descendants(self._proc.pid))

    def regenerate_host_key(self) -> str:
        """Restart sshd on the same port with a new host key; returns the new public key line.

        The fixture's own known_hosts is re-pinned to the new key so later tests keep working;
        copies a test made earlier still hold the old key, which is the point."""
        self.stop()
        self.host_pubkey_line = _keygen(Path(self.host_key), "deployer-test-host")
        self.write_known_hosts(self.known_hosts)
        self.start()
        return self.host_pubkey_line

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [*self.wrap, shutil.which("sshd") or "/usr/sbin/sshd", "-D", "-e", "-f", self.config_path],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        self._wait_ready()

    def stop(self) -> None:
        """Stop the listener only: open sessions may outlive a host key rotation, as they
        would on a real server. They are remembered and killed at teardown."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        self._spawned.update(_descendants(proc.pid))
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def kill_all(self) -> None:
        # Sessions first, while the listener is alive to reap its children.
        if self._proc is not None:
            self._spawned.update(_descendants(self._proc.pid))
        for pid, started in self._spawned:
            # The start time guards against a recycled pid belonging to someone else.
            if _start_time(pid) == started:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        self._spawned.clear()
        self.stop()
        self._spawned.clear()

    def _wait_ready(self) -> None:
        """Poll until the port answers with an SSH banner (not merely accepts), or give up."""
        assert self._proc is not None
        deadline = time.monotonic() + START_DEADLINE_S
        last_error = "no attempt"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {self._proc.returncode}:\n{self.log()[-2000:]}")
            try:
                with socket.create_connection((self.host, self.port), timeout=1.0) as sock:
                    if sock.recv(64).startswith(b"SSH-"):
                        return
                    last_error = "no SSH banner"
            except OSError as exc:
                last_error = str(exc)
            time.sleep(0.05)
        raise RuntimeError(f"sshd did not answer on {self.host}:{self.port} within "
                           f"{START_DEADLINE_S}s ({last_error}):\n{self.log()[-2000:]}")


def _proc_stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    # Fields after the parenthesised command name, which may itself contain spaces.
    return text.rsplit(")", 1)[1].split()


def _start_time(pid: int) -> int | None:
    fields = _proc_stat(pid)
    return int(fields[19]) if fields else None


def _descendants(root: int) -> set[tuple[int, int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _proc_stat(int(entry))):
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: set[tuple[int, int]] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            started = _start_time(child)
            if started is not None:
                found.add((child, started))
                stack.append(child)
    return found


def _sshd_config(*, port: int, host_key: Path, authorized_keys: Path, sftp_server: str,
                 fakebin: Path, address: str, log_level: str) -> str:
    return "\n".join([
        f"Port {port}",
        f"ListenAddress {address}",
        "AddressFamily inet",
        f"HostKey {host_key}",
        "PidFile none",
        f"AuthorizedKeysFile {authorized_keys}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "PermitRootLogin prohibit-password",
        "StrictModes no",
        "AllowTcpForwarding yes",
        "MaxSessions 64",
        "MaxStartups 64:30:128",
        "LoginGraceTime 30",
        "PrintMotd no",
        f"LogLevel {log_level}",
        # A HOME of its own: bash run by sshd reads ~/.bashrc even for `ssh host cmd`, and a
        # developer's (pyenv init, conda...) costs ~0.2 s per command and varies by machine.
        f"SetEnv PATH={fakebin}:{SESSION_PATH} HOME={fakebin.parent / 'home'}",
        f"Subsystem sftp {sftp_server}",
        "",
    ])


def _find_sftp_server() -> str:
    for candidate in SFTP_SERVER_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    return "internal-sftp"  # built into every OpenSSH sshd


class SshdUnavailable(Exception):
    """sshd cannot be started here; the reason says why."""


@contextlib.contextmanager
def running_sshd(address: str = "127.0.0.1", wrap: tuple[str, ...] = (), log_level: str = "VERBOSE") -> Iterator[SSHD]:
    """A running sshd on address:<random port>, killed on exit (tests and bench/ use it).

    wrap prefixes sshd's command line: `ip netns exec NAME` puts it (and all it runs) in a namespace. log_level
    DEBUG1 logs each channel a client opens (VERBOSE, each login and session)."""
    if shutil.which("sshd") is None and not os.access("/usr/sbin/sshd", os.X_OK):
        _raise_unavailable("no sshd binary (install openssh-server)")
    if shutil.which("ssh-keygen") is None:
        _raise_unavailable("no ssh-keygen binary (install openssh-client)")
    try:
        # Privilege separation directory; sshd refuses to start without it.
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    except OSError as exc:
        _raise_unavailable(f"cannot create /run/sshd: {exc}")

    workdir = Path(tempfile.mkdtemp(prefix="deployer-sshd-"))
    try:
        host_key = workdir / "ssh_host_ed25519_key"
        client_key = workdir / "client_ed25519"
        host_pub = _keygen(host_key, "deployer-test-host")
        client_pub = _keygen(client_key, "deployer-test-client")
        authorized_keys = workdir / "authorized_keys"
        authorized_keys.write_text(client_pub + " deployer-test-client\n")
        os.chmod(authorized_keys, 0o600)
        fakebin = workdir / "fakebin"
        fakebin.mkdir()
        (workdir / "home").mkdir()
        (fakebin / "sudo").write_text(FAKE_SUDO)
        os.chmod(fakebin / "sudo", 0o755)
        sftp_server = _find_sftp_server()
    except (OSError, subprocess.SubprocessError) as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        _raise_unavailable(f"could not prepare keys: {exc}")

    server: SSHD | None = None
    errors: list[str] = []
    # The free port is only probably free by the time sshd binds it: retry a few times.
    for _attempt in range(3):
        port = free_port()
        config_path = workdir / "sshd_config"
        config_path.write_text(_sshd_config(port=port, host_key=host_key,
                                            authorized_keys=authorized_keys,
                                            sftp_server=sftp_server, fakebin=fakebin, address=address,
                                            log_level=log_level))
        candidate = SSHD(host=address, port=port, wrap=wrap, user=getpass.getuser(),
                         client_key=str(client_key), host_key=str(host_key),
                         host_pubkey_line=host_pub, known_hosts=str(workdir / "known_hosts"),
                         workdir=str(workdir), config_path=str(config_path),
                         fake_sudo_log=str(fakebin / "sudo.log"),
                         log_path=str(workdir / "sshd.log"), sftp_server=sftp_server)
        candidate.write_known_hosts(candidate.known_hosts)
        try:
            candidate.start()
        except (OSError, RuntimeError) as exc:
            candidate.kill_all()
            errors.append(str(exc))
            continue
        server = candidate
        break
    if server is None:
        shutil.rmtree(workdir, ignore_errors=True)
        _raise_unavailable("sshd failed to start: " + "\n---\n".join(errors))

    try:
        yield server
    finally:
        server.kill_all()
        shutil.rmtree(workdir, ignore_errors=True)


def session_sshd() -> Iterator[SSHD]:
    """An sshd for a session fixture: a skip where it cannot start, a failure on CI."""
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(running_sshd())
        except SshdUnavailable as exc:
            _unavailable(str(exc))
        yield server


@pytest.fixture(scope="session")
def sshd() -> Iterator[SSHD]:
    """The session's sshd."""
    yield from session_sshd()


def _raise_unavailable(reason: str) -> NoReturn:
    raise SshdUnavailable(reason)


def connect(sshd: SSHD, **overrides: object) -> SSHTransport:
    """An SSHTransport to the fixture server; overrides replace any constructor kwarg."""
    kwargs: dict[str, object] = {
        "name": "sshd-test", "address": sshd.host, "port": sshd.port, "user": sshd.user,
        "identity_file": sshd.client_key, "known_hosts": sshd.known_hosts,
        # Never the developer's own ~/.ssh/config: a `Host *` there would change the test.
        "ssh_config": os.devnull, "connect_timeout": 5.0,
    }
    kwargs.update(overrides)
    return SSHTransport(**kwargs)  # type: ignore[arg-type]


@pytest.fixture
def ssh_transport(sshd: SSHD) -> Iterator[SSHTransport]:
    """A connected SSHTransport to `sshd` (host key already pinned); closed afterwards."""
    transport = connect(sshd)
    try:
        yield transport
    finally:
        transport.close()


class CountingProxy:
    """A TCP relay in front of sshd that counts the connections it accepts."""

    def __init__(self, target_port: int) -> None:
        self.accepted = 0
        self.frozen = threading.Event()
        self._target = ("127.0.0.1", target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            upstream = socket.create_connection(self._target)
            self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def freeze(self) -> None:
        """A partition: connections stay open but nothing more gets through (no FIN, no RST)."""
        self.frozen.set()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.frozen.is_set():
                    continue  # swallowed, as a dead link would
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        """Cut every relayed connection now, as a network failure would (shutdown wakes blocked reads)."""
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
