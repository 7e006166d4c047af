"""A command's side: hand the command to this user's daemon when one answers with the same code, else say so."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from pathlib import Path
from types import FrameType

from deployer.daemon.place import folder, private_folder, script_less_path, socket_path, stamp
from deployer.daemon.wire import FORWARDED, Reader, WireError, peer_uid, send

LOST = 70  # the daemon's runner ended without telling how the command did (killed by hand, out of memory)


def dial(base: Path | None = None) -> socket.socket | None:
    """A connection to this user's daemon for this install (None: none answers, or its folder is not private)."""
    base = folder() if base is None else base
    if private_folder(base, make=False) is not None:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(socket_path(base)))
        if peer_uid(conn) == os.geteuid():
            return conn
    except OSError:
        pass
    conn.close()
    return None


def handed_over() -> int | None:
    """Run this command in the daemon: its exit code (None: no daemon took it; run it here)."""
    conn = dial()
    if conn is None:
        return None
    with conn:
        # From before the request goes out: a Ctrl-C that comes while the command starts must reach it.
        forwarder = _Forwarder(conn)
        try:
            request = {"op": "run", "stamp": stamp(script_less_path()), "argv": sys.argv, "path": sys.path,
                       "cwd": os.getcwd(), "env": dict(os.environ), "umask": _umask(), "stdio": _encodings()}
            with _Stdio() as fds:
                send(conn, request, fds)
            forwarder.go()
            reader = Reader(conn)
            answer = reader.message()
        except (OSError, WireError):
            answer = {}  # it took nothing: it forks nothing before its answer
        if "pid" not in answer:  # no daemon took it (stale, or another version)
            forwarder.undo()
            return None
        return _end(reader)


class _Forwarder:
    """Sends each signal this process gets on to the command (its number, a byte, on the connection), once the
    request is out whole; those that came before go then. Not taken: the process gets them back itself."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.pending: list[int] = []
        self.going = False
        self.before = {signum: signal.signal(signum, self.handle) for signum in FORWARDED - {signal.SIGCONT}}

    def go(self) -> None:
        self.going = True
        for signum in self.pending:
            self.handle(signum, None)
        self.pending.clear()

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.going:
            self.pending.append(signum)
            return
        try:
            self.conn.send(bytes([signum]))
        except OSError:
            return
        if signum == signal.SIGTSTP:  # the command stopped; stop here too, as a shell expects, then resume both
            signal.signal(signal.SIGTSTP, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTSTP)
            signal.signal(signal.SIGTSTP, self.handle)
            with contextlib.suppress(OSError):
                self.conn.send(bytes([signal.SIGCONT]))

    def undo(self) -> None:
        for forwarded, handler in self.before.items():
            signal.signal(forwarded, handler)
        for signum in self.pending:
            os.kill(os.getpid(), signum)


def _end(reader: Reader) -> int:
    """The command's end, as this process's: its exit code, or the signal that ended it."""
    try:
        end = reader.message()
    except (OSError, WireError):
        print("deployer: the daemon's runner of this command ended without its exit status; "
              "`deployer runs list` shows what the run did", file=sys.stderr)
        return LOST
    if "signal" in end:
        signum = int(end["signal"])
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return 128 + signum
    return int(end.get("exit", LOST))


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _encodings() -> list[list[str]]:
    return [[getattr(stream, "encoding", None) or "utf-8", getattr(stream, "errors", None) or "strict"]
            for stream in (sys.stdin, sys.stdout, sys.stderr)]


class _Stdio:
    """This process's fds 0, 1 and 2, with /dev/null for any it was started without."""

    def __enter__(self) -> list[int]:
        self.opened: list[int] = []
        fds = []
        for fd in (0, 1, 2):
            try:
                os.fstat(fd)
                fds.append(fd)
            except OSError:
                null = os.open(os.devnull, os.O_RDWR)
                self.opened.append(null)
                fds.append(null)
        return fds

    def __exit__(self, *exc: object) -> None:
        for fd in self.opened:
            os.close(fd)
