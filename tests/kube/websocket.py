"""The server side of RFC 6455 that Kubernetes' `pods/exec` needs, and its channel protocol on top.

Only what kubectl's WebSocket executor (client-go `remotecommand`, v5.channel.k8s.io with v4 as fallback)
sends and expects: the upgrade handshake with subprotocol negotiation, masked client frames (binary, and
continuations of them), ping/pong, close. Every data frame carries one channel byte first: 0 stdin, 1 stdout,
2 stderr, 3 the exit status (a JSON `Status`), 4 terminal resize. In v5 the client closes a stream with the
frame `0xff <channel>` (kubectl sends `0xff 0x00` at the end of its stdin); v4 has no way to say so.
No extensions, no text frames from the server, no fragmentation of what the server sends.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import threading
from dataclasses import dataclass
from typing import BinaryIO

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
# Ours, in the order the API server prefers them (newest first): the first of these the client offers wins.
PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN, STDOUT, STDERR, STATUS, RESIZE = 0, 1, 2, 3, 4
CLOSE_STREAM = 0xFF  # v5: the frame [0xff, channel] closes that channel
OP_CONTINUATION, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


def accept_key(key: str) -> str:
    """Sec-WebSocket-Accept for a client's Sec-WebSocket-Key (RFC 6455 section 4.2.2)."""
    return base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()


def negotiate(offered: str) -> str | None:
    """The subprotocol we speak out of a Sec-WebSocket-Protocol header's list (None: none of ours)."""
    names = {name.strip() for name in offered.split(",")}
    return next((name for name in PROTOCOLS if name in names), None)


@dataclass(frozen=True)
class Frame:
    opcode: int
    payload: bytes


class Connection:
    """One upgraded connection: frames in from `reader`, frames out through `send_all` (several threads send)."""

    def __init__(self, reader: BinaryIO, send_all: object, protocol: str) -> None:
        self._reader = reader
        self._send_all = send_all
        self._lock = threading.Lock()
        self.protocol = protocol
        self.closed = False

    def _read_exact(self, size: int) -> bytes:
        data = self._reader.read(size) if size else b""
        if len(data) != size:
            raise EOFError("the client went away mid-frame")
        return data

    def receive(self) -> Frame:
        """The next whole message (continuations joined); control frames come back as they arrive."""
        fin, opcode, payload = self._frame()
        while not fin:
            fin, more_op, more = self._frame()
            if more_op != OP_CONTINUATION:  # a control frame between fragments: RFC 6455 allows one
                self._answer_control(more_op, more)
                fin = False
                continue
            payload += more
        return Frame(opcode, payload)

    def _answer_control(self, opcode: int, payload: bytes) -> None:
        if opcode == OP_PING:
            self.send(OP_PONG, payload)

    def _frame(self) -> tuple[bool, int, bytes]:
        first, second = self._read_exact(2)
        fin = bool(first & 0x80)
        opcode, masked, size = first & 0x0F, second & 0x80, second & 0x7F
        if size == 126:
            (size,) = struct.unpack("!H", self._read_exact(2))
        elif size == 127:
            (size,) = struct.unpack("!Q", self._read_exact(8))
        if not masked:  # RFC 6455 5.1: a server must close on an unmasked client frame
            raise ValueError("an unmasked frame from the client")
        mask = self._read_exact(4)
        data = self._read_exact(size)
        return fin, opcode, _unmask(data, mask)

    def send(self, opcode: int, payload: bytes) -> None:
        size = len(payload)
        if size < 126:
            head = struct.pack("!BB", 0x80 | opcode, size)
        elif size < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 126, size)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 127, size)
        with self._lock:
            if self.closed:
                return
            self._send_all(head + payload)  # type: ignore[operator]
            if opcode == OP_CLOSE:
                self.closed = True

    def send_channel(self, channel: int, data: bytes) -> None:
        self.send(OP_BINARY, bytes([channel]) + data)

    def close(self, code: int = 1000) -> None:
        self.send(OP_CLOSE, struct.pack("!H", code))


def _unmask(data: bytes, mask: bytes) -> bytes:
    # XOR through one big integer: a 1 MB stdin unmasks in milliseconds, not a Python loop per byte.
    if not data:
        return data
    repeated = (mask * (len(data) // 4 + 1))[: len(data)]
    return (int.from_bytes(data, "big") ^ int.from_bytes(repeated, "big")).to_bytes(len(data), "big")
