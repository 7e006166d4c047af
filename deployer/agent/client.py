"""Our side of the agent protocol: start the agent over a byte pipe, then typed calls.

A transport's only job is a byte pipe to a Python on the target (deployer/transport: a local
subprocess, or one SSH exec channel running `bootstrap_argv(python)`); everything above the pipe
is shared.

Start-up costs no round trip of its own after the exec: the bootstrap, the agent's source and a
`hello` go out in one write, and the first requests may follow at once (`start(wait=False)`):
no reply is handed out before the hello proved the agent runs exactly our source. Calls may be
pipelined (`submit`, then `Pending.result`); every call has a timeout on our side too, and a dead
pipe or a stalled reply raises TransportError and closes the agent (its stdin closes, so it exits
and kills what it was running).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import io
import json
import struct
import subprocess
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast

from deployer.command import quote
from deployer.errors import AgentLost, RequestSkipped, TransportError
from deployer.transport.base import DEFAULT_TIMEOUT_S, Captured, ExecResult, PutResult, sha256_hex

AGENT_FILE = Path(__file__).with_name("agent.py")
HEADER = struct.Struct(">I")
MAX_REPLY = 256 << 20  # a reply larger than this is a broken stream, not data
# What a reply may hold besides the bytes asked for (a `run`'s tails, a `get`'s file, an `http` body: each bounded
# by the request): its own fields, an error message, a put's or a hello's result. A reply larger than the largest
# any request in flight may get is a broken stream, refused from its length before it is read.
ENVELOPE = 64 << 10
STAT_ENTRY = 16 << 10  # one stat entry: a path, its real path and link target (PATH_MAX each), an error
MAX_DEPTH = 10  # the agent's deepest reply (batch > results > reply > result > entries > entry) is 7 deep
IO_TIMEOUT_S = 60.0  # our wait for a reply to an op that runs nothing (put, get, stat)
REPLY_MARGIN_S = 5.0  # beyond a command's own timeout: the agent's kill grace plus transit
CLOSE_WAIT_S = 5.0
STDERR_TAIL = 4096
CHUNK = 65536

T = TypeVar("T")


@functools.cache
def agent_source() -> bytes:
    return AGENT_FILE.read_bytes()


def bootstrap_argv(python: str) -> list[str]:
    """The argv that starts the agent: python reads exactly len(source) bytes of stdin and
    executes them; the rest of stdin, read through the same buffered reader, is the protocol.
    -I -S: no PYTHON* variables, user site or site hooks can change what runs."""
    size = len(agent_source())
    code = (f"import sys;AGENT_SOURCE=sys.stdin.buffer.read({size});"
            f"len(AGENT_SOURCE)=={size} or sys.exit('deployer agent: source cut short');"
            "exec(compile(AGENT_SOURCE,'deployer-agent','exec'))")
    return [python, "-I", "-S", "-c", code]


def bootstrap_command(python: str, prefix: Sequence[str] = ()) -> str:
    """The shell line an exec channel runs; prefix is e.g. ("sudo", "-n", "--")."""
    return quote([*prefix, *bootstrap_argv(python)])


# -- pipes -----------------------------------------------------------------------------------


class Pipe(Protocol):
    """A byte pipe to the agent's stdin and from its stdout."""

    def read(self, size: int) -> bytes:
        """Up to size bytes as soon as any arrive; b"" at end of stream."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None:
        """Close our sending side (the agent sees EOF and exits), then release the pipe."""

    def stderr_tail(self) -> str:
        """The last of what the agent wrote on stderr (why it died, when it did)."""


class _TailBuffer:
    def __init__(self) -> None:
        self._data = bytearray()
        self._lock = threading.Lock()

    def add(self, chunk: bytes) -> None:
        with self._lock:
            self._data += chunk
            del self._data[:-STDERR_TAIL]

    def text(self) -> str:
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
        stderr = cast(io.BufferedReader, proc.stderr)
        threading.Thread(target=_drain, args=(lambda: stderr.read1(CHUNK), self._stderr),
                         name="agent-stderr", daemon=True).start()

    def read(self, size: int) -> bytes:
        return self._stdout.read1(size)

    def write(self, data: bytes) -> None:
        self._stdin.write(data)
        self._stdin.flush()

    def close(self) -> None:
        with contextlib.suppress(OSError):  # already broken: the agent is gone or going
            self._stdin.close()
        try:
            self.proc.wait(CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(CLOSE_WAIT_S)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def stderr_tail(self) -> str:
        return self._stderr.text()


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
        if hasattr(channel, "recv_stderr"):
            threading.Thread(target=_drain, args=(lambda: channel.recv_stderr(CHUNK), self._stderr),
                             name="agent-stderr", daemon=True).start()

    def read(self, size: int) -> bytes:
        data: bytes = self._chan.recv(size)
        return data

    def write(self, data: bytes) -> None:
        self._chan.sendall(data)

    def close(self) -> None:
        # The connection may be gone, or go while this runs: then there is nothing left to tell the far end.
        for step in (self._chan.shutdown_write, self._chan.close):
            with contextlib.suppress(OSError, EOFError):
                step()

    def stderr_tail(self) -> str:
        return self._stderr.text()


def _drain(read: Any, sink: _TailBuffer) -> None:
    try:
        while chunk := read():
            sink.add(chunk)
    except (OSError, ValueError, EOFError):
        return


# -- typed requests and results ----------------------------------------------------------------


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

    def fields(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "cwd": self.cwd, "env": dict(self.env or {}),
                "stdin": None if self.stdin is None else _b64(self.stdin),
                "timeout": self.timeout, "tail": self.tail, "check": self.check,
                "expect_stdout": None if self.expect_stdout is None else _b64(self.expect_stdout)}

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
    mode: int = 0o644
    uid: int = -1
    gid: int = -1
    replaced: bool = False
    owner_kept: bool | None = None  # None: there was no previous owner to keep
    created_dirs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Put(Request[PutReply]):
    """Atomic replace; mode=None keeps the replaced file's mode (0644 for a new file)."""

    op: ClassVar[str] = "put"
    path: str
    data: bytes = field(repr=False)
    mode: int | None = None
    keep_owner: bool = True
    mkdirs: bool = False

    def fields(self) -> dict[str, Any]:
        return {"path": self.path, "data": _b64(self.data), "sha256": sha256_hex(self.data),
                "mode": self.mode, "keep_owner": self.keep_owner, "mkdirs": self.mkdirs}

    def parse(self, result: dict[str, Any]) -> PutReply:
        return PutReply(dest=result["path"], sha256=result["sha256"], size=result["size"], mode=result["mode"],
                        uid=result["uid"], gid=result["gid"], replaced=result["replaced"],
                        owner_kept=result["owner_kept"], created_dirs=tuple(result["created_dirs"]))


@dataclass(frozen=True)
class Get(Request[bytes | None]):
    """The file's bytes, None when absent; a file over max_bytes is an error."""

    op: ClassVar[str] = "get"
    path: str
    max_bytes: int = 16 << 20

    def fields(self) -> dict[str, Any]:
        return {"path": self.path, "max_bytes": self.max_bytes}

    def parse(self, result: dict[str, Any]) -> bytes | None:
        return _unb64(result["data"]) if result["exists"] else None

    def max_reply(self) -> int:
        return _b64_size(self.max_bytes) + ENVELOPE


@dataclass(frozen=True)
class StatEntry:
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
class HttpResult:
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
    """GET on the target's own loopback; check=False keeps a batch going past a bad status."""

    op: ClassVar[str] = "http"
    url: str
    timeout: float = 10.0
    max_bytes: int = 4 << 20
    check: bool = True

    def fields(self) -> dict[str, Any]:
        return {"url": self.url, "timeout": self.timeout, "max_bytes": self.max_bytes, "check": self.check}

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
    """Kill the commands the agent runs now (served out of turn); how many it killed."""

    op: ClassVar[str] = "cancel"

    def fields(self) -> dict[str, Any]:
        return {}

    def parse(self, result: dict[str, Any]) -> int:
        return int(result["killed"])


@dataclass(frozen=True)
class Hello:
    version: str
    sha256: str
    python: str
    executable: str
    pid: int
    uid: int
    gid: int
    euid: int


@dataclass(frozen=True)
class _HelloRequest(Request[Hello]):
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


def _envelope_problem(reply: object) -> str | None:
    """What is wrong with a reply's outer shape (None: nothing); its result is read by the request's parse."""
    if not isinstance(reply, dict):
        return f"a reply that is a JSON {type(reply).__name__}, not an object"
    if _depth(reply) > MAX_DEPTH:
        return f"a reply nested deeper than {MAX_DEPTH} levels"
    if not isinstance(reply.get("ok"), bool):
        return "a reply without a true/false 'ok'"
    if reply["ok"] and not isinstance(reply.get("result"), dict):
        return "a reply whose 'result' is not an object"
    error = reply.get("error")
    if not reply["ok"] and not (isinstance(error, dict) and isinstance(error.get("type"), str)
                                and isinstance(error.get("message"), str)):
        return "a failure reply without an 'error' of type and message"
    return None


def _depth(value: object) -> int:
    """How deeply lists and objects nest in value (iteratively: depth itself is what is in doubt)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if level <= MAX_DEPTH:
                todo.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


# -- the client --------------------------------------------------------------------------------


class Pending(Generic[T]):
    """A request on its way; result() waits for its reply (bounded)."""

    def __init__(self, client: AgentClient, request: Request[T], request_id: int) -> None:
        self._client = client
        self.request = request
        self.id = request_id
        self._done = threading.Event()
        self._reply: dict[str, Any] | None = None
        self._failure: str | None = None

    def _resolve(self, reply: dict[str, Any] | None, failure: str | None = None) -> None:
        self._reply, self._failure = reply, failure
        self._done.set()

    def result(self, timeout: float | None = None) -> T:
        if self.request.op != "hello":  # replies come in order: the hello's is there first
            self._client.verified()
        limit = self.request.reply_timeout() if timeout is None else timeout
        if not self._done.wait(limit):
            self._client.abort(f"'{self.request.op}' did not finish within {limit:g}s (no reply from the agent)")
            raise TransportError(f"{self._client.name}: '{self.request.op}' did not finish within {limit:g}s "
                                 "(no reply from the agent); closed the agent")
        if self._reply is None:
            raise AgentLost(f"{self._client.name}: agent lost during '{self.request.op}': {self._failure}")
        if not self._reply["ok"]:
            error = self._reply["error"]
            if error["type"] == "skipped":
                raise RequestSkipped(f"{self._client.name}: '{self.request.op}' skipped: {error['message']}")
            raise TransportError(f"{self._client.name}: agent refused '{self.request.op}' "
                                 f"({error['type']}): {error['message']}")
        try:
            return self.request.parse(self._reply["result"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            # Not what our agent sends: nothing more it says can be trusted either.
            reason = f"a malformed reply to '{self.request.op}' ({type(exc).__name__}: {exc}); the stream is broken"
            self._client.abort(reason)
            raise AgentLost(f"{self._client.name}: {reason}") from None


class AgentClient:
    """Typed calls to one agent over one pipe. Thread-safe; replies are matched by id."""

    def __init__(self, pipe: Pipe, *, name: str = "agent") -> None:
        self.name = name
        self._pipe = pipe
        self._write_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._pending: dict[int, Pending[Any]] = {}
        self._next_id = 0
        self._dead: str | None = None  # why no more calls can be made
        self._closed = False
        self._reader = threading.Thread(target=self._read_loop, name=f"agent-reader-{name}", daemon=True)
        self.hello: Hello | None = None
        self._hello: Pending[Hello] | None = None
        self._hello_timeout = IO_TIMEOUT_S
        self._hello_lock = threading.Lock()
        self.on_hello: Callable[[Hello], None] | None = None  # told once the hello checked out

    # -- starting ----------------------------------------------------------------------------

    @classmethod
    def spawn_local(cls, python: str = sys.executable, *, name: str = "local",
                    timeout: float = IO_TIMEOUT_S) -> AgentClient:
        """The agent as a local subprocess."""
        return cls(local_pipe(bootstrap_argv(python), name), name=name).start(timeout)

    def start(self, timeout: float = IO_TIMEOUT_S, *, wait: bool = True) -> AgentClient:
        """Send the source and a hello in one write; check the agent runs exactly our source, now or
        (wait=False) when the first reply is read, so the hello shares the first requests' round trip."""
        self._reader.start()
        self._hello_timeout = timeout
        try:
            self._hello = self._enqueue(_HelloRequest(), prefix=agent_source(), timeout=timeout)
        except BaseException:
            self.close()
            raise
        if wait:
            self.verified()
        return self

    def verified(self) -> Hello:
        """The agent's hello, once it proved the agent runs our source (TransportError otherwise)."""
        with self._hello_lock:
            if self.hello is not None:
                return self.hello
            assert self._hello is not None, "start() sends the hello"
            try:
                hello = self._hello.result(self._hello_timeout)
            except BaseException:
                self.close()
                raise
            if hello.sha256 != sha256_hex(agent_source()):
                self.close()
                raise TransportError(f"{self.name}: the agent runs source {hello.sha256}, "
                                       f"not ours ({sha256_hex(agent_source())})")
            self.hello = hello
        if self.on_hello is not None:
            self.on_hello(hello)
        return hello

    # -- calls -------------------------------------------------------------------------------

    def submit(self, request: Request[T], timeout: float | None = None,
               after: Pending[Any] | None = None) -> Pending[T]:
        """Send without waiting (pipelining); replies come back in order. With `after`, the agent runs it
        only if that request succeeded (else its reply says it was skipped)."""
        return self._enqueue(request, timeout=timeout, after=after)

    def call(self, request: Request[T], timeout: float | None = None) -> T:
        return self.submit(request, timeout).result(timeout)

    def run(self, argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None,
            stdin: bytes | None = None, timeout: float = DEFAULT_TIMEOUT_S, tail: int = 1 << 20) -> ExecResult:
        return self.call(Run(argv, cwd=cwd, env=env, stdin=stdin, timeout=timeout, tail=tail))

    def put(self, path: str, data: bytes, *, mode: int | None = None, keep_owner: bool = True,
            mkdirs: bool = False) -> PutReply:
        return self.call(Put(path, data, mode=mode, keep_owner=keep_owner, mkdirs=mkdirs))

    def get(self, path: str, *, max_bytes: int = 16 << 20) -> bytes | None:
        return self.call(Get(path, max_bytes=max_bytes))

    def stat(self, paths: Sequence[str], *, sha256: bool = False) -> list[StatEntry]:
        return self.call(Stat(paths, sha256=sha256))

    def http(self, url: str, *, timeout: float = 10.0, max_bytes: int = 4 << 20) -> HttpResult:
        return self.call(Http(url, timeout=timeout, max_bytes=max_bytes))

    def batch(self, requests: Sequence[Request[Any]]) -> BatchResult:
        return self.call(Batch(requests))

    # -- the wire ----------------------------------------------------------------------------

    def _enqueue(self, request: Request[T], prefix: bytes = b"", timeout: float | None = None,
                 after: Pending[Any] | None = None) -> Pending[T]:
        with self._state_lock:
            if self._dead is not None:
                raise AgentLost(f"{self.name}: agent is gone: {self._dead}")
            self._next_id += 1
            pending = Pending(self, request, self._next_id)
            self._pending[pending.id] = pending
        gate = {} if after is None else {"after": after.id}
        body = json.dumps({"id": pending.id, **request.wire(), **gate}, separators=(",", ":")).encode("utf-8")
        # A frozen link blocks a large write for good (the window never opens): the call's own limit bounds it.
        limit = request.reply_timeout() if timeout is None else timeout
        watchdog = threading.Timer(limit, self.abort, args=(f"sending '{request.op}' to the agent did not finish "
                                                            f"within {limit:g}s",))
        watchdog.daemon = True
        watchdog.start()
        try:
            with self._write_lock:
                self._pipe.write(prefix + HEADER.pack(len(body)) + body)
        except (OSError, EOFError, ValueError) as exc:
            self._fail(f"cannot send to the agent: {exc}")
        finally:
            watchdog.cancel()
        return pending

    def _read_loop(self) -> None:
        buf = bytearray()
        try:
            while True:
                while len(buf) < HEADER.size:
                    if not self._fill(buf):
                        return self._fail("the agent closed its output")
                (length,) = HEADER.unpack(buf[:HEADER.size])
                if length > (limit := self._reply_limit()):
                    return self._fail(f"a reply of {length} bytes where at most {limit} can come: "
                                      "the stream is broken")
                while len(buf) < HEADER.size + length:
                    if not self._fill(buf):
                        return self._fail("the agent closed its output mid-reply")
                reply = json.loads(buf[HEADER.size:HEADER.size + length])
                del buf[:HEADER.size + length]
                if problem := _envelope_problem(reply):
                    return self._fail(f"{problem}: the stream is broken")
                if not self._dispatch(reply):
                    return self.close()
        except RecursionError:
            return self._fail("a reply nested too deeply to read: the stream is broken")
        except (OSError, EOFError, ValueError) as exc:
            return self._fail(f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a reader that dies silently would leave every caller waiting for its timeout
            return self._fail(f"reading a reply failed ({type(exc).__name__}: {exc})")

    def _reply_limit(self) -> int:
        """The largest frame any request in flight may get (`cancel` is answered out of turn, so not just the
        oldest's); the hello's when none is."""
        with self._state_lock:
            return min(MAX_REPLY, max((p.request.max_reply() for p in self._pending.values()), default=ENVELOPE))

    def _fill(self, buf: bytearray) -> bool:
        chunk = self._pipe.read(CHUNK)
        buf += chunk
        return bool(chunk)

    def _dispatch(self, reply: dict[str, Any]) -> bool:
        request_id = reply.get("id")
        with self._state_lock:
            pending = self._pending.pop(request_id, None) if isinstance(request_id, int) else None
        if pending is None:
            # We never send what the agent cannot parse: an unmatched reply means the stream
            # is not what we think it is.
            error = reply.get("error") or {}
            self._fail(f"unexpected reply (id {request_id!r}): {str(error.get('message', reply))[:1000]}")
            return False
        pending._resolve(reply)
        return True

    def _fail(self, reason: str) -> None:
        """The pipe is unusable: every waiter gets the reason (with the agent's stderr)."""
        stderr = self._pipe.stderr_tail().strip()
        if stderr:
            reason += f"; agent stderr: {stderr[-1000:]}"
        with self._state_lock:
            if self._dead is None:
                self._dead = reason
            waiting, self._pending = list(self._pending.values()), {}
        for pending in waiting:
            pending._resolve(None, reason)

    def abort(self, reason: str) -> None:
        """Give up on the agent now: every waiter fails with reason; the pipe closes in the background,
        since closing a channel on a frozen link can block as long as the link stays frozen."""
        self._fail(reason)
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        threading.Thread(target=self._pipe.close, name=f"agent-close-{self.name}", daemon=True).start()

    def close(self) -> None:
        """Close the agent's stdin: it kills what it still runs and exits."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        self._fail("the client closed the agent")
        self._pipe.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
