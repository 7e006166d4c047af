"""The agent protocol on our side: each op as a request object, and the results its reply parses into.

Transports and steps build these requests (deployer/transport/base.py submits them); the client
(deployer/agent/client.py) frames them onto a pipe and reads each reply back through its request's
`parse`. The agent (deployer/agent/agent.py) is a standalone file sent to the target as source, so it
shares no code with this module."""

from __future__ import annotations

import base64
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from deployer.command import quote
from deployer.errors import OutputTruncated

DEFAULT_TIMEOUT_S = 120.0
# What a reply may hold besides the bytes asked for (a `run`'s tails, a `get`'s file, an `http` body: each bounded
# by the request): its own fields, an error message, a put's or a hello's result. A reply larger than the largest
# any request in flight may get is a broken stream, refused from its length before it is read.
ENVELOPE = 64 << 10
STAT_ENTRY = 16 << 10  # one stat entry: a path, its real path and link target (PATH_MAX each), an error
IO_TIMEOUT_S = 60.0  # our wait for a reply to an op that runs nothing (put, get, stat)
REPLY_MARGIN_S = 5.0  # beyond a command's own timeout: the agent's kill grace plus transit

T = TypeVar("T")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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


@dataclass(frozen=True)
class PutResult:
    """What a put left on disk: its path, sha256 and size."""
    dest: str
    sha256: str
    size: int



class Request(ABC, Generic[T]):
    """One op as data: what goes on the wire, how its result is read, how long we wait."""

    op: ClassVar[str]

    @abstractmethod
    def fields(self) -> dict[str, Any]: ...

    @abstractmethod
    def parse(self, result: dict[str, Any]) -> T: ...

    def reply_timeout(self) -> float:
        return IO_TIMEOUT_S

    def max_reply(self) -> int:
        """The largest reply frame this request can get from our agent."""
        return ENVELOPE

    def wire(self) -> dict[str, Any]:
        return {"op": self.op, **self.fields()}


@dataclass(frozen=True)
class Run(Request[ExecResult]):
    """argv without a shell, in a session of its own; check=False keeps a batch going past a
    non-zero exit."""

    op: ClassVar[str] = "run"
    argv: Sequence[str]
    cwd: str | None = None
    env: Mapping[str, str] | None = None
    stdin: bytes | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    tail: int = 1 << 20
    check: bool = True
    expect_stdout: bytes | None = None  # the exact output that counts as success (a batch stops otherwise)
    # A `git diff --numstat -z`'s totals that count as success: {"files": (min, max) or None, ...}.
    numstat_within: Mapping[str, tuple[int, int] | None] | None = None
    detached: bool = False  # run even once the client has closed the agent's stdin (its reply goes nowhere)

    def fields(self) -> dict[str, Any]:
        within = {} if self.numstat_within is None else {"numstat_within": {
            name: None if bound is None else list(bound) for name, bound in self.numstat_within.items()}}
        return {"argv": list(self.argv), "cwd": self.cwd, "env": dict(self.env or {}),
                "stdin": None if self.stdin is None else _b64(self.stdin),
                "timeout": self.timeout, "tail": self.tail, "check": self.check,
                "expect_stdout": None if self.expect_stdout is None else _b64(self.expect_stdout), **within,
                **({"detached": True} if self.detached else {})}

    def parse(self, result: dict[str, Any]) -> ExecResult:
        # The agent kept the tail of each stream and counted every byte: reading a cut stream whole raises.
        return ExecResult(tuple(self.argv), None if result["timed_out"] else result["exit_code"],
                          Captured(_unb64(result["stdout"]), result["stdout_bytes"]),
                          Captured(_unb64(result["stderr"]), result["stderr_bytes"]), result["duration_s"],
                          timed_out=result["timed_out"])

    def reply_timeout(self) -> float:
        return self.timeout + REPLY_MARGIN_S

    def max_reply(self) -> int:
        return 2 * _b64_size(self.tail) + ENVELOPE


@dataclass(frozen=True)
class PutReply(PutResult):
    """A put's full reply: also the mode and owner it gave the file and the directories it made."""
    mode: int = 0o644
    uid: int = -1
    gid: int = -1
    replaced: bool = False
    owner_kept: bool | None = None  # None: there was no previous owner to keep
    created_dirs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Put(Request[PutReply]):
    """Atomic replace; mode=None keeps the replaced file's mode (0644 for a new file); temp: stage only, there."""

    op: ClassVar[str] = "put"
    path: str
    data: bytes = field(repr=False)
    mode: int | None = None
    keep_owner: bool = True
    mkdirs: bool = False
    temp: str | None = None

    def fields(self) -> dict[str, Any]:
        return {"path": self.path, "data": _b64(self.data), "sha256": sha256_hex(self.data), "mode": self.mode,
                "keep_owner": self.keep_owner, "mkdirs": self.mkdirs, **({"temp": self.temp} if self.temp else {})}

    def parse(self, result: dict[str, Any]) -> PutReply:
        return PutReply(dest=result["path"], sha256=result["sha256"], size=result["size"], mode=result["mode"],
                        uid=result["uid"], gid=result["gid"], replaced=result["replaced"],
                        owner_kept=result["owner_kept"], created_dirs=tuple(result["created_dirs"]))


# What a get reads unless told otherwise: a run's pre-run bytes of each dest, so the most a shipped file may be.
GET_MAX = 16 << 20


@dataclass(frozen=True)
class Get(Request[bytes | None]):
    """The file's bytes, None when absent; a file over max_bytes is an error."""

    op: ClassVar[str] = "get"
    path: str
    max_bytes: int = GET_MAX

    def fields(self) -> dict[str, Any]:
        return {"path": self.path, "max_bytes": self.max_bytes}

    def parse(self, result: dict[str, Any]) -> bytes | None:
        return _unb64(result["data"]) if result["exists"] else None

    def max_reply(self) -> int:
        return _b64_size(self.max_bytes) + ENVELOPE


@dataclass(frozen=True)
class StatEntry:
    """One path as the agent found it (lstat, real path, link target, sha256 when asked)."""
    path: str
    exists: bool | None  # None: could not be examined (see error)
    type: str | None = None  # file, dir, symlink, other (of the path itself, not followed)
    size: int | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    mtime: float | None = None
    realpath: str | None = None
    link: str | None = None  # a symlink's target as written
    sha256: str | None = None  # when asked for, of what the path resolves to if a regular file
    error: str | None = None


@dataclass(frozen=True)
class Stat(Request[list[StatEntry]]):
    """lstat (and, when asked, sha256) of many paths in one request."""
    op: ClassVar[str] = "stat"
    paths: Sequence[str]
    sha256: bool = False

    def fields(self) -> dict[str, Any]:
        return {"paths": list(self.paths), "sha256": self.sha256}

    def parse(self, result: dict[str, Any]) -> list[StatEntry]:
        return [StatEntry(**entry) for entry in result["entries"]]

    def max_reply(self) -> int:
        return ENVELOPE + STAT_ENTRY * len(self.paths)


@dataclass(frozen=True)
class Premised:
    """What a premise found, as it wrote it into the intent record: HEAD and each file's pre-run state."""
    head: str
    files: list[dict[str, Any]]


@dataclass(frozen=True)
class Ready:
    """What the target must show for a step's pre-change judgement to find nothing there (co_restart's): checked
    by the premise before it writes the intent record, so that judgement needs no round trip of its own.

    services: [{service, health (a loopback URL, or None), timeout, record}]: each health URL answers other than
    200, or `record` ("PID START", as deployer writes it when it starts the service) names a live process that
    started then. gpus: [{service, argv, env, timeout, want}]: argv (nvidia-smi's GPU list) exits 0 within the
    timeout and lists every index in `want`, one number a line. Anything else is the premise's refusal: the run
    then reads the target and judges here, in its own words (a process it adopts, a refusal)."""
    services: Sequence[Mapping[str, Any]] = ()
    gpus: Sequence[Mapping[str, Any]] = ()

    def __add__(self, other: Ready) -> Ready:
        return Ready([*self.services, *other.services], [*self.gpus, *other.gpus])

    def fields(self) -> dict[str, Any]:
        return {"services": [dict(s) for s in self.services], "gpus": [dict(g) for g in self.gpus]}

    def seconds(self) -> float:
        """How long the agent may take over them: each health read and GPU list within its own timeout."""
        return sum(float(check["timeout"]) for check in [*self.services, *self.gpus])


@dataclass(frozen=True)
class ReadyCheck(Request[None]):
    """Ready's checks alone, read-only (op_ready): a judgement made here asks it first, in one round trip for every
    service; it reads each service itself only when the agent did not find them ready."""
    op: ClassVar[str] = "ready"
    ready: Ready

    def fields(self) -> dict[str, Any]:
        return self.ready.fields()

    def parse(self, result: dict[str, Any]) -> None:
        return None

    def reply_timeout(self) -> float:
        return IO_TIMEOUT_S + self.ready.seconds()


@dataclass(frozen=True)
class Premise(Request[Premised]):
    """A batch's premises, checked on the target, then its intent record written there: see op_premise."""
    op: ClassVar[str] = "premise"
    repo: str
    git_dir: str
    head_argv: Sequence[str]
    record: str
    record_fields: Mapping[str, Any]
    files: Sequence[Mapping[str, Any]]
    ready: Ready = Ready()

    def fields(self) -> dict[str, Any]:
        return {"repo": self.repo, "git_dir": self.git_dir, "head_argv": list(self.head_argv),
                "record": self.record, "fields": dict(self.record_fields), "files": [dict(f) for f in self.files],
                **self.ready.fields()}

    def parse(self, result: dict[str, Any]) -> Premised:
        return Premised(result["head"], result["files"])

    def reply_timeout(self) -> float:
        return IO_TIMEOUT_S + self.ready.seconds()

    def max_reply(self) -> int:
        return ENVELOPE + STAT_ENTRY * len(self.files)


@dataclass(frozen=True)
class HttpResult:
    """An http request's answer from the target's loopback (or the error that stopped it)."""
    url: str
    status: int | None  # None: no response (refused, timed out); see error
    body: bytes = b""
    truncated: bool = False
    content_type: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and self.status < 400

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


@dataclass(frozen=True)
class Http(Request[HttpResult]):
    """A request on the target's own loopback (GET; POST/PUT/DELETE with an optional JSON body for a router's
    worker calls); check=False keeps a batch going past a bad status."""

    op: ClassVar[str] = "http"
    url: str
    timeout: float = 10.0
    max_bytes: int = 4 << 20
    check: bool = True
    method: str = "GET"
    json: Any = None  # sent as the body, with Content-Type: application/json

    def fields(self) -> dict[str, Any]:
        sent = {"url": self.url, "timeout": self.timeout, "max_bytes": self.max_bytes, "check": self.check}
        if self.method != "GET" or self.json is not None:  # a GET without a body reads as before
            sent.update(method=self.method, json=self.json)
        return sent

    def parse(self, result: dict[str, Any]) -> HttpResult:
        return HttpResult(url=result["url"], status=result["status"], body=_unb64(result.get("body", "")),
                          truncated=result.get("truncated", False), content_type=result.get("content_type"),
                          error=result.get("error"))

    def reply_timeout(self) -> float:
        return self.timeout + REPLY_MARGIN_S

    def max_reply(self) -> int:
        return _b64_size(self.max_bytes) + ENVELOPE


@dataclass(frozen=True)
class Beat(Request[bool]):
    """Touch path every interval_s seconds while the agent lives (0 stops); True when it was touched now."""

    op: ClassVar[str] = "beat"
    path: str
    interval_s: float

    def fields(self) -> dict[str, Any]:
        return {"path": self.path, "interval_s": self.interval_s}

    def parse(self, result: dict[str, Any]) -> bool:
        return bool(result["touched"])


@dataclass(frozen=True)
class Cancel(Request[int]):
    """Kill the commands the agent runs now (served out of turn); how many it killed. skip: requests (by id)
    to skip if they have not started; kill False: what runs now finishes."""

    op: ClassVar[str] = "cancel"
    skip: tuple[int, ...] = ()
    kill: bool = True

    def fields(self) -> dict[str, Any]:
        return {} if not self.skip and self.kill else {"skip": list(self.skip), "kill": self.kill}

    def parse(self, result: dict[str, Any]) -> int:
        return int(result["killed"])


@dataclass(frozen=True)
class Hello:
    """Which agent runs, under which python and as whom: its first reply."""
    version: str
    sha256: str
    python: str
    executable: str
    pid: int
    uid: int
    gid: int
    euid: int
    bytecode: bool  # it ran our bytecode of its source, not a compile of it there
    cached: bool = False  # it ran the copy an earlier run left on the target (client.bootstrap_argv(cached=True))


@dataclass(frozen=True)
class HelloRequest(Request[Hello]):
    """The first request: the agent proves it runs our source."""
    op: ClassVar[str] = "hello"

    def fields(self) -> dict[str, Any]:
        return {}

    def parse(self, result: dict[str, Any]) -> Hello:
        return Hello(**result)


@dataclass(frozen=True)
class OpFailure:
    """An op the agent refused or could not carry out (inside a batch)."""

    type: str
    message: str


@dataclass(frozen=True)
class BatchResult:
    """results[i] answers requests[i], up to and including the first failure; later ones did not run."""

    results: list[Any]
    failed: int | None

    @property
    def ok(self) -> bool:
        return self.failed is None


@dataclass(frozen=True)
class Batch(Request[BatchResult]):
    """Requests run in order on the target; the first failure (an op error, a `run` exiting
    non-zero or timing out, an `http` without response or with status >= 400, unless that
    request has check=False) stops it. One round trip for all of them."""

    op: ClassVar[str] = "batch"
    requests: Sequence[Request[Any]]

    def fields(self) -> dict[str, Any]:
        return {"requests": [request.wire() for request in self.requests]}

    def parse(self, result: dict[str, Any]) -> BatchResult:
        parsed: list[Any] = []
        for request, reply in zip(self.requests, result["results"], strict=False):
            if reply["ok"]:
                parsed.append(request.parse(reply["result"]))
            else:
                parsed.append(OpFailure(reply["error"]["type"], reply["error"]["message"]))
        return BatchResult(parsed, result["failed"])

    def reply_timeout(self) -> float:
        return sum(request.reply_timeout() for request in self.requests) + REPLY_MARGIN_S

    def max_reply(self) -> int:
        return sum(request.max_reply() for request in self.requests) + ENVELOPE


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


def _b64_size(size: int) -> int:
    return 4 * ((size + 2) // 3)
