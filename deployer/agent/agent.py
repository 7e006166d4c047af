"""The deployer agent: a stdlib-only program that runs on the target, one per run.

It is started over ONE exec channel by the host's own python with a tiny bootstrap
(`client.bootstrap_argv`) that reads exactly this file's bytes from stdin, then the client's own bytecode of
it, and runs that bytecode when the host's python reads it (the same magic number), else compiles the bytes;
the rest of stdin is the framed protocol. Nothing is installed. Over a far link the bootstrap first looks for a
copy of both that an earlier run left in the user's cache (~/.cache/deployer/agent-<sha256 of both>), runs it
when its bytes hash to exactly what the client expects, and otherwise asks for them; the agent then keeps what
came for the next run (`_keep`).

Protocol (both ways): a frame is a 4-byte big-endian length, then that many bytes of UTF-8
JSON. A request is {"id": any, "op": str, ...fields}; its reply is {"id": same, "ok": true,
"result": {...}} or {"id": same, "ok": false, "error": {"type": str, "message": str}}. Binary
payloads travel as base64. Requests are executed one at a time in arrival order, so a client
may pipeline them and replies come back in the same order. A request may name an earlier one,
{"after": id} or {"after": [id, ...]}: it runs only if each of those succeeded (by the rule `batch`
stops on), else its reply is an error of type "skipped". So a client can pipeline a record that must
be on the target before any change together with the changes, and a commit behind every check it
needs: the order is enforced here, where the files are. Bytes that are no request (not
JSON, not an object, a frame over MAX_FRAME) get an error reply with id null, and the agent
goes on reading. Requests are data: no op evaluates
code it was sent; `run` executes an argv list without a shell.

Ops: hello, run, put, get, stat, http, batch, beat, procs, signal, premise, ready (see each `op_*` below), and cancel,
which the reader serves out of turn (see `_cancelled`). The agent never listens on a socket. It exits when its
stdin closes or its stdout breaks (or on SIGTERM/SIGHUP/SIGINT), killing the process group of any command still
running and dropping requests not yet started: a closed stdin means the client is gone. A request sent with
"detached": true (a frame of at most DETACHED_FRAME_MAX) is the exception: at the end of stdin it still runs
(in order, with its own timeout), and the agent exits once it has; its reply goes nowhere. It is how a client
leaves a last record it does not wait for (a run's seal, written after its log has ended). Services started by a
finished `run` are left alone.

One file on purpose (the design sketch split ops into ops.py): the blob sent on stdin is this
file verbatim, so the sha256 that `hello` reports is the sha256 of a file in our tree.

It must run on Python >= 3.8: annotations are never evaluated (future import), and no
runtime construct newer than 3.8 is used.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import json
import math
import os
import queue
import selectors
import signal
import stat as stat_mod
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable

TYPE_CHECKING = False  # typing's own flag would import typing: ~5 ms of every start on the target
if TYPE_CHECKING:
    from typing import IO, Any

VERSION = "1"
HEADER = struct.Struct(">I")
# A frame longer than this is refused (and skipped, so a genuine oversized request leaves the
# stream in sync). 64 MiB of JSON carries ~45 MiB of base64 payload.
MAX_FRAME = 64 << 20
DEFAULT_TIMEOUT_S = 120.0
CANCEL_FRAME_MAX = 256  # a frame this small may be a `cancel`, which is served out of turn
DETACHED_FRAME_MAX = 64 << 10  # a detached request is at most this large (the reader looks into it)
DEFAULT_TAIL = 1 << 20  # bytes kept per output stream of `run`
DEFAULT_GET_MAX = 16 << 20
KEEP_OTHERS = 8  # copies of other agents (other deployer versions) the cache keeps beside the one just written
KEEP_WAIT_S = 5.0  # how long the end of stdin waits for a copy being written, so a short run leaves one too
DEFAULT_HTTP_MAX = 4 << 20
HTTP_METHODS = ("GET", "POST", "PUT", "DELETE")  # a router's worker calls add POST and DELETE to the probes' GET
HTTP_LINE_MAX = 65536  # a status or header line longer than this is no answer of a server on this host
HTTP_HEADERS_MAX = 100
# After a command's leader exits, how long background children holding its stdout/stderr
# open (a started daemon) may keep us waiting for EOF.
LEADER_EXIT_GRACE_S = 1.0
# After a kill, how long to keep draining what the dying group still writes.
KILL_GRACE_S = 2.0
CHUNK = 65536
SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL, "INT": signal.SIGINT, "HUP": signal.SIGHUP}
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
CMDLINE_MAX = 4096
FILE_TYPES = ((stat_mod.S_ISREG, "file"), (stat_mod.S_ISDIR, "dir"), (stat_mod.S_ISLNK, "symlink"))
# sock_diag (linux/sock_diag.h, inet_diag.h): a dump of one family's TCP sockets in the states asked for.
DIAG_PROTOCOL = 4  # NETLINK_SOCK_DIAG
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP, NLMSG_DONE = 0x1, 0x300, 3
TCP_LISTEN = 10
NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, seq, pid
DIAG_REQUEST = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states; then a zeroed 48-byte socket id
DIAG_MSG_SIZE = 72  # family, state, timer, retrans, the 48-byte id (sport first), expires, rqueue, wqueue, uid, inode
DIAG_TIMEOUT_S = 2.0


class OpError(Exception):
    """A request that could not be carried out; becomes an error reply, never a crash."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# -- request fields ------------------------------------------------------------------------


def _field(req: dict[str, Any], name: str, types: Any, default: Any = None, required: bool = False) -> Any:
    if name not in req or req[name] is None:
        if required:
            raise OpError("bad_request", f"missing field '{name}'")
        return default
    value = req[name]
    # bool is an int to isinstance; a timeout of `true` is a client bug, not 1 second.
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise OpError("bad_request", f"field '{name}' must be {_names(types)}, not a boolean")
    if not isinstance(value, types):
        raise OpError("bad_request", f"field '{name}' must be {_names(types)}, not {type(value).__name__}")
    return value


def _names(types: Any) -> str:
    seq = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in seq)


def _abs_path(req: dict[str, Any], name: str = "path") -> str:
    path: str = _field(req, name, str, required=True)
    if not path.startswith("/") or "\0" in path:
        raise OpError("bad_request", f"field '{name}' must be an absolute path without NUL: {path!r}")
    return path


def _str_list(req: dict[str, Any], name: str) -> list[str]:
    items: list[str] = _field(req, name, list, required=True)
    if not all(isinstance(item, str) for item in items):
        raise OpError("bad_request", f"field '{name}' must be a list of strings")
    return items


def _b64(req: dict[str, Any], name: str) -> bytes | None:
    text = _field(req, name, str)
    if text is None:
        return None
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise OpError("bad_request", f"field '{name}' is not valid base64") from None


def _positive(req: dict[str, Any], name: str, default: float) -> float:
    value = float(_field(req, name, (int, float), default))
    # JSON admits NaN and Infinity; a NaN deadline would never pass.
    if not (value > 0 and math.isfinite(value)):
        raise OpError("bad_request", f"field '{name}' must be a finite number > 0")
    return value


def _enc(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# -- run -----------------------------------------------------------------------------------


class _Tail:
    """The last `limit` bytes of a stream and how many bytes it carried in all."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self._buf = bytearray()

    def add(self, data: bytes) -> None:
        self.total += len(data)
        self._buf += data
        if len(self._buf) > self.limit:
            del self._buf[:len(self._buf) - self.limit]

    def value(self) -> bytes:
        return bytes(self._buf)


class Agent:
    def __init__(self, source: bytes, proto_in: IO[bytes], proto_out: IO[bytes], *, bytecode: bool = False,
                 cached: bool = False) -> None:
        self.source = source
        self.bytecode = bytecode  # the bootstrap ran the client's bytecode of source (no compile here)
        self.cached = cached  # the bootstrap ran the copy an earlier run left (no source sent this time)
        self._in = proto_in
        self._out = proto_out
        self._out_lock = threading.Lock()
        self._groups_lock = threading.Lock()
        self._groups: set[int] = set()  # process groups of commands running now
        self._beats: dict[str, threading.Event] = {}  # heartbeat files touched by a thread, by path
        self._succeeded: set[Any] = set()  # ids of the requests that succeeded, for "after"
        self._taken_back: set[Any] = set()  # ids of requests to skip unless already started (see `_cancelled`)
        self._gone = False  # stdin ended: only detached requests still run
        self._running_detached = False  # the request running now was sent detached
        self._detached_sent = False  # stdin held a detached request: its end waits for them
        self.keeping: threading.Thread | None = None  # the copy of this agent being left for the next run (_keep)
        self._ops: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "hello": self.op_hello, "run": self.op_run, "put": self.op_put, "get": self.op_get,
            "stat": self.op_stat, "http": self.op_http, "batch": self.op_batch, "beat": self.op_beat,
            "procs": self.op_procs, "signal": self.op_signal, "premise": self.op_premise, "ready": self.op_ready,
        }

    # -- the loop ------------------------------------------------------------------------

    def serve(self) -> None:
        """Read frames on this thread, execute them in order on a worker; exit on EOF."""
        # Requests, or replies ready-made by this thread (kept in line so replies stay in order).
        work: queue.Queue[bytes | dict[str, Any]] = queue.Queue()
        worker = threading.Thread(target=self._work, args=(work,), name="agent-worker", daemon=True)
        worker.start()
        while True:
            header = self._read_exact(HEADER.size)
            if header is None:
                break
            (length,) = HEADER.unpack(header)
            if length > MAX_FRAME:
                # Answer at once, then skip the declared bytes: when they really follow, the
                # stream stays in sync and the next request is served.
                work.put(_error("frame_too_large", f"frame of {length} bytes exceeds the "
                                f"{MAX_FRAME} byte limit; skipped", frame=True))
                if not self._skip(length):
                    break
                continue
            body = self._read_exact(length)
            if body is None:
                break
            if length <= CANCEL_FRAME_MAX and self._cancelled(body):
                continue  # answered at once, out of turn: it is how a client stops what runs now
            self._detached_sent = self._detached_sent or (length <= DETACHED_FRAME_MAX and _detached(body))
            work.put(body)
        self._client_gone(work)

    def _client_gone(self, work: queue.Queue[Any]) -> None:
        """The end of stdin: what runs now is killed and what waits is dropped, but for detached requests, which
        run to their end first (see the module's docstring). Without any, the agent leaves at once, as ever: a
        cut run's agent must not linger (its lock's heartbeat beats while it lives)."""
        if self.keeping is not None:
            self.keeping.join(KEEP_WAIT_S)
        if not self._detached_sent:
            self.shutdown(0)
        self._gone = True
        if not self._running_detached:
            with self._groups_lock:
                groups = list(self._groups)
            for pgid in groups:
                _kill_group(pgid)
        drained = threading.Event()
        work.put(drained)
        drained.wait(DEFAULT_TIMEOUT_S)
        self.shutdown(0)

    def _cancelled(self, body: bytes) -> bool:
        """A `cancel` request is served by the reader, not queued: it kills the groups of the commands
        running now (their replies then say so), so the requests queued behind them can run. With
        "skip": [id, ...], those requests are skipped if they have not started (a client stopping at a safe
        point takes back what it pipelined past it; what depends on them is skipped by the "after" rule), and
        with "kill": false what runs now finishes."""
        try:
            req = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return False
        if not isinstance(req, dict) or req.get("op") != "cancel":
            return False
        skip = req.get("skip")
        if isinstance(skip, list):
            self._taken_back.update(each for each in skip
                                    if isinstance(each, (int, str)) and not isinstance(each, bool))
        groups: list[int] = []
        if req.get("kill", True) is not False:
            with self._groups_lock:
                groups = list(self._groups)
            for pgid in groups:
                _kill_group(pgid)
        self._reply({"id": req.get("id"), "ok": True, "result": {"killed": len(groups)}})
        return True

    def _work(self, work: queue.Queue[Any]) -> None:
        while True:
            item = work.get()
            if isinstance(item, threading.Event):  # the reader's mark, behind the last request stdin held
                item.set()
                return
            self._reply(self.handle(item) if isinstance(item, bytes) else item)

    def _read_exact(self, size: int) -> bytes | None:
        # A BufferedReader's read(n) loops until n bytes or EOF; the bootstrap read the source
        # through this same reader, so protocol bytes it buffered ahead are not lost.
        data = self._in.read(size) if size else b""
        return data if len(data) == size else None

    def _skip(self, size: int) -> bool:
        while size:
            chunk = self._in.read(min(size, CHUNK))
            if not chunk:
                return False
            size -= len(chunk)
        return True

    def _reply(self, reply: dict[str, Any]) -> None:
        body = json.dumps(reply, separators=(",", ":")).encode("ascii")
        try:
            with self._out_lock:
                self._out.write(HEADER.pack(len(body)) + body)
                self._out.flush()
        except (OSError, ValueError):
            if not self._gone:  # else the reader exits once the detached requests ran
                self.shutdown(1)  # our reader is gone: nobody will ever see a reply again

    def shutdown(self, code: int) -> None:
        """Kill the groups of commands still running, then leave without waiting for anyone."""
        with self._groups_lock:
            groups = list(self._groups)
        for pgid in groups:
            _kill_group(pgid)
        os._exit(code)

    # -- dispatch ------------------------------------------------------------------------

    def handle(self, body: bytes) -> dict[str, Any]:
        try:
            req = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            return _error("bad_frame", f"not JSON: {exc}", frame=True)
        if not isinstance(req, dict):
            return _error("bad_frame", "a request must be a JSON object", frame=True)
        request_id = req.get("id")
        self._running_detached = self._detached_sent and req.get("detached") is True
        if self._gone and not self._running_detached:
            return {"id": request_id, **_error("skipped", "the client is gone")}
        if isinstance(request_id, (int, str)) and request_id in self._taken_back:
            return {"id": request_id, **_error("skipped", "the client canceled it before it started")}
        after = req.get("after")
        needs = after if isinstance(after, list) else [] if after is None else [after]
        failed = [need for need in needs if not isinstance(need, (int, str)) or need not in self._succeeded]
        if failed:
            why = f"request {failed[0]!r}, which it depends on, did not succeed"
            return {"id": request_id, **_error("skipped", why)}
        result = self.execute(req)
        if not _failed(req, result):
            self._succeeded.add(req.get("id"))
        return {"id": req.get("id"), **result}

    def execute(self, req: dict[str, Any]) -> dict[str, Any]:
        """{"ok": true, "result": ...} or {"ok": false, "error": ...}; never raises."""
        try:
            op = _field(req, "op", str, required=True)
            func = self._ops.get(op)
            if func is None:
                raise OpError("unknown_op", "unknown op {!r} (known: {})".format(op, ", ".join(sorted(self._ops))))
            return {"ok": True, "result": func(req)}
        except OpError as exc:
            return _error(exc.kind, str(exc))
        except Exception as exc:  # a bug or an odd OS state: report it, keep serving
            return _error("internal", f"{type(exc).__name__}: {exc}")

    # -- ops -----------------------------------------------------------------------------

    def op_hello(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"version": VERSION, "sha256": hashlib.sha256(self.source).hexdigest(),
                "python": ".".join(map(str, sys.version_info[:3])), "executable": sys.executable,
                "pid": os.getpid(), "uid": os.getuid(), "gid": os.getgid(), "euid": os.geteuid(),
                "bytecode": self.bytecode, "cached": self.cached}

    def op_beat(self, req: dict[str, Any]) -> dict[str, Any]:
        """path, interval_s: touch path every interval_s seconds for as long as this agent lives (0 stops).

        A lock's heartbeat that costs no round trip, is never queued behind a long command, and stops
        by itself when the client is gone (the agent exits on EOF), so a dead run's lock turns stale.
        A file that disappears (the lock was released) is not created again. The first touch writes this agent's
        pid into it: a run killed before it read the agent's hello leaves no pid in its log, and recover must still
        know which agent to wait for before it takes the lock over."""
        path = _abs_path(req)
        interval = _field(req, "interval_s", (int, float), 0)
        if isinstance(interval, bool) or not math.isfinite(interval) or interval < 0:
            raise OpError("bad_request", "field 'interval_s' must be a finite number >= 0")
        previous = self._beats.pop(path, None)
        if previous is not None:
            previous.set()
        touched = False
        if interval > 0:
            touched = _stamp(path)
            stop = threading.Event()
            self._beats[path] = stop
            threading.Thread(target=self._beat, args=(path, float(interval), stop), daemon=True,
                             name="agent-beat").start()
        return {"path": path, "interval_s": interval, "touched": touched}

    @staticmethod
    def _beat(path: str, interval: float, stop: threading.Event) -> None:
        while not stop.wait(interval) and _touch(path):
            pass

    def op_run(self, req: dict[str, Any]) -> dict[str, Any]:
        """argv (no shell), cwd, env (merged over ours), stdin (b64), timeout (s), tail (bytes
        kept per stream), expect_stdout (b64: the exact output that counts as success, beside exit 0),
        numstat_within ({"files"|"insertions"|"deletions": [min, max] or null}: the output is a
        `git diff --numstat -z` whose totals must lie within those, and show a change, to count as success).
        Its own session: on timeout the whole group is killed."""
        argv = _str_list(req, "argv")
        if not argv:
            raise OpError("bad_request", "field 'argv' must not be empty")
        cwd = _field(req, "cwd", str)
        env_add = _field(req, "env", dict, {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env_add.items()):
            raise OpError("bad_request", "field 'env' must map strings to strings")
        stdin = _b64(req, "stdin")
        expect = _b64(req, "expect_stdout")
        within = _field(req, "numstat_within", dict)
        timeout = _positive(req, "timeout", DEFAULT_TIMEOUT_S)
        tail = int(_positive(req, "tail", DEFAULT_TAIL))
        env = dict(os.environ)
        env.update(env_add)
        started = time.monotonic()
        try:
            # Under the lock: a shutdown racing this start still finds the new group to kill.
            with self._groups_lock:
                proc = subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=True,
                                        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                self._groups.add(proc.pid)
        except OSError as exc:
            # What a shell would say: the command is not there (127) or not runnable (126).
            code = 127 if exc.errno in (errno.ENOENT, errno.ENOTDIR) else 126
            message = ("cannot run " + argv[0] + (f" in {cwd}" if cwd else "") + f": {exc.strerror}\n").encode()
            return {"exit_code": code, "timed_out": False, "duration_s": time.monotonic() - started,
                    "stdout": "", "stderr": _enc(message), "stdout_bytes": 0, "stderr_bytes": len(message)}
        try:
            out, err, timed_out = self._drive(proc, stdin, started + timeout, tail)
        finally:
            with self._groups_lock:
                self._groups.discard(proc.pid)
        result = {"exit_code": proc.returncode, "timed_out": timed_out,
                  "duration_s": time.monotonic() - started,
                  "stdout": _enc(out.value()), "stderr": _enc(err.value()),
                  "stdout_bytes": out.total, "stderr_bytes": err.total}
        if expect is not None:
            result["expected"] = out.total == len(expect) and out.value() == expect
        if within is not None:
            result["expected"] = out.total == len(out.value()) and _numstat_within(out.value(), within)
        return result

    def _drive(self, proc: subprocess.Popen[bytes], stdin: bytes | None, deadline: float,
               tail: int) -> tuple[_Tail, _Tail, bool]:
        """Feed stdin and drain both outputs in one loop, in bounded memory, until the streams
        close (or a grace after the leader exits), killing the group at the deadline."""
        out, err = _Tail(tail), _Tail(tail)
        sel = selectors.DefaultSelector()
        assert proc.stdout is not None and proc.stderr is not None
        sel.register(proc.stdout.fileno(), selectors.EVENT_READ, out)
        sel.register(proc.stderr.fileno(), selectors.EVENT_READ, err)
        pending = memoryview(stdin or b"")
        if proc.stdin is not None:
            os.set_blocking(proc.stdin.fileno(), False)
            if pending:
                sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, None)
            else:
                proc.stdin.close()
        timed_out = False
        stop_at: float | None = None  # when to stop waiting for the streams to close
        try:
            while sel.get_map():
                now = time.monotonic()
                if not timed_out and now >= deadline:
                    timed_out = True
                    _kill_group(proc.pid)
                    stop_at = now + KILL_GRACE_S
                if stop_at is None and proc.poll() is not None:
                    stop_at = now + LEADER_EXIT_GRACE_S
                if stop_at is not None and now >= stop_at:
                    break
                limit = deadline if stop_at is None else stop_at
                # Wake now and then to notice the leader's exit while a child keeps a pipe open.
                for key, _ in sel.select(max(0.0, min(limit - now, 0.05))):
                    if key.data is None:
                        pending = self._feed(sel, proc, pending)
                        continue
                    chunk = os.read(key.fd, CHUNK)
                    if chunk:
                        key.data.add(chunk)
                    else:
                        sel.unregister(key.fd)
            if not timed_out:
                remaining = deadline - time.monotonic()
                try:
                    proc.wait(max(remaining, 0.0))
                except subprocess.TimeoutExpired:
                    timed_out = True
                    _kill_group(proc.pid)
            if timed_out:
                proc.wait()
        finally:
            sel.close()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
        return out, err, timed_out

    @staticmethod
    def _feed(sel: selectors.BaseSelector, proc: subprocess.Popen[bytes], pending: memoryview) -> memoryview:
        assert proc.stdin is not None
        try:
            written = os.write(proc.stdin.fileno(), pending[:CHUNK])
        except BlockingIOError:
            return pending
        except BrokenPipeError:
            written = len(pending)  # the command stopped reading; its exit code says the rest
        pending = pending[written:]
        if not pending:
            sel.unregister(proc.stdin.fileno())
            proc.stdin.close()
        return pending

    def op_put(self, req: dict[str, Any]) -> dict[str, Any]:
        """Atomically replace path: temp file beside it, write, fsync, sha256 of what is on
        disk, owner and mode kept, rename, fsync of the directory. With `temp` (a name beside path that the
        client derived), stage only: the same, into that temp, and no rename (the client renames it later)."""
        path = _abs_path(req)
        temp = _field(req, "temp", str)
        if temp is not None and not (os.path.dirname(temp) == os.path.dirname(path) and
                                     os.path.basename(temp).startswith(".") and temp.endswith(".tmp")):
            raise OpError("bad_request", f"field 'temp' must name a hidden .tmp file beside {path}, not {temp!r}")
        data = _b64(req, "data")
        if data is None:
            raise OpError("bad_request", "missing field 'data'")
        expected = _field(req, "sha256", str, required=True)
        if hashlib.sha256(data).hexdigest() != expected:
            raise OpError("corrupt", f"the received bytes of {path} do not match sha256 {expected}")
        mode = _field(req, "mode", int)
        if mode is not None and not 0 <= mode <= 0o7777:
            raise OpError("bad_request", f"field 'mode' must be within 0..0o7777, not {mode:#o}")
        keep_owner = _field(req, "keep_owner", bool, True)
        directory = os.path.dirname(path)
        created = self._make_parents(directory, _field(req, "mkdirs", bool, False))
        try:
            return self._put_into(path, directory, data, expected, mode, keep_owner, created, temp)
        except BaseException:
            for made in reversed(created):  # leave the tree as it was
                with contextlib.suppress(OSError):
                    os.rmdir(made)
            raise

    @staticmethod
    def _make_parents(directory: str, mkdirs: bool) -> list[str]:
        missing: list[str] = []
        probe = directory
        while not os.path.isdir(probe):
            if os.path.lexists(probe):
                raise OpError("not_a_directory", f"{probe} exists and is not a directory")
            missing.append(probe)
            probe = os.path.dirname(probe)
        if missing and not mkdirs:
            raise OpError("no_parent", f"directory {directory} does not exist (send mkdirs: true to create it)")
        created: list[str] = []
        try:
            for made in reversed(missing):
                os.mkdir(made)
                created.append(made)
        except OSError as exc:
            for made in reversed(created):
                os.rmdir(made)
            raise OpError("os_error", f"cannot create directory {exc.filename}: {exc.strerror}") from None
        return created

    @staticmethod
    def _put_into(path: str, directory: str, data: bytes, expected: str, mode: int | None,
                  keep_owner: bool, created: list[str], staged: str | None) -> dict[str, Any]:
        try:
            current: os.stat_result | None = os.lstat(path)
        except FileNotFoundError:
            current = None
        if current is not None and not stat_mod.S_ISREG(current.st_mode):
            raise OpError("not_a_file", f"{path} is a {_kind(current.st_mode)}; put replaces regular files only")
        if mode is None:
            mode = stat_mod.S_IMODE(current.st_mode) if current is not None else 0o644
        try:
            fd, tmp = _create_temp(directory) if staged is None else (_create_staged(staged), staged)
        except OSError as exc:
            raise OpError("os_error", f"cannot create a temp file in {directory}: {exc.strerror}") from None
        owner_kept = None
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            on_disk = _sha256_file(tmp)
            if on_disk != expected:
                raise OpError("corrupt", f"{tmp} did not verify on disk: sha256 {on_disk} != {expected}")
            if keep_owner and current is not None:
                # chown before chmod: chown clears set-id bits. Only root may give a file away.
                try:
                    os.chown(tmp, current.st_uid, current.st_gid)
                    owner_kept = True
                except PermissionError:
                    owner_kept = False
            os.chmod(tmp, mode)
            if staged is None:
                os.rename(tmp, path)
        except OSError as exc:
            _unlink_quietly(tmp)
            raise OpError("os_error", f"cannot write {path}: {exc.strerror or exc}") from None
        except BaseException:
            _unlink_quietly(tmp)
            raise
        _fsync_dir(directory)
        written = path if staged is None else tmp
        final = os.stat(written)
        return {"path": written, "sha256": expected, "size": len(data), "mode": stat_mod.S_IMODE(final.st_mode),
                "uid": final.st_uid, "gid": final.st_gid, "replaced": current is not None,
                "owner_kept": owner_kept, "created_dirs": created}

    def op_get(self, req: dict[str, Any]) -> dict[str, Any]:
        path = _abs_path(req)
        limit = int(_positive(req, "max_bytes", DEFAULT_GET_MAX))
        try:
            # O_NONBLOCK: opening a FIFO must not hang the agent; the type is checked next.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            info = os.fstat(fd)
            if not stat_mod.S_ISREG(info.st_mode):
                os.close(fd)
                raise OpError("not_a_file", f"{path} is a {_kind(info.st_mode)}, not a regular file")
            with os.fdopen(fd, "rb") as handle:
                data = handle.read(limit + 1)
        except FileNotFoundError:
            return {"path": path, "exists": False}
        except OSError as exc:
            raise OpError("os_error", f"cannot read {path}: {exc.strerror}") from None
        if len(data) > limit:
            raise OpError("too_large", f"{path} is larger than max_bytes={limit}")
        return {"path": path, "exists": True, "data": _enc(data), "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest()}

    def op_stat(self, req: dict[str, Any]) -> dict[str, Any]:
        """One entry per path, in order; a path that cannot be examined carries `error`."""
        paths = _str_list(req, "paths")
        want_hash = _field(req, "sha256", bool, False)
        for path in paths:
            if not path.startswith("/") or "\0" in path:
                raise OpError("bad_request", f"every path must be absolute without NUL: {path!r}")
        return {"entries": [_stat_one(path, want_hash) for path in paths]}

    def op_premise(self, req: dict[str, Any]) -> dict[str, Any]:
        """The premises a client built a whole batch on, checked here, where the files are; then the intent
        record written (new, durable) with what was found, so that the changes sent behind this request (run
        only if it succeeded) always have their record first.

        repo, git_dir: absolute; head_argv: the command that prints HEAD (run in repo); record: the path of the
        intent record, which must not exist yet; fields: the record's fields the client knows (run id, ...);
        files: [{dest, new_sha256, new_blob}]. Each dest must be a regular file that is its own real path
        under the repo's real path, outside the git dir, and not hold its new bytes already. The record gets
        head_before and, per file, the pre-run sha256, owner and mode. A premise that does not hold is an
        error of type "premise"; then nothing was written."""
        repo, git_dir, path = _abs_path(req, "repo"), _abs_path(req, "git_dir"), _abs_path(req, "record")
        argv = _str_list(req, "head_argv")
        fields = _field(req, "fields", dict, required=True)
        files = _field(req, "files", list, required=True)
        if os.path.lexists(path):
            raise OpError("premise", f"{path} exists: another run's intent record is on the target")
        root, inside = os.path.realpath(repo), os.path.realpath(git_dir).rstrip("/") + "/"
        found = []
        for entry in files:
            if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in ("dest", "new_sha256")):
                raise OpError("bad_request", "each of 'files' must name its dest and new_sha256")
            dest = entry["dest"]
            if dest.startswith("/") or os.path.normpath(dest) != dest or dest.split("/")[0] == "..":
                raise OpError("bad_request", f"dest {dest!r} is not a normal path inside the repo")
            where = os.path.join(repo, dest)
            try:
                # No symlink followed and no FIFO waited on; then it must be a regular file, its own real path.
                fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
            except OSError as exc:
                raise OpError("premise", f"{where}: {exc.strerror}") from None
            info, real = os.fstat(fd), os.path.realpath(where)
            if not stat_mod.S_ISREG(info.st_mode) or real != os.path.join(root, dest) or real.startswith(inside):
                os.close(fd)
                raise OpError("premise", f"{where} is not a regular file of the work tree (it resolves to {real})")
            if stat_mod.S_IMODE(info.st_mode) & ~0o777:  # a restore never sets them again: the run reads first
                os.close(fd)
                raise OpError("premise", f"{where} has a setuid, setgid or sticky bit")
            with os.fdopen(fd, "rb") as handle:
                sha256 = _sha256_of(handle)
            if sha256 == entry["new_sha256"]:
                raise OpError("premise", f"{where} holds its new bytes already")
            found.append({"dest": dest, "path": where, "existed": True, "tracked": True, "sha256": sha256,
                          "new_sha256": entry["new_sha256"], "new_blob": entry.get("new_blob"),
                          "mode": stat_mod.S_IMODE(info.st_mode), "uid": info.st_uid, "gid": info.st_gid,
                          "new_dirs": [], "before": None})
        self._ready(req)
        head = subprocess.run(argv, cwd=repo, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=60, check=False)
        if head.returncode != 0:
            raise OpError("premise", f"cannot read HEAD in {repo}")
        record = dict(fields, head_before=head.stdout.decode("ascii", "replace").strip(), files=found)
        data = json.dumps(record, indent=1).encode()
        directory = os.path.dirname(path)
        created = self._make_parents(directory, True)
        self._put_into(path, directory, data, hashlib.sha256(data).hexdigest(), 0o600, True, created, None)
        return {"head": record["head_before"], "files": found}

    def op_ready(self, req: dict[str, Any]) -> dict[str, Any]:
        """A premise's `services` and `gpus` alone, read-only (see _ready): a judgement made on the client asks
        this first, one round trip for every service, and reads each one itself only when this fails."""
        self._ready(req)
        return {}

    def _ready(self, req: dict[str, Any]) -> None:
        """A premise's `services` and `gpus` (protocol.Ready): what the steps that judge the target before any
        change (co_restart) need to find there. Each health URL that answers 200 must be served by the process
        deployer recorded (its record: "PID START", that process alive and started then); each GPU list must
        exit 0 and name every wanted index. Anything else refuses the premise: the client reads and judges."""
        for entry in _field(req, "services", list, []):
            if not isinstance(entry, dict) or not isinstance(entry.get("service"), str):
                raise OpError("bad_request", "each of 'services' must name its service")
            url, record = _field(entry, "health", str), _abs_path(entry, "record")
            if url is None or self.op_http({"url": url, "timeout": entry.get("timeout")}).get("status") != 200:
                continue
            if not _recorded_runs(record):
                raise OpError("not_ready", f"service {entry['service']}: {url} answers 200, and no live process "
                                         f"is the one {record} names")
        for entry in _field(req, "gpus", list, []):
            if not isinstance(entry, dict) or not isinstance(entry.get("service"), str):
                raise OpError("bad_request", "each of 'gpus' must name its service")
            want = _field(entry, "want", list, [])
            if not all(isinstance(index, int) and not isinstance(index, bool) and index >= 0 for index in want):
                raise OpError("bad_request", "want must be a list of GPU indices")
            done = self.op_run({"argv": entry.get("argv"), "env": entry.get("env"), "timeout": entry.get("timeout"),
                                "tail": 65536})
            lines = base64.b64decode(done["stdout"]).decode("utf-8", "replace").splitlines()
            have = [line.strip() for line in lines if line.strip()]
            if done["exit_code"] != 0 or done["timed_out"] or not all(index.isdecimal() for index in have) or \
                    not set(want) <= {int(index) for index in have}:
                raise OpError("not_ready", f"service {entry['service']}: nvidia-smi does not list GPUs {want}")

    def op_procs(self, req: dict[str, Any]) -> dict[str, Any]:
        """The processes in any of `sessions`, `groups` or `pids`, and those holding a TCP socket that listens
        on one of `ports` (any address, IPv4 or IPv6). A service is a process tree: its children may change
        their process group, or be reparented to init, and still hold its port and its GPUs. A listening
        socket whose owner this agent may not see (another user's, without root) is named in `unowned`. Never this
        agent itself: a pid read from a cut run's lock may name it in a fresh pid namespace (a restarted container)."""
        sessions, groups, pids = (set(_int_list(req, name)) for name in ("sessions", "groups", "pids"))
        ports = set(_int_list(req, "ports"))
        inodes = _listening_inodes(ports) if ports else {}
        unowned = dict(inodes)
        found: list[dict[str, Any]] = []
        own = str(os.getpid())
        for name in os.listdir("/proc"):
            if not name.isdigit() or name == own:
                continue
            info = _proc_info(int(name))
            if info is None:
                continue
            held = _sockets_held(info["pid"], inodes) if inodes else set()
            for inode in held:
                unowned.pop(inode, None)
            if info["sid"] in sessions or info["pgid"] in groups or info["pid"] in pids or held:
                info["listens"] = sorted({inodes[inode] for inode in held})
                info["cmdline"] = _cmdline(info["pid"])
                found.append(info)
        found.sort(key=lambda proc: proc["pid"])
        return {"procs": found, "unowned": sorted(set(unowned.values()))}

    def op_signal(self, req: dict[str, Any]) -> dict[str, Any]:
        """Send `sig` to each of `procs` ({pid, start}) that is still the process that started then: a pid
        recycled since it was listed is never signalled. Per pid: signalled, gone or denied."""
        name = _field(req, "sig", str, required=True)
        if name not in SIGNALS:
            raise OpError("bad_request", "sig must be one of {}".format(", ".join(sorted(SIGNALS))))
        targets = _field(req, "procs", list, required=True)
        outcomes: dict[str, str] = {}
        for target in targets:
            if not isinstance(target, dict) or not isinstance(target.get("pid"), int) \
                    or not isinstance(target.get("start"), str) or target["pid"] <= 1:
                raise OpError("bad_request", "each of procs must be {pid: int > 1, start: str}")
            pid = target["pid"]
            now = _proc_info(pid)
            if now is None or now["start"] != target["start"] or now["state"] == "Z":
                outcomes[str(pid)] = "gone"
                continue
            try:
                os.kill(pid, SIGNALS[name])
                outcomes[str(pid)] = "signalled"
            except ProcessLookupError:
                outcomes[str(pid)] = "gone"
            except PermissionError:
                outcomes[str(pid)] = "denied"
        return {"outcomes": outcomes}

    def op_http(self, req: dict[str, Any]) -> dict[str, Any]:
        """An HTTP request on this host's loopback: GET by default; POST/PUT/DELETE (a router's worker calls)
        with an optional JSON body. No response at all (or one that is no HTTP) is `status: null` plus `error`."""
        # Here, not at the top: most runs never fetch (see _exchange for why not http.client).
        from urllib.parse import urlsplit

        url = _field(req, "url", str, required=True)
        method = _field(req, "method", str, "GET")
        if method not in HTTP_METHODS:
            raise OpError("bad_request", f"method {method!r} is not one of {', '.join(HTTP_METHODS)}")
        payload = None
        if "json" in req and req["json"] is not None:
            payload = json.dumps(req["json"]).encode()
        timeout = _positive(req, "timeout", 10.0)
        limit = int(_positive(req, "max_bytes", DEFAULT_HTTP_MAX))
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise OpError("bad_request", f"only http://<loopback>/... URLs are fetched, not {url!r}")
        try:
            port = parts.port or 80
        except ValueError:
            raise OpError("bad_request", f"bad port in {url!r}") from None
        address = _loopback_address(parts.hostname, port)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc.rsplit('@', 1)[-1]}", "Connection: close",
                "Accept-Encoding: identity"]
        if payload is not None:
            head.append("Content-Type: application/json")
        if payload is not None or method in ("POST", "PUT"):
            head.append(f"Content-Length: {len(payload or b'')}")
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (payload or b"")
        try:
            status, headers, answer = _exchange(address, port, request, timeout, limit + 1)
        except (OSError, _NotHttp) as exc:
            return {"url": url, "status": None, "error": f"{type(exc).__name__}: {exc}"}
        return {"url": url, "status": status, "body": _enc(answer[:limit]), "truncated": len(answer) > limit,
                "content_type": headers.get("content-type")}

    def op_batch(self, req: dict[str, Any]) -> dict[str, Any]:
        """Run `requests` in order; stop after the first failure: an op error, a `run` that
        exited non-zero, timed out or printed other than its expect_stdout, or an `http` with no
        response or a status >= 400,
        unless that request says `check: false`."""
        requests = _field(req, "requests", list, required=True)
        results: list[dict[str, Any]] = []
        failed: int | None = None
        for index, sub in enumerate(requests):
            if not isinstance(sub, dict):
                result = _error("bad_request", "a request must be an object")
            elif sub.get("op") == "batch":
                result = _error("bad_request", "a batch cannot hold a batch")
            else:
                result = self.execute(sub)
            results.append(result)
            if _failed(sub, result):
                failed = index
                break
        return {"results": results, "failed": failed}


def _error(kind: str, message: str, *, frame: bool = False) -> dict[str, Any]:
    """An error result; `frame` marks a reply to bytes that were no request (its id is null)."""
    reply: dict[str, Any] = {"id": None} if frame else {}
    reply.update(ok=False, error={"type": kind, "message": message})
    return reply


def _detached(body: bytes) -> bool:
    """Whether a frame is a request sent detached (see the module's docstring)."""
    try:
        req = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    return isinstance(req, dict) and req.get("detached") is True


def _failed(sub: Any, result: dict[str, Any]) -> bool:
    if not result["ok"]:
        return True
    if sub.get("check", True) is False:
        return False
    body = result["result"]
    if sub.get("op") == "batch":
        return body["failed"] is not None
    if sub.get("op") == "run":
        return bool(body["timed_out"] or body["exit_code"] != 0 or body.get("expected") is False)
    if sub.get("op") == "http":
        return body["status"] is None or body["status"] >= 400
    return False


def _numstat_within(out: bytes, within: dict[str, Any]) -> bool:
    """Whether a `git diff --numstat -z` shows a change (a binary file counts as one) and its totals lie within
    the bounds: the rule a diff_bounds step judges by."""
    entries = [entry.split(b"\t", 2) for entry in out.split(b"\0") if entry]
    if any(len(entry) != 3 for entry in entries):
        return False
    binary = any(entry[0] == b"-" for entry in entries)
    counts = {"files": len(entries),
              "insertions": sum(int(entry[0]) for entry in entries if entry[0].isdigit()),
              "deletions": sum(int(entry[1]) for entry in entries if entry[1].isdigit())}
    if not entries or (counts["insertions"] == counts["deletions"] == 0 and not binary):
        return False
    for name, bound in within.items():
        if bound is not None and not (isinstance(bound, list) and len(bound) == 2 and
                                      bound[0] <= counts.get(name, -1) <= bound[1]):
            return False
    return True


def _loopback_address(host: str, port: int) -> str:
    """The loopback address to connect to. Only loopback literals and `localhost` (resolved,
    and every answer must be loopback) are accepted; other names are refused unresolved."""
    import ipaddress
    import socket

    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
        raise OpError("not_loopback", f"refusing {host}: http fetches the target's own loopback only")
    except ValueError:
        pass  # a name, not an address
    if host.lower().rstrip(".") != "localhost":
        raise OpError("not_loopback", f"refusing {host}: http fetches the target's own loopback only")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise OpError("bad_request", f"cannot resolve {host!r}: {exc}") from None
    # IPv4 first: `localhost` names both, and most services listen on 127.0.0.1 only.
    addresses = [str(info[4][0]) for info in sorted(infos, key=lambda info: info[0] != socket.AF_INET)]
    if not addresses or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        raise OpError("not_loopback", f"refusing {host}: http fetches the target's own loopback only")
    return addresses[0]


class _NotHttp(Exception):
    """What came back is no HTTP/1.x response (or stopped inside one)."""


def _exchange(address: str, port: int, request: bytes, timeout: float, most: int) -> tuple[int, dict[str, str], bytes]:
    """One request on a connection of its own (Connection: close): the status, the headers (lower-case names) and
    at most `most` bytes of the body, read by its Content-Length, its chunks, or to the end. Written here, not with
    http.client: importing that (email, ssl, and socket's enums) cost each agent that fetches 23 ms of CPU, a tenth
    of an agent's whole run in a 16-unit rollout, for loopback requests this small subset of HTTP/1.1 answers."""
    import socket

    with socket.create_connection((address, port), timeout=timeout) as conn:
        conn.sendall(request)
        reader = conn.makefile("rb")
        while True:  # a 1xx interim answer is followed by the real one
            status_line = reader.readline(HTTP_LINE_MAX + 1)
            if not status_line:
                raise _NotHttp("the server closed the connection without a response")
            words = status_line.split(None, 2)
            if len(words) < 2 or not words[0].startswith(b"HTTP/1.") or not words[1].isdigit() \
                    or len(words[1]) != 3:
                raise _NotHttp(f"not an HTTP status line: {status_line[:80]!r}")
            status = int(words[1])
            headers = _http_headers(reader)
            if not 100 <= status < 200:
                break
        if status in (204, 304):
            return status, headers, b""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return status, headers, _chunks(reader, most)
        length = headers.get("content-length")
        if length is not None and not length.strip().isdigit():
            raise _NotHttp(f"Content-Length {length[:40]!r}")
        want = most if length is None else min(most, int(length))
        body = reader.read(want)
        if length is not None and len(body) < want:
            raise _NotHttp(f"the body ended after {len(body)} of its {int(length)} bytes")
        return status, headers, body


def _http_headers(reader: Any) -> dict[str, str]:
    headers: dict[str, str] = {}
    for _ in range(HTTP_HEADERS_MAX):
        line = reader.readline(HTTP_LINE_MAX + 1)
        if len(line) > HTTP_LINE_MAX:
            raise _NotHttp(f"a header line longer than {HTTP_LINE_MAX} bytes")
        if line in (b"\r\n", b"\n", b""):
            if not line:
                raise _NotHttp("the connection closed inside the headers")
            return headers
        name, colon, value = line.decode("latin-1").partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    raise _NotHttp(f"more than {HTTP_HEADERS_MAX} header lines")


def _chunks(reader: Any, most: int) -> bytes:
    """A chunked body, up to `most` bytes of it (the rest is never read: the connection closes)."""
    body = bytearray()
    while len(body) < most:
        size_line = reader.readline(HTTP_LINE_MAX + 1).split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError:
            raise _NotHttp(f"not a chunk size: {size_line[:40]!r}") from None
        if size == 0:
            break
        want = min(size, most - len(body))
        chunk = reader.read(want)
        if len(chunk) < want:
            raise _NotHttp("the body ended inside a chunk")
        body += chunk
        if len(chunk) == size:
            reader.readline(HTTP_LINE_MAX + 1)  # the chunk's CRLF
    return bytes(body)


def _stat_one(path: str, want_hash: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"path": path}
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        # Where it would be: existing links on the way are followed (realpath -m), so an escape shows.
        entry.update(exists=False, realpath=os.path.realpath(path))
        return entry
    except OSError as exc:
        entry.update(exists=None, error="{}: {}".format(errno.errorcode.get(exc.errno or 0, "error"), exc.strerror))
        return entry
    entry.update(exists=True, type=_kind(info.st_mode), size=info.st_size, mode=stat_mod.S_IMODE(info.st_mode),
                 uid=info.st_uid, gid=info.st_gid, mtime=info.st_mtime, realpath=os.path.realpath(path))
    if stat_mod.S_ISLNK(info.st_mode):
        entry["link"] = os.readlink(path)
    if want_hash:
        try:
            if stat_mod.S_ISREG(os.stat(path).st_mode):
                entry["sha256"] = _sha256_file(path)
        except OSError as exc:
            entry["error"] = f"cannot hash: {exc.strerror}"
    return entry


def _kind(mode: int) -> str:
    for test, name in FILE_TYPES:
        if test(mode):
            return name
    return "other"


def _sha256_file(path: str) -> str:
    with open(path, "rb") as handle:
        return _sha256_of(handle)


def _sha256_of(handle: IO[bytes]) -> str:
    digest = hashlib.sha256()
    for chunk in iter(lambda: handle.read(CHUNK), b""):
        digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename has happened
    finally:
        os.close(fd)


def _create_temp(directory: str) -> tuple[int, str]:
    """A new temp file beside the dest, named as recover looks for them (`.deployer-<random>.tmp`), opened for
    writing by us alone. Not tempfile: its import (shutil, random, the compressors) is a tenth of the agent's start."""
    for _ in range(100):
        path = os.path.join(directory, f".deployer-{os.urandom(6).hex()}.tmp")
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temp file name", directory)


def _create_staged(temp: str) -> int:
    """A staged temp, new: one an earlier, cut try left behind (same name, so the same dest and bytes) goes
    first; never through a symlink."""
    if os.path.lexists(temp):
        if not stat_mod.S_ISREG(os.lstat(temp).st_mode):
            raise OpError("not_a_file", f"{temp} exists and is not a regular file")
        os.unlink(temp)
    return os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _stamp(path: str) -> bool:
    """Write this agent's pid into path (its mtime now with it); False when it is not there to write."""
    try:  # never created, never a link followed, never a FIFO waited on
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "w") as out:
            out.write(f"{os.getpid()}\n")
    except OSError:
        return False
    return True


def _touch(path: str) -> bool:
    """Set path's mtime to now; False once it is gone."""
    try:
        os.utime(path, None)
    except OSError:
        return False
    return True


def _int_list(req: dict[str, Any], name: str) -> list[int]:
    values: list[int] = _field(req, name, list, [])
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise OpError("bad_request", f"{name} must be a list of positive integers")
    return values


def _proc_info(pid: int) -> dict[str, Any] | None:
    """/proc/PID/stat read after the command name (which may hold spaces and parens); None: no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        uid = os.stat(f"/proc/{pid}").st_uid
    except (OSError, IndexError):
        return None
    if len(fields) < 22:
        return None
    return {"pid": pid, "state": fields[0].decode(), "ppid": int(fields[1]), "pgid": int(fields[2]),
            "sid": int(fields[3]), "start": fields[19].decode(), "rss_kb": int(fields[21]) * PAGE_KB, "uid": uid}


def _recorded_runs(record: str) -> bool:
    """Whether `record` ("PID START", written when deployer started a service) names a live process (not a zombie)
    that started then: a pid file can outlive its process, and the number then name another one."""
    try:
        with open(record, "rb") as handle:
            pid, _, start = handle.read(4096).decode("ascii", "replace").strip().partition(" ")
    except OSError:
        return False
    info = _proc_info(int(pid)) if pid.isdigit() else None
    return info is not None and info["state"] != "Z" and info["start"] == start.strip()


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read(CMDLINE_MAX)
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.rstrip(b"\0").split(b"\0")] if raw else []


def _listening_inodes(ports: set[int]) -> dict[int, int]:
    """inode -> port of every TCP socket in LISTEN on one of ports (any address, IPv4 or IPv6): asked of the
    kernel's sock_diag, which walks its listening sockets only; /proc/net/tcp{,6} where that is refused."""
    found = _diag_listeners()
    if found is None:
        found = _proc_net_listeners()
    return {inode: port for inode, port in found.items() if port in ports and inode}


def _diag_listeners() -> dict[int, int] | None:
    """inode -> port of each listening TCP socket of this network namespace, by NETLINK_SOCK_DIAG (what `ss`
    reads): a busy server's thousands of TIME_WAIT and open connections are never walked, where /proc/net/tcp
    prints every one of them (tens of ms a read). None where the kernel or a sandbox refuses it."""
    import socket  # here: most agents never look at a port (see op_http)

    found: dict[int, int] = {}
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, DIAG_PROTOCOL)
    except (OSError, AttributeError):
        return None
    with sock:
        sock.settimeout(DIAG_TIMEOUT_S)
        try:
            for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
                request = DIAG_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN) + bytes(48)
                sock.send(NLMSG_HEADER.pack(NLMSG_HEADER.size + len(request), SOCK_DIAG_BY_FAMILY,
                                            NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + request)
                if not _diag_replies(sock, seq, found):
                    return None
        except OSError:
            return None
    return found


def _diag_replies(sock: Any, seq: int, found: dict[int, int]) -> bool:
    """Read one dump's messages into found until its end; False on an error reply or a message that is not one."""
    while True:
        data = sock.recv(1 << 16)
        if not data:
            return False
        at = 0
        while at + NLMSG_HEADER.size <= len(data):
            length, kind, _flags, got_seq, _pid = NLMSG_HEADER.unpack_from(data, at)
            if length < NLMSG_HEADER.size or at + length > len(data):
                return False
            if got_seq == seq:
                if kind == NLMSG_DONE:
                    return True
                if kind != SOCK_DIAG_BY_FAMILY or length < NLMSG_HEADER.size + DIAG_MSG_SIZE:
                    return False  # NLMSG_ERROR among them
                body = at + NLMSG_HEADER.size
                if data[body + 1] == TCP_LISTEN:
                    port = int.from_bytes(data[body + 4:body + 6], "big")
                    found[int.from_bytes(data[body + 68:body + 72], sys.byteorder)] = port
            at += (length + 3) & ~3


def _proc_net_listeners() -> dict[int, int]:
    """inode -> port of each TCP socket in LISTEN (state 0A), from /proc/net/tcp{,6}."""
    found: dict[int, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                lines = handle.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) >= 10 and fields[3] == "0A":
                found[int(fields[9])] = int(fields[1].rsplit(":", 1)[1], 16)
    return found


def _sockets_held(pid: int, inodes: dict[int, int]) -> set[int]:
    held: set[int] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return held
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and int(link[8:-1]) in inodes:
            held.add(int(link[8:-1]))
    return held


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class _Ahead:
    """stdin, behind the requests the bootstrap read before the source it had to ask for (they came first)."""

    def __init__(self, ahead: bytes, rest: IO[bytes]) -> None:
        self._ahead = memoryview(ahead)  # read through, never copied whole again (it may hold an upload)
        self._at = 0
        self._rest = rest

    def read(self, size: int) -> bytes:
        data = bytes(self._ahead[self._at:self._at + size])
        self._at += len(data)
        return data + self._rest.read(size - len(data)) if len(data) < size else data


def _keep(path: str, payload: bytes) -> None:
    """Leave payload at path for the next run's bootstrap, which runs it only if the file and its directory are
    this user's and no one else can write them (so that is how they are made: 0700, 0600) and its bytes hash to
    the name. Written whole before it has its name (temp, fsync, rename); a copy there under that name, even a
    tampered one, is replaced. A directory it cannot make, or that is not its own alone, keeps nothing: the next
    run asks for the source again. Old agents beyond KEEP_OTHERS go."""
    directory, name = os.path.split(path)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    temp = f".{name}.{os.urandom(4).hex()}.tmp"
    try:
        found = os.fstat(dir_fd)
        if found.st_uid != os.geteuid() or found.st_mode & 0o022:
            return
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                     0o600, dir_fd=dir_fd)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        with contextlib.suppress(OSError):  # some filesystems refuse fsync on a directory; the rename happened
            os.fsync(dir_fd)
        _prune(dir_fd, name)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def _prune(dir_fd: int, kept: str) -> None:
    """The other agents' copies beyond the KEEP_OTHERS newest, and temps a cut write left an hour ago or more."""
    ages: list[tuple[float, str]] = []
    for entry in os.listdir(dir_fd):
        if entry != kept and entry.startswith(("agent-", ".agent-")):
            with contextlib.suppress(OSError):
                ages.append((os.stat(entry, dir_fd=dir_fd, follow_symlinks=False).st_mtime, entry))
    ages.sort(reverse=True)
    stale = [entry for at, entry in ages if entry.startswith(".") and at < time.time() - 3600]
    for entry in [*stale, *[entry for _, entry in ages if entry.startswith("agent-")][KEEP_OTHERS:]]:
        with contextlib.suppress(OSError):
            os.unlink(entry, dir_fd=dir_fd)


def main(source: bytes, bytecode: bool = False, *, cached: bool = False, ahead: bytes = b"",
         keep: tuple[str, bytes] | None = None) -> None:
    proto_in: IO[bytes] = sys.stdin.buffer
    if ahead:
        proto_in = _Ahead(ahead, proto_in)  # type: ignore[assignment]
    # The protocol keeps a private copy of stdout; fd 1 then points at stderr, so a stray print
    # (ours or a library's) can never corrupt a frame.
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    agent = Agent(source, proto_in, proto_out, bytecode=bytecode, cached=cached)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, lambda num, _frame: agent.shutdown(128 + num))
    if keep is not None:  # beside the first requests, not before them
        agent.keeping = threading.Thread(target=_keep, args=keep, name="agent-keep", daemon=True)
        agent.keeping.start()
    agent.serve()


if __name__ == "__main__":
    # Bootstrapped: the source is the bytes the bootstrap read; run as a file: this file.
    _source = globals().get("AGENT_SOURCE")
    if not isinstance(_source, bytes):
        with open(__file__, "rb") as _handle:
            _source = _handle.read()
    _keep_it = globals().get("AGENT_KEEP")
    main(_source, globals().get("AGENT_BYTECODE") is True, cached=globals().get("AGENT_CACHED") is True,
         ahead=globals().get("AGENT_PENDING") or b"", keep=_keep_it if isinstance(_keep_it, tuple) else None)
