"""The interface every transport implements, and the results it returns."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from deployer.command import quote
from deployer.errors import OutputTruncated

DEFAULT_TIMEOUT_S = 120.0
# What each output stream of a command may hold before only its tail is kept (memory stays bounded
# whatever a command prints); a caller that needs more says so with run(capture=...).
CAPTURE_BYTES = 8 << 20


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Stream:
    """One output stream as it arrives: its byte count, and its last `limit` bytes (None: all)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.total = 0
        self._chunks: deque[bytes] = deque()
        self._kept = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        self._chunks.append(data)
        self._kept += len(data)
        # Drop whole chunks that lie entirely before the tail; the last cut happens in captured().
        while self.limit is not None and self._chunks and self._kept - len(self._chunks[0]) >= self.limit:
            self._kept -= len(self._chunks.popleft())

    def captured(self) -> Captured:
        data = b"".join(self._chunks)
        if self.limit is not None and len(data) > self.limit:
            data = data[-self.limit:]
        return Captured(data, self.total)


@dataclass(frozen=True)
class Captured:
    """What was kept of one stream: all of it, or its tail when `total` is larger."""

    kept: bytes
    total: int

    @property
    def text(self) -> str:
        return self.kept.decode("utf-8", "replace")

    @property
    def truncated(self) -> bool:
        return self.total > len(self.kept)

    @classmethod
    def whole(cls, data: bytes) -> Captured:
        return cls(data, len(data))


@dataclass(frozen=True)
class ExecResult:
    """What one command did. Never raised: callers decide what a non-zero exit means.

    `stdout`/`stderr` are the whole output or an error, never a silent tail: a caller that reads
    them after a command printed more than its capture limit gets OutputTruncated. Tails for people (logs,
    messages) come from `out_stream`/`err_stream`, which never raise."""

    argv: tuple[str, ...]
    exit_code: int | None  # None when the command was killed for outliving its timeout
    out_stream: Captured
    err_stream: Captured
    duration_s: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def stdout(self) -> bytes:
        return self._whole(self.out_stream, "stdout")

    def _whole(self, stream: Captured, name: str) -> bytes:
        if stream.truncated:
            raise OutputTruncated(f"{quote(self.argv)} printed {stream.total} bytes on {name}, more than the "
                                  f"{len(stream.kept)} kept, and all of it was needed")
        return stream.kept

    @property
    def stderr(self) -> bytes:
        return self._whole(self.err_stream, "stderr")

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        """stderr for messages: whole, or its tail marked as one."""
        text = self.err_stream.text
        if self.err_stream.truncated:
            return f"[first {self.err_stream.total - len(self.err_stream.kept)} bytes not kept] {text}"
        return text

    def describe_exit(self) -> str:
        return "timed out" if self.timed_out else f"exited {self.exit_code}"


@dataclass(frozen=True)
class PutResult:
    dest: str
    sha256: str
    size: int


@dataclass
class TransportInfo:
    """Facts about the connection worth recording in the run log."""

    kind: str
    target: str
    host_key_fingerprint: str | None = None
    extra: dict[str, str] = field(default_factory=dict)


class Transport(ABC):
    """Runs argv lists and moves bytes on one target. Paths are absolute paths on the target."""

    info: TransportInfo

    @abstractmethod
    def run(self, argv: Sequence[str], *, cwd: str | None = None,
            env: Mapping[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT_S,
            stdin: bytes | None = None, capture: int | None = CAPTURE_BYTES) -> ExecResult:
        """Run argv; a timed-out command is killed (its whole process group) and reported.

        Keeps the last `capture` bytes of stdout and of stderr (None: all of them), and counts
        every byte."""

    @abstractmethod
    def put(self, data: bytes, dest: str, *, mode: int | None = None,
            timeout: float = DEFAULT_TIMEOUT_S) -> PutResult:
        """Atomically replace dest: temp file beside it, fsync, verify sha256 there, rename.

        mode=None keeps the mode of an existing dest (0644 for a new file).
        Raises TransportError when the bytes on the target do not match, or when the upload
        has not finished within timeout seconds."""

    @abstractmethod
    def get(self, path: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> bytes | None:
        """The bytes of path, or None when it does not exist; TransportError past timeout."""

    @abstractmethod
    def forward(self, remote_port: int, remote_host: str = "127.0.0.1") -> int:
        """A local port that reaches remote_host:remote_port as seen from the target."""

    def reach(self, url: str) -> str:
        """The URL under which this machine reaches `url` as the target sees it (a tunnel when remote)."""
        parts = urlsplit(url)
        if parts.hostname is None:
            raise ValueError(f"not an absolute URL: {url}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        local_port = self.forward(port, parts.hostname)
        return urlunsplit((parts.scheme, f"127.0.0.1:{local_port}", parts.path, parts.query, ""))

    @abstractmethod
    def close(self) -> None:
        """Release the connection and any forwards."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
