"""The agent protocol as a plain subprocess, and over a real sshd (one exec channel).

Processes are real; "gone" is polled in /proc with a deadline (a zombie counts as gone: in a
container nobody may reap an orphan the agent killed)."""

from __future__ import annotations

import hashlib
import http.server
import json
import marshal
import os
import re
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest
from fixtures_ssh import SSHD, CountingProxy
from polling import wait_for
from ports import free_port

from deployer.agent import agent as agent_mod
from deployer.agent.client import (
    AgentClient,
    agent_code,
    agent_payload,
    agent_source,
    bootstrap_argv,
    bootstrap_command,
)
from deployer.agent.protocol import Batch, Get, Http, OpFailure, Put, Run, Stat
from deployer.errors import RequestSkipped, TransportError
from deployer.transport.local import spawn_agent
from deployer.transport.pipes import ChannelPipe

HEADER = struct.Struct(">I")
DEADLINE_S = 15.0
# A real 3.8 interpreter, not a pyenv shim that would refuse to run it.
PY38 = next((str(p) for p in sorted(Path("/root/.pyenv/versions").glob("3.8*/bin/python3.8"))
             if os.access(p, os.X_OK)), None) or (
    shutil.which("python3.8") if "shims" not in (shutil.which("python3.8") or "shims") else None)


# -- helpers -------------------------------------------------------------------------------------


def frame(obj: Any) -> bytes:
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return HEADER.pack(len(body)) + body


class RawAgent:
    """The agent as a bare subprocess spoken to byte by byte, without our client."""

    def __init__(self, python: str = sys.executable) -> None:
        self.proc = subprocess.Popen(bootstrap_argv(python), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin = self.proc.stdin
        self.stdout = self.proc.stdout
        self._buf = bytearray()

    def send(self, data: bytes) -> None:
        self.stdin.write(data)
        self.stdin.flush()

    def _take(self, size: int) -> bytes:
        deadline = time.monotonic() + DEADLINE_S
        while len(self._buf) < size:
            ready, _, _ = select.select([self.stdout], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"no reply within {DEADLINE_S}s"
            chunk = os.read(self.stdout.fileno(), 1 << 20)
            assert chunk, "the agent closed its output"
            self._buf += chunk
        data = bytes(self._buf[:size])
        del self._buf[:size]
        return data

    def reply(self) -> dict[str, Any]:
        (length,) = HEADER.unpack(self._take(HEADER.size))
        reply: dict[str, Any] = json.loads(self._take(length))
        return reply

    def close(self) -> None:
        self.stdin.close()
        self.proc.wait(DEADLINE_S)
        self.stdout.close()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture
def raw() -> Iterator[RawAgent]:
    agent = RawAgent()
    agent.send(agent_payload())
    try:
        yield agent
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
        agent.close()


@pytest.fixture
def client() -> Iterator[AgentClient]:
    with spawn_agent() as agent:
        yield agent


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def read_pid(path: Path) -> int:
    wait_for(lambda: path.exists() and path.read_text().strip(), f"{path} written", DEADLINE_S)
    return int(path.read_text().split()[0])


def pids(path: Path, count: int) -> list[int]:
    wait_for(lambda: path.exists() and len(path.read_text().split()) >= count, f"{count} pids in {path}",
             DEADLINE_S)
    return [int(word) for word in path.read_text().split()]


# -- framing and bootstrap -----------------------------------------------------------------------


def test_source_and_pipelined_requests_sent_in_one_write_are_all_answered_in_order() -> None:
    # The bootstrap's buffered read of the source also buffers requests that follow it; they
    # must reach the agent, not vanish in that buffer.
    agent = RawAgent()
    try:
        requests = b"".join(frame({"id": n, "op": "run", "argv": ["echo", str(n)]}) for n in range(200))
        agent.send(agent_payload() + requests)
        replies = [agent.reply() for _ in range(200)]
        assert [r["id"] for r in replies] == list(range(200))
        assert all(r["ok"] and r["result"]["exit_code"] == 0 for r in replies)
        assert agent_mod.base64.b64decode(replies[199]["result"]["stdout"]) == b"199\n"
    finally:
        agent.close()


def test_a_source_cut_short_is_never_executed() -> None:
    agent = RawAgent()
    source = agent_source()
    # A prefix that is valid Python on its own would run if the bootstrap did not count bytes.
    agent.send(source[:source.index(b"import base64")])
    agent.stdin.close()
    assert agent.proc.wait(DEADLINE_S) != 0
    assert os.read(agent.stdout.fileno(), 100) == b""
    assert agent.proc.stderr is not None and b"source cut short" in agent.proc.stderr.read()
    agent.stdout.close()
    agent.proc.stderr.close()


def test_hello_names_the_sha256_of_the_source_it_runs(client: AgentClient) -> None:
    assert client.hello is not None
    assert client.hello.sha256 == hashlib.sha256(Path(agent_mod.__file__).read_bytes()).hexdigest()
    assert client.hello.pid != os.getpid()


def test_an_agent_on_this_python_runs_our_bytecode_and_still_names_the_source() -> None:
    # The bytecode is what this python runs for the source sent (its current .pyc, or a compile of it) ...
    shipped = marshal.loads(zlib.decompress(agent_code()))
    assert shipped == compile(agent_source(), str(Path(agent_mod.__file__)), "exec", dont_inherit=True)
    # ... and the bootstrap is one line: a login shell of the csh family refuses a newline inside quotes.
    assert "\n" not in bootstrap_command(sys.executable)
    with spawn_agent(sys.executable) as agent:
        assert agent.hello is not None and agent.hello.bytecode  # no compile there: it read our bytecode
        assert agent.hello.sha256 == hashlib.sha256(Path(agent_mod.__file__).read_bytes()).hexdigest()
        assert agent.run(["echo", "ran"]).stdout == b"ran\n"


def test_bytecode_the_target_cannot_load_falls_back_to_compiling_the_source() -> None:
    agent = RawAgent()
    try:
        spoiled = bytes(b ^ 0xFF for b in agent_code())  # as long as ours, but no zlib stream
        agent.send(agent_source() + spoiled + frame({"id": 1, "op": "hello"}) + frame({"id": 2, "op": "run",
                                                                                     "argv": ["echo", "ok"]}))
        hello, ran = agent.reply(), agent.reply()
        assert hello["ok"] and hello["result"]["bytecode"] is False
        assert hello["result"]["sha256"] == hashlib.sha256(agent_source()).hexdigest()
        assert ran["ok"] and agent_mod.base64.b64decode(ran["result"]["stdout"]) == b"ok\n"
    finally:
        agent.close()


@pytest.mark.skipif(PY38 is None, reason="no Python 3.8 on this machine")
def test_the_agent_runs_on_python_3_8(tmp_path: Path) -> None:
    assert PY38 is not None
    with spawn_agent(PY38) as agent:
        assert agent.hello is not None and agent.hello.python.startswith("3.8.")
        assert not agent.hello.bytecode  # another magic number: it compiled the source
        reply = agent.batch([Put(str(tmp_path / "f"), b"x"), Run(["cat", str(tmp_path / "f")]),
                             Stat([str(tmp_path / "f")], sha256=True), Http("http://127.0.0.1:1/", check=False)])
        assert reply.ok and reply.results[1].stdout == b"x" and reply.results[2][0].sha256


def test_a_large_payload_goes_up_and_comes_back_intact(client: AgentClient, tmp_path: Path) -> None:
    data = os.urandom(20 << 20)
    put = client.put(str(tmp_path / "big.bin"), data)
    assert (put.size, put.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert client.get(str(tmp_path / "big.bin"), max_bytes=len(data)) == data
    with pytest.raises(TransportError, match="too_large"):
        client.get(str(tmp_path / "big.bin"), max_bytes=len(data) - 1)


MEMORY_PROBE = textwrap.dedent("""
    import json, sys
    from deployer.transport.local import spawn_agent
    def hwm_kb(pid):
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    with spawn_agent() as agent:
        before = (hwm_kb("self"), hwm_kb(agent.hello.pid))
        result = agent.run(["head", "-c", "50000000", "/dev/zero"], tail=65536, timeout=60)
        after = (hwm_kb("self"), hwm_kb(agent.hello.pid))
    print(json.dumps({"bytes": result.out_stream.total, "kept": len(result.out_stream.kept), "exit": result.exit_code,
                      "client_growth_kb": after[0] - before[0], "agent_growth_kb": after[1] - before[1]}))
""")


def test_50_mb_of_output_keeps_memory_bounded_on_both_sides() -> None:
    # A process of its own, so the peak RSS measured is this run's and nobody else's.
    probe = subprocess.run([sys.executable, "-c", MEMORY_PROBE], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert (seen["bytes"], seen["kept"], seen["exit"]) == (50_000_000, 65536, 0)
    assert seen["agent_growth_kb"] < 16 * 1024, seen
    assert seen["client_growth_kb"] < 16 * 1024, seen


# -- run -----------------------------------------------------------------------------------------


def test_a_timeout_kills_the_whole_process_group(client: AgentClient, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    started = time.monotonic()
    result = client.run(["sh", "-c", f'sleep 300 & echo "$$ $!" > {pidfile}; wait'], timeout=1.0)
    assert result.timed_out and result.exit_code is None
    assert time.monotonic() - started < 10
    shell, grandchild = pids(pidfile, 2)
    wait_for(lambda: gone(shell) and gone(grandchild), "the shell and its sleeping child are gone", DEADLINE_S)


def test_a_daemon_left_holding_the_output_does_not_hold_the_reply(client: AgentClient, tmp_path: Path) -> None:
    # A start command that backgrounds a server returns; the server keeps running.
    pidfile = tmp_path / "pid"
    result = client.run(["sh", "-c", f"sleep 300 & echo $! > {pidfile}; echo started"], timeout=30)
    daemon = read_pid(pidfile)
    try:
        assert result.ok and result.out == "started\n" and result.duration_s < 10
        assert not gone(daemon)
    finally:
        os.kill(daemon, 9)


def test_stdin_env_and_cwd_reach_the_command(client: AgentClient, tmp_path: Path) -> None:
    result = client.run(["sh", "-c", 'pwd; echo "$GREETING"; cat'], cwd=str(tmp_path),
                        env={"GREETING": "hi there"}, stdin=b"from stdin" * 20000)
    assert result.ok
    assert result.out == f"{tmp_path}\nhi there\n" + "from stdin" * 20000


def test_a_missing_command_exits_127_with_a_message(client: AgentClient) -> None:
    result = client.run(["/nonexistent/tool", "--flag"])
    assert result.exit_code == 127 and "/nonexistent/tool" in result.err


# -- bad requests --------------------------------------------------------------------------------


def test_bad_requests_get_error_replies_and_the_agent_keeps_serving(raw: RawAgent) -> None:
    raw.send(frame(b"{not json"))
    reply = raw.reply()
    assert (reply["id"], reply["ok"], reply["error"]["type"]) == (None, False, "bad_frame")
    raw.send(frame(b"\xff\xfe"))
    assert raw.reply()["error"]["type"] == "bad_frame"
    raw.send(frame([1, 2]))
    assert raw.reply()["error"]["type"] == "bad_frame"
    cases = [
        ({"id": 1, "op": "exec", "code": "import os"}, "unknown_op"),
        ({"id": 2}, "bad_request"),
        ({"id": 3, "op": "run"}, "bad_request"),
        ({"id": 4, "op": "run", "argv": "rm -rf /"}, "bad_request"),
        ({"id": 5, "op": "run", "argv": ["true"], "timeout": True}, "bad_request"),
        ({"id": 55, "op": "run", "argv": ["true"], "timeout": float("nan")}, "bad_request"),
        ({"id": 56, "op": "put", "path": "/tmp/x", "data": "", "sha256": hashlib.sha256(b"").hexdigest(),
          "mode": 0o100644}, "bad_request"),
        ({"id": 57, "op": "put", "path": "/tmp/x", "data": "", "sha256": hashlib.sha256(b"").hexdigest(),
          "mode": 0o10000}, "bad_request"),  # one past the permission bits: a file type bit
        ({"id": 6, "op": "put", "path": "relative.txt", "data": "", "sha256": "x"}, "bad_request"),
        ({"id": 7, "op": "put", "path": "/tmp/x", "data": "!!", "sha256": "x"}, "bad_request"),
        ({"id": 8, "op": "stat", "paths": [1]}, "bad_request"),
        ({"id": 9, "op": "batch", "requests": [{"op": "batch", "requests": []}]}, None),
    ]
    for request, kind in cases:
        raw.send(frame(request))
        reply = raw.reply()
        assert reply["id"] == request["id"]
        if kind is None:
            assert reply["result"]["failed"] == 0
        else:
            assert (reply["ok"], reply["error"]["type"]) == (False, kind), reply
    # A put without its bytes or without their sha256 is refused naming the field, not checked against nothing.
    for missing in ("data", "sha256"):
        put = {"id": missing, "op": "put", "path": "/tmp/x", "data": "", "sha256": hashlib.sha256(b"").hexdigest()}
        del put[missing]
        raw.send(frame(put))
        error = raw.reply()["error"]
        assert (error["type"], error["message"]) == ("bad_request", f"missing field '{missing}'"), error
    # A declared length past the limit is answered at once, then skipped when the bytes follow.
    raw.send(HEADER.pack(agent_mod.MAX_FRAME + 1))
    assert raw.reply()["error"]["type"] == "frame_too_large"
    raw.send(b"\0" * (agent_mod.MAX_FRAME + 1) + frame({"id": "still", "op": "hello"}))
    assert raw.reply()["id"] == "still"
    assert raw.proc.poll() is None


def test_a_client_call_the_agent_refuses_raises_a_transport_error(client: AgentClient) -> None:
    with pytest.raises(TransportError, match="bad_request"):
        client.put("relative/path", b"x")
    assert client.run(["true"]).ok  # and the session goes on


# -- exit ----------------------------------------------------------------------------------------


def test_eof_on_stdin_ends_the_agent_and_the_command_it_was_running(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    agent = spawn_agent()
    assert agent.hello is not None
    agent_pid = agent.hello.pid
    pending = agent.submit(Run(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 300"], timeout=300))
    child = read_pid(pidfile)
    agent.close()
    wait_for(lambda: gone(agent_pid) and gone(child), "agent and its running command are gone", DEADLINE_S)
    with pytest.raises(TransportError, match="closed"):
        pending.result(5)


def test_a_stalled_reply_raises_a_transport_error_within_our_timeout(client: AgentClient) -> None:
    pending = client.submit(Run(["sleep", "30"], timeout=60))
    started = time.monotonic()
    with pytest.raises(TransportError, match="no reply"):
        pending.result(timeout=0.5)
    assert time.monotonic() - started < 5
    with pytest.raises(TransportError, match="gone"):
        client.run(["true"])


# -- put / get / stat ----------------------------------------------------------------------------


def test_put_replaces_atomically_and_keeps_owner_and_mode(client: AgentClient, tmp_path: Path) -> None:
    dest = tmp_path / "conf.py"
    dest.write_text("old\n")
    os.chmod(dest, 0o640)
    if os.geteuid() == 0:
        os.chown(dest, 1234, 5678)
    before = os.stat(dest)
    reply = client.put(str(dest), b"new\n")
    after = os.stat(dest)
    assert dest.read_bytes() == b"new\n"
    assert after.st_ino != before.st_ino  # renamed into place, never written in place
    assert (after.st_mode & 0o7777, after.st_uid, after.st_gid) == (0o640, before.st_uid, before.st_gid)
    assert reply.replaced and reply.mode == 0o640
    if os.geteuid() == 0:
        assert reply.owner_kept is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conf.py"]  # no temp file left behind


@pytest.mark.parametrize("mode", [0, 0o7777])
def test_put_sets_any_mode_from_0_to_7777_exactly(client: AgentClient, tmp_path: Path, mode: int) -> None:
    reply = client.put(str(tmp_path / "f"), b"x", mode=mode)
    assert reply.mode == mode == os.stat(tmp_path / "f").st_mode & 0o7777


@pytest.mark.skipif(os.geteuid() != 0, reason="gives files to another owner")
def test_put_keeps_the_owner_unless_told_not_to_and_makes_parents_only_when_asked(
        raw: RawAgent, client: AgentClient, tmp_path: Path) -> None:
    dest = tmp_path / "owned.txt"
    dest.write_text("old\n")
    os.chown(dest, 1234, 5678)
    defaults = Put(str(dest), b"by default\n").wire()  # a request that leaves the options to the agent
    del defaults["keep_owner"], defaults["mkdirs"]
    raw.send(frame({"id": 1, **defaults}))
    assert raw.reply()["result"]["owner_kept"] is True and (dest.stat().st_uid, dest.stat().st_gid) == (1234, 5678)
    deeper = Put(str(tmp_path / "new" / "f.txt"), b"x").wire()
    del deeper["mkdirs"]
    raw.send(frame({"id": 2, **deeper}))
    assert raw.reply()["error"]["type"] == "no_parent" and not (tmp_path / "new").exists()
    assert client.put(str(dest), b"given up\n", keep_owner=False).owner_kept is None
    assert (dest.stat().st_uid, dest.stat().st_gid, dest.read_text()) == (0, os.getegid(), "given up\n")


SYSTEM_PYTHON = "/usr/bin/python3"  # outside /root, so another user can run it


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists(SYSTEM_PYTHON),
                    reason="runs the agent as another user")
def test_an_agent_that_may_not_give_the_file_back_to_its_owner_says_so() -> None:
    # An agent running as nobody replaces root's file: the rename works (the directory lets it), the chown cannot.
    shared = Path(tempfile.mkdtemp())  # not under pytest's 0700 tmp dir: nobody must reach it
    try:
        shared.chmod(0o777)
        dest = shared / "roots.txt"
        dest.write_text("old\n")
        dest.chmod(0o644)
        python = shared / "python-as-nobody"
        python.write_text(f'#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups {SYSTEM_PYTHON} "$@"\n')
        python.chmod(0o755)
        with spawn_agent(str(python)) as agent:
            reply = agent.put(str(dest), b"new\n")
        assert (reply.owner_kept, reply.uid, dest.stat().st_uid, dest.read_text()) == (False, 65534, 65534, "new\n")
    finally:
        shutil.rmtree(shared)


def test_a_failed_put_leaves_the_tree_as_it_was(client: AgentClient, tmp_path: Path) -> None:
    dest = tmp_path / "keep.txt"
    dest.write_text("original\n")
    link = tmp_path / "link"
    link.symlink_to(dest)
    with pytest.raises(TransportError, match="no_parent"):
        client.put(str(tmp_path / "a" / "b" / "new.txt"), b"x")
    with pytest.raises(TransportError, match=re.escape(f"(not_a_file): {link} is a symlink; put replaces regular "
                                                       "files only")):
        client.put(str(link), b"x")
    # Bytes that do not match their sha256 (damaged on the way) never reach the disk.
    wire = Put(str(dest), b"tampered").wire()
    wire["sha256"] = hashlib.sha256(b"something else").hexdigest()
    raw = RawAgent()
    try:
        raw.send(agent_payload() + frame({"id": 1, **wire}))
        assert raw.reply()["error"]["type"] == "corrupt"
    finally:
        raw.close()
    assert dest.read_text() == "original\n" and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt", "link"]


def test_put_creates_missing_parents_only_when_asked_and_says_which(client: AgentClient, tmp_path: Path) -> None:
    reply = client.put(str(tmp_path / "a" / "b" / "new.txt"), b"x", mkdirs=True)
    assert reply.created_dirs == (str(tmp_path / "a"), str(tmp_path / "a" / "b"))
    assert (tmp_path / "a" / "b" / "new.txt").read_bytes() == b"x"
    assert client.put(str(tmp_path / "a" / "b" / "new.txt"), b"y", mkdirs=True).created_dirs == ()
    # A directory the kernel will not make (a name past NAME_MAX): the ones made before it are removed again.
    too_long = tmp_path / "c" / ("d" * 300)
    with pytest.raises(TransportError, match=re.escape(f"(os_error): cannot create directory {too_long}: ")):
        client.put(str(too_long / "new.txt"), b"x", mkdirs=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_stat_of_odd_names_is_structured(client: AgentClient, tmp_path: Path) -> None:
    names = ["line\nbreak.py", "with space.py", "ünï cödé ✓.py", " leading", "tab\there"]
    for name in names:
        (tmp_path / name).write_bytes(name.encode())
    (tmp_path / "dir").mkdir()
    (tmp_path / "ln").symlink_to(tmp_path / names[0])
    paths = [str(tmp_path / n) for n in [*names, "dir", "ln", "missing\nfile"]]
    entries = client.stat(paths, sha256=True)
    assert [e.path for e in entries] == paths
    for entry, name in zip(entries, names, strict=False):
        assert (entry.exists, entry.type, entry.size) == (True, "file", len(name.encode()))
        assert entry.sha256 == hashlib.sha256(name.encode()).hexdigest()
        assert entry.realpath == str(tmp_path / name)
    directory, link, missing = entries[-3:]
    assert (directory.type, directory.sha256) == ("dir", None)
    assert (link.type, link.link, link.realpath) == ("symlink", str(tmp_path / names[0]), str(tmp_path / names[0]))
    assert link.sha256 == hashlib.sha256(names[0].encode()).hexdigest()
    assert missing.exists is False and missing.type is None


def test_get_of_a_missing_file_is_none_and_of_a_directory_an_error(client: AgentClient, tmp_path: Path) -> None:
    assert client.get(str(tmp_path / "nope")) is None
    with pytest.raises(TransportError, match="not_a_file"):
        client.get(str(tmp_path))


# -- http ----------------------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"metric 1\n" * (1000 if self.path == "/big" else 1)
        self.send_response(200 if self.path != "/missing" else 404)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _echo(self) -> None:
        """The method, content type and body it was sent, as a router's worker calls are."""
        sent = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = f"{self.command} {self.headers.get('Content-Type')} ".encode() + sent
        self.send_response(202)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_DELETE = _echo

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def web() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_http_fetches_the_loopback_and_bounds_the_body(client: AgentClient, web: int) -> None:
    result = client.http(f"http://127.0.0.1:{web}/metrics")
    assert (result.status, result.text, result.truncated) == (200, "metric 1\n", False)
    assert client.http(f"http://localhost:{web}/metrics").status == 200
    big = client.http(f"http://127.0.0.1:{web}/big", max_bytes=100)
    assert len(big.body) == 100 and big.truncated
    refused = client.http(f"http://127.0.0.1:{free_port()}/")
    assert refused.status is None and "Refused" in (refused.error or "")


def test_http_sends_a_method_and_a_json_body_for_a_routers_worker_calls(client: AgentClient, web: int) -> None:
    added = client.call(Http(f"http://127.0.0.1:{web}/workers", method="POST", json={"url": "http://127.0.0.1:1"}))
    assert (added.status, added.text) == (202, 'POST application/json {"url": "http://127.0.0.1:1"}')
    removed = client.call(Http(f"http://127.0.0.1:{web}/workers/w1", method="DELETE"))
    assert (removed.status, removed.text) == (202, "DELETE None ")
    with pytest.raises(TransportError, match="bad_request"):
        client.call(Http(f"http://127.0.0.1:{web}/", method="CONNECT"))


@pytest.mark.parametrize("url", ["http://10.1.2.3/metrics", "http://example.com/", "http://[::ffff:8.8.8.8]/",
                                 "http://0.0.0.0/", "https://127.0.0.1/", "file:///etc/passwd"])
def test_http_refuses_anything_but_the_targets_own_loopback(client: AgentClient, url: str) -> None:
    with pytest.raises(TransportError, match=r"not_loopback|bad_request"):
        client.http(url)


# -- batch ---------------------------------------------------------------------------------------


def test_a_batch_stops_at_the_first_failure_and_answers_in_one_reply(client: AgentClient, tmp_path: Path,
                                                                     web: int) -> None:
    marker = tmp_path / "never"
    reply = client.batch([
        Run(["false"], check=False),
        Http(f"http://127.0.0.1:{web}/missing", check=False),
        Put(str(tmp_path / "f"), b"data"),
        Get(str(tmp_path / "f")),
        Run(["sh", "-c", "exit 3"]),
        Run(["touch", str(marker)]),
    ])
    assert reply.failed == 4 and not reply.ok
    assert len(reply.results) == 5
    assert reply.results[0].exit_code == 1 and reply.results[1].status == 404
    assert reply.results[3] == b"data" and reply.results[4].exit_code == 3
    assert not marker.exists()
    failed_op = client.batch([Get("relative"), Run(["touch", str(marker)])])
    assert failed_op.failed == 0 and isinstance(failed_op.results[0], OpFailure)
    assert not marker.exists()


def test_a_request_after_one_that_failed_is_skipped_and_after_one_that_succeeded_runs(client: AgentClient,
                                                                                      tmp_path: Path) -> None:
    # Pipelined, none waited for: the gate is the agent's, not the client's timing.
    refused = client.submit(Put(str(tmp_path / "missing-dir" / "record"), b"r"))  # no mkdirs: fails
    skipped = client.submit(Run(["touch", str(tmp_path / "never")]), after=refused)
    written = client.submit(Put(str(tmp_path / "record"), b"r"))
    ran = client.submit(Run(["touch", str(tmp_path / "ran")]), after=written)
    exited = client.submit(Run(["false"]))
    after_exit = client.submit(Get(str(tmp_path / "record")), after=exited)
    with pytest.raises(TransportError, match="skipped"):
        skipped.result()
    assert not (tmp_path / "never").exists()
    assert ran.result().ok and (tmp_path / "ran").exists()
    with pytest.raises(TransportError, match="skipped"):
        after_exit.result()  # a non-zero exit is a failure, as in a batch
    with pytest.raises(TransportError, match=r"No such file|missing"):
        refused.result()


def test_a_run_whose_output_is_not_the_expected_one_stops_its_batch_and_what_follows_it(client: AgentClient,
                                                                                       tmp_path: Path) -> None:
    marker = tmp_path / "after"
    matched = client.batch([Run(["printf", "a\\0b\\0"], expect_stdout=b"a\0b\0"), Run(["true"])])
    assert matched.ok and matched.failed is None
    batch = client.submit(Batch([Run(["printf", "a\\0"], expect_stdout=b"a\0b\0"), Run(["touch", str(marker)])]))
    behind = client.submit(Run(["touch", str(marker)]), after=batch)
    reply = batch.result()
    assert reply.failed == 0 and len(reply.results) == 1 and reply.results[0].exit_code == 0
    with pytest.raises(RequestSkipped):
        behind.result()
    assert not marker.exists()


# -- over a real sshd ----------------------------------------------------------------------------


def ssh_connect(sshd: SSHD, sock: socket.socket | None = None) -> paramiko.SSHClient:
    ssh = paramiko.SSHClient()
    ssh.load_host_keys(sshd.known_hosts)
    ssh.set_missing_host_key_policy(paramiko.RejectPolicy())
    ssh.connect(sshd.host, port=sshd.port, username=sshd.user, key_filename=sshd.client_key,
                look_for_keys=False, allow_agent=False, timeout=10, sock=sock)
    return ssh


def start_agent(ssh: paramiko.SSHClient) -> AgentClient:
    transport = ssh.get_transport()
    assert transport is not None
    chan = transport.open_session(timeout=10)
    chan.exec_command(bootstrap_command(sys.executable))
    return AgentClient(ChannelPipe(chan), name="sshd-test").start()


def test_over_sshd_a_whole_batch_uses_exactly_one_exec_channel(sshd: SSHD, tmp_path: Path) -> None:
    ssh = ssh_connect(sshd)
    transport = ssh.get_transport()
    assert transport is not None
    opened: list[str] = []
    real_open = transport.open_channel

    def counting_open(kind: str, *args: Any, **kwargs: Any) -> paramiko.Channel:
        opened.append(kind)
        return real_open(kind, *args, **kwargs)

    transport.open_channel = counting_open  # type: ignore[method-assign]
    try:
        with start_agent(ssh) as agent:
            reply = agent.batch([Put(str(tmp_path / "a.py"), b"A = 1\n"), Put(str(tmp_path / "b.py"), b"B = 2\n"),
                                 Run([sys.executable, "-m", "py_compile", "a.py", "b.py"], cwd=str(tmp_path)),
                                 Stat([str(tmp_path / "a.py"), str(tmp_path / "b.py")], sha256=True)])
            assert reply.ok, reply
            assert reply.results[3][1].sha256 == hashlib.sha256(b"B = 2\n").hexdigest()
            assert agent.run(["true"]).ok
    finally:
        ssh.close()
    assert opened == ["session"]


def test_a_cut_ssh_connection_leaves_no_agent_process_on_the_target(sshd: SSHD, tmp_path: Path) -> None:
    proxy = CountingProxy(sshd.port)
    ssh = ssh_connect(sshd, sock=socket.create_connection(("127.0.0.1", proxy.port), timeout=10))
    pidfile = tmp_path / "pid"
    try:
        agent = start_agent(ssh)
        assert agent.hello is not None
        agent_pid = agent.hello.pid
        pending = agent.submit(Run(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 300"], timeout=300))
        child = read_pid(pidfile)
        assert not gone(agent_pid) and not gone(child)
        proxy.close()  # the network fails: no goodbye reaches either side
        wait_for(lambda: gone(agent_pid) and gone(child), "the agent and its command died with the connection",
                 DEADLINE_S)
        with pytest.raises(TransportError):
            pending.result(10)
    finally:
        ssh.close()
        proxy.close()
