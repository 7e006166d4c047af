"""The interface every transport implements, and the results it returns."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

DEFAULT_TIMEOUT_S = 120.0
TAIL_CHARS = 2000


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tail(data: bytes | str, limit: int = TAIL_CHARS) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return text[-limit:]


@dataclass(frozen=True)
class ExecResult:
    """What one command did. Never raised: callers decide what a non-zero exit means."""

    argv: tuple[str, ...]
    exit_code: int | None  # None when the command was killed for outliving its timeout
    stdout: bytes
    stderr: bytes
    duration_s: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")

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
            stdin: bytes | None = None) -> ExecResult:
        """Run argv; a timed-out command is killed (its whole process group) and reported."""

    @abstractmethod
    def put(self, data: bytes, dest: str, *, mode: int | None = None) -> PutResult:
        """Atomically replace dest: temp file beside it, fsync, verify sha256 there, rename.

        mode=None keeps the mode of an existing dest (0644 for a new file).
        Raises TransportError when the bytes on the target do not match."""

    @abstractmethod
    def get(self, path: str) -> bytes | None:
        """The bytes of path, or None when it does not exist."""

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
