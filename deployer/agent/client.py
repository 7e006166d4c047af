"""Our end of the agent: start it over a byte pipe, send it requests, match its replies to them.

A transport's only job is a byte pipe to a Python on the target (an agent/pipe.py Pipe, made by
deployer/transport/pipes.py: a local subprocess, or one SSH exec channel running `bootstrap_argv(python)`); the
requests and what their replies parse into are deployer/agent/protocol.py; everything above the pipe is shared.

Start-up costs no round trip of its own after the exec: the bootstrap, the agent's source and a
`hello` go out in one write, and the first requests may follow at once (`start(wait=False)`):
no reply is handed out before the hello proved the agent runs exactly our source. Over a far link
(`bootstrap_argv(cached=True)`) the source stays here: the bootstrap runs the copy a run before left on the
target when it hashes to exactly ours, so the hello and the first requests go alone; only without one (the first
run, a copy it may not trust) does it ask, and that start costs one round trip more. Calls may be
pipelined (`submit`, then `Pending.result`); every call has a timeout on our side too, and a dead
pipe or a stalled reply raises TransportError and closes the agent (its stdin closes, so it exits
and kills what it was running).
"""

from __future__ import annotations

import functools
import importlib.machinery
import json
import marshal
import struct
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from importlib.util import MAGIC_NUMBER
from pathlib import Path
from typing import Any, Generic, TypeVar

from deployer.agent.pipe import CHUNK, STDERR_SETTLE_S, Pipe
from deployer.agent.protocol import (
    DEFAULT_TIMEOUT_S,
    ENVELOPE,
    GET_MAX,
    IO_TIMEOUT_S,
    Batch,
    BatchResult,
    Cancel,
    ExecResult,
    Get,
    Hello,
    HelloRequest,
    Http,
    HttpResult,
    Put,
    PutReply,
    Request,
    Run,
    Stat,
    StatEntry,
    sha256_hex,
)
from deployer.agent.sendwatch import SendWatch
from deployer.command import quote
from deployer.errors import AgentLost, DeployerError, RequestSkipped, TransportError
from deployer.waiting import waited

AGENT_FILE = Path(__file__).with_name("agent.py")
HEADER = struct.Struct(">I")
MAX_REPLY = 256 << 20  # a reply larger than this is a broken stream, not data
MAX_DEPTH = 10  # the agent's deepest reply (batch > results > reply > result > entries > entry) is 7 deep

T = TypeVar("T")


@functools.cache
def agent_source() -> bytes:
    return AGENT_FILE.read_bytes()


_code_lock = threading.Lock()  # one compile a process: two blobs could differ in length from the bootstrap's count


def agent_code() -> bytes:
    """The agent as this python's bytecode, marshalled and compressed: what this python itself runs for the source,
    its cached .pyc when that is current by Python's own rule (recorded mtime and size), else a compile of the
    file. A target python that reads this bytecode runs it and skips compiling the source (~10 ms of every agent
    start there). Made once a process, while the SSH handshake waits (transport/factory.py)."""
    with _code_lock:
        return _compiled()


@functools.cache
def _compiled() -> bytes:
    loader = importlib.machinery.SourceFileLoader("deployer.agent.agent", str(AGENT_FILE))
    return zlib.compress(marshal.dumps(loader.get_code(loader.name)), 1)  # level 1: half the CPU of 6, 8% larger


def agent_payload() -> bytes:
    """What the bootstrap reads off stdin before the protocol: the source, then agent_code()."""
    return agent_source() + agent_code()


# What the agent's python runs under, in the process group its start made (sshd's session for the exec, or
# local_pipe's): the moment that python exits, whatever it left in the group goes too (a wrapper's background
# child). The commands the agent runs, and the services a run starts, are in groups of their own: no kill here
# reaches them. No sh here keeps stdin, stdout or stderr open: their ends are still the python's own. A python
# that never ran the agent is killed with its group by our side (Pipe.close). POSIX sh, one line, no `!`: a login
# shell of the csh family runs it too.
ENDS_WITH_THE_RUN = 'exec 3<&0; "$@" <&3 3<&- & exec 3<&- <&- >&- 2>&-; wait; kill -9 0'


# The bootstrap's ask for the source, when it found no copy it may run (cached=True): the first frame the client
# reads. The client answers with SOURCE_FOLLOWS and the payload, behind whatever requests it had pipelined: a frame
# header no request has (the agent refuses any frame over its 64 MiB), so the bootstrap keeps those requests for the
# agent and knows where the source starts.
SOURCE_WANTED = {"want": "source"}
SOURCE_FOLLOWS = HEADER.pack(0xFFFFFFFF)
# Where the bootstrap keeps the agent (cached=True), under the home of the user it runs as: $XDG_CACHE_HOME or
# ~/.cache as that user's own programs find them, when $HOME is that user's (sudo may keep the caller's), else the
# password database's home. The name holds the sha256 of the payload, the one it is checked against.
_CACHED = """
def where():
 u=os.geteuid();e=os.environ;h=e.get('HOME','')
 try:
  mine=h[:1]=='/' and os.stat(h).st_uid==u
 except OSError:
  mine=False
 x=e.get('XDG_CACHE_HOME','') if mine else ''
 if x[:1]!='/':
  if not mine:
   import pwd;h=pwd.getpwuid(u).pw_dir
  x=h+'/.cache'
 return x+'/deployer'
def look(d):
 u=os.geteuid();g=os.open(d,os.O_RDONLY|os.O_DIRECTORY|os.O_NOFOLLOW);b=b''
 try:
  s=os.fstat(g)
  f=s.st_uid==u and not s.st_mode&0o22 and os.open('agent-'+H,os.O_RDONLY|os.O_NOFOLLOW|os.O_NONBLOCK,dir_fd=g)
 finally:
  os.close(g)
 if f is False:
  return b
 try:
  s=os.fstat(f)
  while s.st_mode&0o170000==0o100000 and s.st_uid==u and not s.st_mode&0o22 and s.st_size==n:
   c=os.read(f,n+1-len(b))
   if not c:
    break
   b+=c
 finally:
  os.close(f)
 import hashlib
 return b if hashlib.sha256(b).hexdigest()==H else b''
d=A=None
try:
 d=where();A=look(d)
except Exception:
 pass
AGENT_CACHED=A is not None and len(A)==n;AGENT_PENDING=b'';AGENT_KEEP=None
if not AGENT_CACHED:
 os.write(1,W);F=[]
 while 1:
  h=r(4)
  if len(h)<4 or h==M:
   break
  F.append(h+r(int.from_bytes(h,'big')))
 A=r(n);AGENT_PENDING=b''.join(F);AGENT_KEEP=d and (d+'/agent-'+H,A)
"""


# Said by a bootstrap whose payload was cut short; in every agent's command line, so a pid read back is known for one.
CUT_SHORT = "deployer agent: source cut short"


def bootstrap_argv(python: str, within: Sequence[str] = (), *, cached: bool = False) -> list[str]:
    """The argv that starts the agent: python gets the payload (the source, then agent_code()), runs that bytecode
    when its own magic number is this python's (it reads the same bytecode), else compiles the source; the rest of
    stdin, read through the same buffered reader, is the protocol. -I -S: no PYTHON* variables, user site or site
    hooks can change what runs. `within` is what runs that python somewhere else on the host and passes stdin
    through (`podman exec -i NAME`); ENDS_WITH_THE_RUN runs on the host, around it. One line, the program's
    newlines escaped in a string: a login shell of the csh family refuses a newline inside quotes.

    The payload is read off stdin (the client sends it first: start(source_ahead=True)), or, cached=True, from the
    copy a run before left on the target (_CACHED), when that copy is the user's own, in a directory that is the
    user's own and no one else can write, and its bytes, read once from the descriptor they are run from, hash to
    exactly the payload's sha256, which this argv carries; else the bootstrap asks for it (SOURCE_WANTED) and the
    agent keeps what comes for the next run (agent.py's `_keep`). The hello's sha256 names the source either way."""
    size, code_size = len(agent_source()), len(agent_code())
    payload = size + code_size
    if cached:
        fetch = (f"import os\nr=sys.stdin.buffer.read;n={payload};H={sha256_hex(agent_payload())!r};"
                 f"W={_frame(SOURCE_WANTED)!r};M={SOURCE_FOLLOWS!r}{_CACHED}")
    else:
        fetch = f"r=sys.stdin.buffer.read;A=r({payload})\n"
    program = (f"{fetch}len(A)=={payload} or sys.exit({CUT_SHORT!r})\n"
               f"AGENT_SOURCE=A[:{size}];C=A[{size}:];A=None\n"
               "B=None\n"
               f"if getattr(sys.modules.get('_frozen_importlib_external'),'MAGIC_NUMBER',None)=={MAGIC_NUMBER!r}:\n"
               " try:\n  import marshal,zlib;B=marshal.loads(zlib.decompress(C))\n except Exception:\n  pass\n"
               "AGENT_BYTECODE=B is not None\n"
               "exec(B if AGENT_BYTECODE else compile(AGENT_SOURCE,'deployer-agent','exec'))")
    return ["sh", "-c", ENDS_WITH_THE_RUN, "sh", *within, python, "-I", "-S", "-c", f"import sys;exec({program!r})"]


def _frame(message: Mapping[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode("ascii")
    return HEADER.pack(len(body)) + body


def bootstrap_command(python: str, prefix: Sequence[str] = ()) -> str:
    """The shell line an exec channel runs; prefix is e.g. ("sudo", "-n", "--")."""
    return quote([*prefix, *bootstrap_argv(python)])


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


class NeverStarted(AgentLost):
    """What a pipe's read raises when the far end ended before the agent ran and the pipe knows why (a
    container's exec: the container stopped, the engine missing). That reason is the failure, said first."""


class Pending(Generic[T]):
    """A request on its way; result() waits for its reply (bounded)."""

    def __init__(self, client: AgentClient, request: Request[T], request_id: int) -> None:
        self._client = client
        self.request = request
        self.id = request_id
        self._done = threading.Event()
        self._reply: dict[str, Any] | None = None
        self._failure: str | None = None
        self._started = True  # False: the agent never ran, and the failure says why on its own

    def _resolve(self, reply: dict[str, Any] | None, failure: str | None = None, *, started: bool = True) -> None:
        self._reply, self._failure, self._started = reply, failure, started
        self._done.set()

    def result(self, timeout: float | None = None) -> T:
        if self.request.op != "hello":  # replies come in order: the hello's is there first
            self._client.verified()
        limit = self.request.reply_timeout() if timeout is None else timeout
        if not waited(self._done.wait, limit):
            self._client.abort(f"'{self.request.op}' did not finish within {limit:g}s (no reply from the agent)")
            raise TransportError(f"{self._client.name}: '{self.request.op}' did not finish within {limit:g}s "
                                 "(no reply from the agent); closed the agent")
        if self._reply is None and not self._started:  # so a caller knows nothing it sent ran
            raise NeverStarted(f"{self._client.name}: {self._failure}")
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


    def declined(self, timeout: float | None = None) -> str | None:
        """Wait for the reply: None when the request succeeded; the agent's reason when it answered that it
        refused it or did not run it (an `after` that failed). A reply that never came raises as in result()."""
        try:
            self.result(timeout)
        except TransportError as exc:
            if self._reply is None or self._reply.get("ok") is not False:  # no answer, or one that is broken
                raise
            return str(exc)
        return None


class AgentClient:
    """Typed calls to one agent over one pipe. Thread-safe; replies are matched by id."""

    def __init__(self, pipe: Pipe, *, name: str = "agent") -> None:
        self.name = name
        self._pipe = pipe
        self._write_lock = threading.Lock()
        self._send_watch = SendWatch(name, self.abort)
        self._state_lock = threading.Lock()
        self._pending: dict[int, Pending[Any]] = {}
        self._next_id = 0
        self._dead: str | None = None  # why no more calls can be made
        self._never_ran = False  # ... and it is why the agent never started (its reason says it all)
        self._closed = False
        self._reader = threading.Thread(target=self._read_loop, name=f"agent-reader-{name}", daemon=True)
        self.hello: Hello | None = None
        self._hello: Pending[Hello] | None = None
        self._hello_timeout = IO_TIMEOUT_S
        self._hello_lock = threading.Lock()
        self.on_hello: Callable[[Hello], None] | None = None  # told once the hello checked out
        self._source_wanted = False  # the first frame may be the bootstrap asking for the source (see start)
        self.bytes_sent = 0  # everything written to the pipe: what a far link carries for us
        # Told the stderr of a start that ended before the hello: the failure that says why in the operator's
        # terms (a python the host does not have), or None for the lost agent it otherwise is.
        self.why_never_ran: Callable[[str], DeployerError | None] | None = None

    # -- starting ----------------------------------------------------------------------------

    def start(self, timeout: float = IO_TIMEOUT_S, *, wait: bool = True, source_ahead: bool = True) -> AgentClient:
        """Send the source and a hello in one write; check the agent runs exactly our source, now or
        (wait=False) when the first reply is read, so the hello shares the first requests' round trip.
        source_ahead=False, for a bootstrap_argv(cached=True): the hello goes alone, and the source only when the
        bootstrap asks for it (it found no copy of the agent it may run), one round trip later."""
        self._source_wanted = not source_ahead
        self._reader.start()
        self._hello_timeout = timeout
        try:
            self._hello = self._enqueue(HelloRequest(), prefix=agent_payload() if source_ahead else b"",
                                        timeout=timeout)
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
            except AgentLost:
                why = self._why_never_ran()
                self.close()
                if why is not None:
                    raise why from None
                raise
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

    def _why_never_ran(self) -> DeployerError | None:
        if self.why_never_ran is None or self.hello is not None:
            return None
        # Its stderr is read once its output ended (the reader's end): a failed first write can come first.
        self._reader.join(STDERR_SETTLE_S)
        return self.why_never_ran(self._pipe.stderr_tail())

    # -- calls -------------------------------------------------------------------------------

    def submit(self, request: Request[T], timeout: float | None = None,
               after: Pending[Any] | Sequence[Pending[Any]] | None = None) -> Pending[T]:
        """Send without waiting (pipelining); replies come back in order. With `after`, the agent runs it
        only if that request (each of those) succeeded, else its reply says it was skipped."""
        return self._enqueue(request, timeout=timeout, after=after)

    def skip(self, pending: Pending[Any]) -> None:
        """Have the agent skip that request if it has not started (served out of turn; what runs now finishes;
        what depends on it is skipped too): a run stopping at a safe point takes back what it pipelined past
        it. Not waited for: the request's own reply says whether it was skipped."""
        self._enqueue(Cancel(skip=(pending.id,), kill=False))

    def call(self, request: Request[T], timeout: float | None = None) -> T:
        return self.submit(request, timeout).result(timeout)

    def run(self, argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None,
            stdin: bytes | None = None, timeout: float = DEFAULT_TIMEOUT_S, tail: int = 1 << 20) -> ExecResult:
        return self.call(Run(argv, cwd=cwd, env=env, stdin=stdin, timeout=timeout, tail=tail))

    def put(self, path: str, data: bytes, *, mode: int | None = None, keep_owner: bool = True,
            mkdirs: bool = False) -> PutReply:
        return self.call(Put(path, data, mode=mode, keep_owner=keep_owner, mkdirs=mkdirs))

    def get(self, path: str, *, max_bytes: int = GET_MAX) -> bytes | None:
        return self.call(Get(path, max_bytes=max_bytes))

    def stat(self, paths: Sequence[str], *, sha256: bool = False) -> list[StatEntry]:
        return self.call(Stat(paths, sha256=sha256))

    def http(self, url: str, *, timeout: float = 10.0, max_bytes: int = 4 << 20) -> HttpResult:
        return self.call(Http(url, timeout=timeout, max_bytes=max_bytes))

    def batch(self, requests: Sequence[Request[Any]]) -> BatchResult:
        return self.call(Batch(requests))

    # -- the wire ----------------------------------------------------------------------------

    def _enqueue(self, request: Request[T], prefix: bytes = b"", timeout: float | None = None,
                 after: Pending[Any] | Sequence[Pending[Any]] | None = None) -> Pending[T]:
        with self._state_lock:
            dead, never_ran = self._dead, self._never_ran
            if dead is None:
                self._next_id += 1
                pending = Pending(self, request, self._next_id)
                self._pending[pending.id] = pending
        if dead is not None:  # a request sent after the start failed (a write that blocked on it) says why
            raise self._why_never_ran() or AgentLost(f"{self.name}: {dead}" if never_ran else
                                                     f"{self.name}: agent is gone: {dead}")
        gate = {} if after is None else {"after": after.id} if isinstance(after, Pending) else \
            {"after": [each.id for each in after]}
        body = json.dumps({"id": pending.id, **request.wire(), **gate}, separators=(",", ":")).encode("utf-8")
        # A frozen link blocks a large write for good (the window never opens): the call's own limit bounds it,
        # its wait for the write lock included (a cancel must not wait as long as an upload ahead of it may).
        limit = request.reply_timeout() if timeout is None else timeout
        try:
            with self._send_watch.bounded(limit, f"sending '{request.op}' to the agent did not finish within "
                                                 f"{limit:g}s"), self._write_lock:
                self._write(prefix + HEADER.pack(len(body)) + body)
        except NeverStarted as exc:
            self._fail(str(exc), started=False)
        except (OSError, EOFError, ValueError) as exc:
            self._fail(f"cannot send to the agent: {exc}")
        return pending

    def _write(self, data: bytes) -> None:
        """Under the write lock."""
        self._pipe.write(data)
        self.bytes_sent += len(data)

    def _send_source(self) -> None:
        """The bootstrap's answer to a start without the source: it found no copy to run. What was pipelined is
        in the stream before it; the bootstrap keeps that for the agent."""
        limit = self._hello_timeout
        with self._send_watch.bounded(limit, f"sending the agent's source did not finish within {limit:g}s"), \
                self._write_lock:
            self._write(SOURCE_FOLLOWS + agent_payload())

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
                wanted, self._source_wanted = self._source_wanted, False  # only the first frame may ask
                if wanted and reply == SOURCE_WANTED:
                    self._send_source()
                    continue
                if problem := _envelope_problem(reply):
                    return self._fail(f"{problem}: the stream is broken")
                if not self._dispatch(reply):
                    return self.close()
        except NeverStarted as exc:
            return self._fail(str(exc), started=False)
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

    def _fail(self, reason: str, *, started: bool = True) -> None:
        """The pipe is unusable: every waiter gets the reason (with the agent's stderr, unless the agent never
        started and the reason is what the pipe made of that stderr)."""
        stderr = self._pipe.stderr_tail().strip() if started else ""
        if stderr:
            reason += f"; agent stderr: {stderr[-1000:]}"
        with self._state_lock:
            if self._dead is None:
                self._dead, self._never_ran = reason, not started
            waiting, self._pending = list(self._pending.values()), {}
        for pending in waiting:
            pending._resolve(None, reason, started=started)

    def abort(self, reason: str) -> None:
        """Give up on the agent now: every waiter fails with reason; the pipe closes in the background,
        since closing a channel on a frozen link can block as long as the link stays frozen."""
        self._fail(reason)
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        threading.Thread(target=self._pipe.close, kwargs={"kill": self.hello is None}, name=f"agent-close-{self.name}",
                         daemon=True).start()

    def close(self) -> None:
        """Close the agent's stdin: it kills what it still runs and exits. One whose hello never checked out is
        not known to be our agent, nor to read its stdin: it is killed, with all it started."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        self._fail("the client closed the agent")
        self._pipe.close(kill=self.hello is None)

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
