"""A target that is a directory on this machine: subprocesses and plain files."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from deployer.errors import TransportError
from deployer.transport.base import (
    CAPTURE_BYTES,
    DEFAULT_TIMEOUT_S,
    Captured,
    ExecResult,
    PutResult,
    Stream,
    Transport,
    TransportInfo,
    sha256_hex,
)

CHUNK = 65536
# After a kill, how long output may keep arriving from whatever inherited the pipes.
KILL_GRACE_S = 3.0


class LocalTransport(Transport):
    def __init__(self, name: str = "local") -> None:
        self.info = TransportInfo(kind="local", target=name)

    def run(self, argv: Sequence[str], *, cwd: str | None = None,
            env: Mapping[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT_S,
            stdin: bytes | None = None, capture: int | None = CAPTURE_BYTES) -> ExecResult:
        full_env = {**os.environ, **(env or {})}
        started = time.monotonic()
        deadline = started + timeout
        # A session of its own, so a timeout kills the whole group (a shell and its children).
        try:
            proc = subprocess.Popen(
                list(argv), cwd=cwd, env=full_env, start_new_session=True,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            return ExecResult(tuple(argv), 127, Captured.whole(b""), Captured.whole(str(exc).encode()),
                              time.monotonic() - started)
        out, err = Stream(capture), Stream(capture)
        assert proc.stdout is not None and proc.stderr is not None
        # Drained as it arrives into bounded tails: memory stays flat whatever the command prints.
        threads = [threading.Thread(target=_drain, args=(proc.stdout, out), daemon=True),
                   threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True)]
        if stdin is not None:
            threads.append(threading.Thread(target=_feed, args=(proc, stdin), daemon=True))
        for thread in threads:
            thread.start()
        try:
            finished = _wait(proc, threads, deadline)
        except BaseException:
            _kill_group(proc)
            proc.wait()
            raise
        if not finished:
            _kill_group(proc)
            proc.wait()
            # Whatever the group passed on to a process outside it may hold the pipes open still.
            _wait(proc, threads, time.monotonic() + KILL_GRACE_S)
        return ExecResult(tuple(argv), proc.returncode if finished else None, out.captured(), err.captured(),
                          time.monotonic() - started, timed_out=not finished)

    def put(self, data: bytes, dest: str, *, mode: int | None = None,
            timeout: float = DEFAULT_TIMEOUT_S) -> PutResult:
        expected = sha256_hex(data)
        gate = _Abandonable()

        def write() -> None:
            directory = os.path.dirname(dest) or "."
            os.makedirs(directory, exist_ok=True)
            current = os.stat(dest) if os.path.exists(dest) else None
            final_mode = mode if mode is not None else current.st_mode & 0o7777 if current is not None else 0o644
            fd, tmp = tempfile.mkstemp(prefix=".deployer-", suffix=".tmp", dir=directory)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.chmod(tmp, final_mode)
                if current is not None:
                    # Keep the file's owner; only root may give a file away, so a refusal changes nothing.
                    with contextlib.suppress(PermissionError):
                        os.chown(tmp, current.st_uid, current.st_gid)
                with open(tmp, "rb") as handle:
                    written = sha256_hex(handle.read())
                if written != expected:
                    raise TransportError(f"upload of {dest} did not verify: sha256 {written} != {expected}")
                gate.commit(lambda: os.replace(tmp, dest))
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)

        gate.run(write, timeout, f"upload of {dest} did not finish within {timeout:g}s; old file left untouched")
        return PutResult(dest=dest, sha256=expected, size=len(data))

    def get(self, path: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> bytes | None:
        found: list[bytes | None] = []

        def read() -> None:
            try:
                with open(path, "rb") as handle:
                    found.append(handle.read())
            except FileNotFoundError:
                found.append(None)

        _Abandonable().run(read, timeout, f"reading {path} did not finish within {timeout:g}s")
        return found[0]

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


def _drain(pipe: IO[bytes], sink: Stream) -> None:
    with pipe:
        while data := pipe.read1(CHUNK):  # type: ignore[attr-defined]
            sink.feed(data)


def _feed(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    try:
        with proc.stdin:
            proc.stdin.write(data)
    except BrokenPipeError:
        pass  # the command exited without reading it all; its exit status tells the story


def _wait(proc: subprocess.Popen[bytes], threads: list[threading.Thread], deadline: float) -> bool:
    """True when the command exited and its output is drained before deadline."""
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            return False
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return False
    return True


class _Abandonable:
    """File I/O in a worker thread the caller stops waiting for at its timeout.

    A read from a FIFO or a hung mount cannot be interrupted; the worker is left blocked (it is a
    daemon), and the one step with an effect, the final rename, happens only if nobody gave up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._abandoned = False

    def commit(self, effect: Callable[[], None]) -> None:
        with self._lock:
            if self._abandoned:
                raise TransportError("abandoned after its timeout")
            effect()

    def run(self, work: Callable[[], None], timeout: float, late: str) -> None:
        failure: list[BaseException] = []

        def body() -> None:
            try:
                work()
            except BaseException as exc:  # handed to the waiting caller
                failure.append(exc)

        worker = threading.Thread(target=body, daemon=True, name="deployer-local-io")
        worker.start()
        try:
            worker.join(timeout)
        except BaseException:  # interrupted while waiting: nothing may land after we stopped caring
            with self._lock:
                self._abandoned = True
            raise
        with self._lock:
            if worker.is_alive():
                self._abandoned = True
                raise TransportError(late)
        worker.join()  # finished: only the thread's exit is left
        if failure:
            raise failure[0]
