"""A target that is a directory on this machine: subprocesses and plain files."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence

from deployer.errors import TransportError
from deployer.transport.base import (
    DEFAULT_TIMEOUT_S,
    ExecResult,
    PutResult,
    Transport,
    TransportInfo,
    sha256_hex,
)


class LocalTransport(Transport):
    def __init__(self, name: str = "local") -> None:
        self.info = TransportInfo(kind="local", target=name)

    def run(self, argv: Sequence[str], *, cwd: str | None = None,
            env: Mapping[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT_S,
            stdin: bytes | None = None) -> ExecResult:
        full_env = {**os.environ, **(env or {})}
        started = time.monotonic()
        # A session of its own, so a timeout kills the whole group (a shell and its children).
        try:
            proc = subprocess.Popen(
                list(argv), cwd=cwd, env=full_env, start_new_session=True,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            return ExecResult(tuple(argv), 127, b"", str(exc).encode(), time.monotonic() - started)
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            return ExecResult(tuple(argv), None, out, err, time.monotonic() - started, timed_out=True)
        except BaseException:
            _kill_group(proc)
            proc.communicate()
            raise
        return ExecResult(tuple(argv), proc.returncode, out, err, time.monotonic() - started)

    def put(self, data: bytes, dest: str, *, mode: int | None = None) -> PutResult:
        directory = os.path.dirname(dest) or "."
        os.makedirs(directory, exist_ok=True)
        current = os.stat(dest) if os.path.exists(dest) else None
        if mode is None:
            mode = current.st_mode & 0o7777 if current is not None else 0o644
        fd, tmp = tempfile.mkstemp(prefix=".deployer-", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, mode)
            if current is not None:
                # Keep the file's owner; only root may give a file away, so a refusal changes nothing.
                with contextlib.suppress(PermissionError):
                    os.chown(tmp, current.st_uid, current.st_gid)
            with open(tmp, "rb") as handle:
                written = sha256_hex(handle.read())
            expected = sha256_hex(data)
            if written != expected:
                raise TransportError(f"upload of {dest} did not verify: sha256 {written} != {expected}")
            os.replace(tmp, dest)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return PutResult(dest=dest, sha256=expected, size=len(data))

    def get(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def forward(self, remote_port: int, remote_host: str = "127.0.0.1") -> int:
        # The target's loopback is ours: nothing to tunnel.
        return remote_port

    def reach(self, url: str) -> str:
        return url

    def close(self) -> None:
        pass


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
