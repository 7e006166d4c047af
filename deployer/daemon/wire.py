"""What a command and the daemon say to each other on the socket: JSON objects, a line each; the command's stdio
file descriptors ride with its request; after the fork answers, each byte the command sends is a signal's number
for the fork."""

from __future__ import annotations

import json
import signal
import socket
import struct
from typing import Any

MAX_FDS = 3
# What a caller may ask its command to receive: what a terminal or a supervisor sends a foreground command.
FORWARDED = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGWINCH,
                       signal.SIGTSTP, signal.SIGCONT, signal.SIGUSR1, signal.SIGUSR2})
_LINE_MAX = 1 << 22  # a request carries the command's environment; nothing honest is larger


class WireError(Exception):
    """The other side broke the protocol or went away."""


def send(conn: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode() + b"\n"
    if fds:
        sent = socket.send_fds(conn, [data], fds)
        data = data[sent:]
    conn.sendall(data)


def peer_uid(conn: socket.socket) -> int:
    """The user id of the process at the other end, as the kernel saw it connect."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


class Reader:
    """The lines one side receives, and the descriptors that came with the first."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buffer = b""
        self.fds: list[int] = []

    def message(self, with_fds: bool = False) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            if with_fds and not self.buffer and not self.fds:
                chunk, fds, _, _ = socket.recv_fds(self.conn, 1 << 16, MAX_FDS)
                self.fds = list(fds)
            else:
                chunk = self.conn.recv(1 << 16)
            if not chunk:
                raise WireError("the other side closed the connection")
            self.buffer += chunk
            if len(self.buffer) > _LINE_MAX:
                raise WireError("a message longer than any request")
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            found = json.loads(line)
        except ValueError as exc:
            raise WireError(f"not a JSON message: {exc}") from None
        if not isinstance(found, dict):
            raise WireError("a message that is not a JSON object")
        return found
