"""The daemon: one process that has imported deployer, listening; each command gets a runner forked from it, and
the runner forks the command, hands on the signals its caller forwards, and reports how the command ended.

The daemon stays single-threaded, so every fork starts from a process with no lock held by another thread. A
runner, not the daemon, waits for its command: the daemon answers the next caller at once, and a command runs to
its end even when the daemon has exited meanwhile (stale, stopped or idle)."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import gc
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from deployer.daemon.place import install_id, socket_path, stamp
from deployer.daemon.wire import FORWARDED, Reader, WireError, peer_uid, send

HELD = 3  # the daemon's exit when another holds its place (as `deployer lock` says a held lock)
REQUEST_TIMEOUT_S = 5.0  # a caller that connects and says nothing holds no one else up for longer
_RESET = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD, signal.SIGTSTP, signal.SIGTTIN,
          signal.SIGTTOU, signal.SIGWINCH, signal.SIGUSR1, signal.SIGUSR2)


class Daemon:
    def __init__(self, base: Path, idle_s: float, command: Callable[[], NoReturn]) -> None:
        self.base = base
        self.idle_s = idle_s
        self.command = command
        self.stamp = stamp(sys.path)  # before the imports: a file changed while they run makes it stale at once
        self.started = time.time()
        self.served = 0
        self.last = time.monotonic()
        self.listener: socket.socket | None = None
        self.held = -1

    def serve(self, preload: Callable[[], None]) -> int:
        """Listen until idle, stopped or stale. HELD: another daemon for this install holds the place."""
        self.held = os.open(self.base / f"{install_id()}.lock",
                            os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self.held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("another deployer daemon for this install is running", file=sys.stderr)
            return HELD
        with contextlib.suppress(OSError):  # its log, which a start that lost a race may have written to
            os.truncate(self.base / f"{install_id()}.log", 0)
        preload()
        if threading.active_count() > 1:  # a fork copies no thread but its caller, and no lock another one held
            print(f"the imports left {threading.active_count() - 1} thread(s) running: a daemon cannot fork "
                  "safely", file=sys.stderr)
            return 1
        # What the imports made lives as long as the daemon: out of the collector's reach, a fork's collections
        # never touch (and so never copy) the pages it shares with the daemon.
        gc.collect()
        gc.freeze()
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # runners are reaped by the kernel
        signal.signal(signal.SIGTERM, _leave)
        path = socket_path(self.base)
        fresh = self.base / f".{install_id()}.{os.getpid()}.sock"
        fresh.unlink(missing_ok=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(fresh))
        self.listener.listen(64)
        os.replace(fresh, path)  # a caller finds either the old (dead) socket or this one, ready
        bound = os.stat(path)
        print(f"serving {path} (pid {os.getpid()})", file=sys.stderr, flush=True)
        try:
            while self._next():
                pass
        except SystemExit:
            print("stopped by SIGTERM", file=sys.stderr)
        finally:
            self.listener.close()
            with contextlib.suppress(OSError):  # unless a newer daemon has put its own socket there
                now = os.stat(path)
                if (now.st_ino, now.st_dev) == (bound.st_ino, bound.st_dev):
                    path.unlink()
        return 0

    def _next(self) -> bool:
        """Serve one caller; False: time to go."""
        assert self.listener is not None
        left = self.idle_s - (time.monotonic() - self.last)
        if left <= 0 or not select.select([self.listener], [], [], left)[0]:
            print(f"idle for {self.idle_s:.0f} s: exiting", file=sys.stderr)
            return False
        conn, _ = self.listener.accept()
        self.last = time.monotonic()
        reader = Reader(conn)
        try:
            conn.settimeout(REQUEST_TIMEOUT_S)
            if peer_uid(conn) != os.geteuid():
                return True  # its socket is in a folder only this user enters; refuse anyone else regardless
            request = reader.message(with_fds=True)
            return self._answer(conn, reader, request)
        except (OSError, WireError):
            return True
        finally:
            conn.close()
            for fd in reader.fds:
                os.close(fd)

    def _answer(self, conn: socket.socket, reader: Reader, request: dict[str, Any]) -> bool:
        op = request.get("op")
        if op == "status":
            send(conn, {"pid": os.getpid(), "started": self.started, "served": self.served, "idle_s": self.idle_s,
                        "current": request.get("stamp") == self.stamp, "install": install_id()})
            return True
        if op == "stop":
            send(conn, {"stopping": os.getpid()})
            print("stopped on request (deployer daemon stop)", file=sys.stderr)
            return False
        if op != "run" or len(reader.fds) != 3:
            send(conn, {"error": "not a request this daemon knows"})
            return True
        theirs = request.get("stamp") or {}
        if theirs.get("caller") != self.stamp["caller"]:
            send(conn, {"other": "this caller's module path, interpreter flags, PYTHON* settings or process "
                                 "context (namespaces, cgroup, nice, CPUs, groups, limits) differ from the daemon's"})
            return True
        if theirs.get("code") != self.stamp["code"]:
            send(conn, {"stale": "deployer's code, its interpreter or a package on its module path changed since "
                                 "this daemon started"})
            print("a caller's code differs from what this daemon imported: exiting", file=sys.stderr)
            return False
        self.served += 1
        if os.fork() == 0:
            try:
                assert self.listener is not None
                self.listener.close()
                os.close(self.held)  # the place is the daemon's: a command that outlives it must not keep it
                _run(conn, reader, request, self.command)
            finally:
                os._exit(70)
        return True


def _leave(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _run(conn: socket.socket, reader: Reader, request: dict[str, Any], command: Callable[[], NoReturn]) -> None:
    """The runner: fork the command, tell the caller its pid, pass on the signals it sends, report its end.
    A caller gone before its command ended was killed: its command is killed too, as its own process would be."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # a handler, so that the wakeup fd hears of it
    signal.set_wakeup_fd(wake_w)
    runner = os.getpid()
    pid = os.fork()
    if pid == 0:
        _die_with(runner)
        conn.close()
        signal.set_wakeup_fd(-1)
        os.close(wake_r)
        os.close(wake_w)
        _become(request, reader.fds, command)
    for fd in reader.fds:
        os.close(fd)
    conn.settimeout(None)
    send(conn, {"pid": pid})
    status = _wait(conn, pid, wake_r, early=reader.buffer)
    try:
        if os.WIFSIGNALED(status):
            send(conn, {"signal": os.WTERMSIG(status)})
        else:
            send(conn, {"exit": os.waitstatus_to_exitcode(status)})
    except OSError:
        pass  # the caller is gone
    os._exit(0)


def _die_with(runner: int) -> None:
    """The command is killed when its runner dies (PR_SET_PDEATHSIG): a runner killed by hand must not leave it
    running unseen after its caller has reported that it ended. (ctypes is imported with this module, in the
    daemon: not again in each command.)"""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return  # not Linux: the caller's own death still ends it (the runner sees its EOF)
    if os.getppid() != runner:  # the runner died before the request took effect
        os._exit(70)


def _wait(conn: socket.socket, pid: int, wake: int, early: bytes) -> int:
    """The command's wait status. `early`: signals that came right behind the request."""
    _forward(pid, early)
    caller = True
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        watched: list[socket.socket | int] = [conn, wake] if caller else [wake]
        ready = select.select(watched, [], [])[0]
        if wake in ready:
            os.read(wake, 512)
        if conn in ready:
            try:
                signals = conn.recv(64)
            except OSError:
                signals = b""
            if not signals:
                caller = False
                os.kill(pid, signal.SIGKILL)
            _forward(pid, signals)


def _forward(pid: int, signals: bytes) -> None:
    for signum in signals:
        if signum in FORWARDED:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signum)


def _become(request: dict[str, Any], fds: list[int], command: Callable[[], NoReturn]) -> NoReturn:
    """Turn this fork into the caller's command: its group, signals, stdio, directory, umask, environment, argv."""
    try:
        os.setpgid(0, 0)
        for signum in _RESET:
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in dict(request["env"]).items()})
        sys.argv = [str(arg) for arg in request["argv"]]
        sys.path[:] = [str(entry) for entry in request["path"]]  # its script's folder first, as it started
        time.tzset()  # the caller's TZ
        _stdio(request["stdio"])
    except Exception as exc:
        os.write(2, f"deployer: the daemon could not set up this command: {exc!r}\n".encode())
        os._exit(70)
    _as_main(command)


def _as_main(command: Callable[[], NoReturn]) -> NoReturn:
    """Run the command as an interpreter runs its main module: what escapes it is printed and ends it as it
    would end a process of its own (1; an interrupt, by SIGINT)."""
    try:
        command()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    except BaseException:  # as the interpreter's top level: shown, then exit 1
        traceback.print_exc()
        code = 1
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _stdio(encodings: list[list[str]]) -> None:
    """The caller's stdin, stdout and stderr as Python made them at its start: its encodings, line-buffered
    where they are terminals (stderr always)."""
    for fd, (name, (encoding, errors)) in enumerate(zip(("stdin", "stdout", "stderr"), encodings, strict=True)):
        line = fd == 2 or os.isatty(fd)
        stream = open(fd, "r" if fd == 0 else "w", buffering=1 if line else -1,  # noqa: SIM115
                      encoding=encoding, errors=errors, closefd=False)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
