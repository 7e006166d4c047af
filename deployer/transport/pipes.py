"""Byte pipes to a Python on the target: what a transport provides, each an agent.pipe.Pipe the client speaks over."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import threading
from collections.abc import Sequence
from typing import Any, cast

from deployer.agent.pipe import CHUNK, STDERR_SETTLE_S
from deployer.errors import TransportError

CLOSE_WAIT_S = 5.0
STDERR_TAIL = 4096


def shell_found_no(command: str, stderr: str) -> bool:
    """Whether stderr is the host's shell saying there is no `command` to run: `sh: 1: podman: not found`,
    `bash: podman: command not found`, `sh: line 1: /usr/bin/podman: No such file or directory`."""
    return re.search(rf"{re.escape(command.lower())}: (?:command not found|not found|no such file or directory)",
                     stderr.lower()) is not None


class _TailBuffer:
    def __init__(self) -> None:
        self._data = bytearray()
        self._lock = threading.Lock()
        self.ended = threading.Event()  # the stream reached its end (or broke)

    def add(self, chunk: bytes) -> None:
        with self._lock:
            self._data += chunk
            del self._data[:-STDERR_TAIL]

    def text(self, *, settle: bool = False) -> str:
        """What the stream held last; settle: once it ended, when the output beside it has (bounded)."""
        if settle:
            self.ended.wait(STDERR_SETTLE_S)
        with self._lock:
            return self._data.decode("utf-8", "replace")


class ProcessPipe:
    """The stdin/stdout of a local agent subprocess."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self._stdin = proc.stdin
        # read1 on the buffered objects, not os.read on their fds: closing a buffered object
        # waits for a read in progress, so a closed fd number is never read after reuse.
        self._stdout = cast(io.BufferedReader, proc.stdout)  # what Popen makes with the default bufsize
        self._stderr = _TailBuffer()
        self._output_ended = False
        stderr = cast(io.BufferedReader, proc.stderr)
        threading.Thread(target=_drain, args=(lambda: stderr.read1(CHUNK), self._stderr),
                         name="agent-stderr", daemon=True).start()

    def read(self, size: int) -> bytes:
        data = self._stdout.read1(size)
        self._output_ended = not data
        return data

    def write(self, data: bytes) -> None:
        self._stdin.write(data)
        self._stdin.flush()

    def close(self, kill: bool = False) -> None:
        if kill:  # before the stdin's close, which waits for a write blocked on a python that never reads
            self._kill_group()
        with contextlib.suppress(OSError):  # already broken: the agent is gone or going
            self._stdin.close()
        try:
            self.proc.wait(CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            self._kill_group()
            self.proc.wait(CLOSE_WAIT_S)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def stderr_tail(self, *, ended: bool = False) -> str:
        return self._stderr.text(settle=ended or self._output_ended)

    def _kill_group(self) -> None:
        # The session local_pipe started it in; not reaped yet, so that id is no other process's.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def local_pipe(argv: Sequence[str], name: str) -> ProcessPipe:
    """argv as a local process in a session of its own (a ^C meant for us must not kill the agent
    mid-op; it exits when we close its stdin)."""
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        raise TransportError(f"{name}: cannot start the agent with {argv[0]}: {exc}") from None
    return ProcessPipe(proc)


class ChannelPipe:
    """A paramiko exec channel (or anything with recv/sendall/shutdown_write/close, such as a
    socket) whose remote end already runs `bootstrap_command`."""

    def __init__(self, channel: Any) -> None:
        self._chan = channel
        self._stderr = _TailBuffer()
        self._output_ended = False
        if hasattr(channel, "recv_stderr"):
            threading.Thread(target=_drain, args=(lambda: channel.recv_stderr(CHUNK), self._stderr),
                             name="agent-stderr", daemon=True).start()
        else:
            self._stderr.ended.set()  # a socket: no stderr to wait for

    def read(self, size: int) -> bytes:
        data: bytes = self._chan.recv(size)
        self._output_ended = not data
        return data

    def write(self, data: bytes) -> None:
        self._chan.sendall(data)

    def close(self, kill: bool = False) -> None:
        # The connection may be gone, or go while this runs: then there is nothing left to tell the far end.
        # kill: a socket's far end has no process group to reach; an exec's is reached over SSH (ExecPipe).
        for step in (self._chan.shutdown_write, self._chan.close):
            with contextlib.suppress(OSError, EOFError):
                step()

    def stderr_tail(self, *, ended: bool = False) -> str:
        return self._stderr.text(settle=ended or self._output_ended)


def _drain(read: Any, sink: _TailBuffer) -> None:
    try:
        while chunk := read():
            sink.add(chunk)
    except (OSError, ValueError, EOFError):
        return
    finally:
        sink.ended.set()
