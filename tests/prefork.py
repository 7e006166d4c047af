"""`python -m deployer`, without paying its start-up on every call: a pre-fork server for the test suite.

Most of a short run's CPU is the interpreter's start and deployer's imports (about 0.4 s of a 0.55 s apply on
these machines), and the suite makes thousands of calls on two cores. So each test process keeps one server
that has imported every deployer module once; a call forks it, and the fork runs deployer's real entry point
(`deployer.cli.run`, what `python -m deployer` runs) in the caller's cwd and environment, on the caller's
stdin, stdout and stderr, and exits with deployer's own exit code. It is a real process running the real
code: only the imports were done before the fork. The start-up path itself stays covered by the tests that
exec `python -m deployer` (the wheel demo, `--help`'s imports, Ctrl-C, signals: every `Project.popen`) and
by bench/bench_rtt.py.

Each request gets a runner (forked from the single-threaded server) that forks deployer and waits for it, so
the exit code reaches the caller, and concurrent calls from one test's threads work.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

_lock = threading.Lock()
_server: tuple[subprocess.Popen[bytes], str] | None = None


def run(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """What subprocess.run([python, -m, deployer, *args], cwd, env, stdin=DEVNULL, capture_output=True,
    text=True, timeout) returns (or raises: TimeoutExpired, after the call is KILLed)."""
    path = _socket()
    argv = [sys.executable, "-m", "deployer", *args]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            open(os.devnull, "rb") as null, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(path)
        request = json.dumps({"args": list(args), "cwd": str(cwd), "env": env}).encode() + b"\n"
        socket.send_fds(conn, [request], [null.fileno(), out.fileno(), err.fileno()])
        replies = _Replies(conn)
        pid = replies.next(time.monotonic() + 30)
        try:
            status = replies.next(time.monotonic() + timeout)
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            replies.next(time.monotonic() + 30)
            raise subprocess.TimeoutExpired(argv, timeout, _read(out), _read(err)) from None
        return subprocess.CompletedProcess(argv, status, _read(out), _read(err))


class _Replies:
    """The numbers the runner sends, a line each: the pid, then the exit code."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buffer = b""

    def next(self, deadline: float) -> int:
        while b"\n" not in self.buffer:
            self.conn.settimeout(max(deadline - time.monotonic(), 0.001))
            chunk = self.conn.recv(64)  # TimeoutError at the deadline
            if not chunk:
                raise RuntimeError("the prefork runner ended without an answer")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return int(line)


def _read(file: IO[bytes]) -> str:
    file.seek(0)
    return file.read().decode().replace("\r\n", "\n").replace("\r", "\n")  # as text=True reads it


def _socket() -> str:
    """This process's server (started on first use; it ends when this process does)."""
    global _server
    with _lock:
        if _server is None or _server[0].poll() is not None:
            path = tempfile.mktemp(prefix="deployer-prefork-", suffix=".sock")
            proc = subprocess.Popen([sys.executable, __file__, path], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=None)
            assert proc.stdout is not None
            if proc.stdout.readline() != b"ready\n":
                raise RuntimeError(f"the prefork server did not start (exit {proc.wait()})")
            atexit.register(_stop, proc, path)
            _server = (proc, path)
        return _server[1]


def _stop(proc: subprocess.Popen[bytes], path: str) -> None:
    proc.kill()
    proc.wait()
    Path(path).unlink(missing_ok=True)


def _preload() -> None:
    """What deployer's own daemon loads before it forks a command (deployer/launch.py): every module, the lazy
    ones too, and every model's validator."""
    from deployer.warm import preload
    preload()


def _runner(conn: socket.socket, request: dict[str, object], fds: list[int]) -> None:
    """In a fork of the server: fork deployer with the caller's cwd, env and stdio; tell its pid, then its exit."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(str(request["cwd"]))
        env = request["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update(env)
        args = request["args"]
        assert isinstance(args, list)
        import deployer
        sys.argv = [str(Path(deployer.__file__).parent / "__main__.py"), *args]
        from deployer.cli import run as deployer_run
        deployer_run()
    for fd in fds:
        os.close(fd)
    conn.sendall(f"{pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())


def _serve(path: str) -> None:
    _preload()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the runners reap themselves
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sys.stdout.buffer.write(b"ready\n")
    sys.stdout.flush()
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in ready:
            return  # the test process is gone
        conn, _ = listener.accept()
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        while message and not message.endswith(b"\n"):
            message += conn.recv(1 << 20)
        if os.fork() == 0:
            listener.close()
            try:
                _runner(conn, json.loads(message), fds)
            finally:
                os._exit(0)
        conn.close()
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    sys.path.remove(str(Path(__file__).parent))  # deployer as the caller finds it, not the tests' folder first
    _serve(sys.argv[1])
