"""pods/portforward: SPDY streams (spdy.py) bridged to TCP connections into the pod, as the kubelet does.

kubectl opens, for each connection made to its local port, two streams with headers `streamType: error|data`,
`port: PORT` and the same `requestID`; each is accepted with a SYN_REPLY. The data stream's bytes go to PORT in the
pod and the pod's answer comes back on it (FIN when either side is done). When nothing listens there, the error
stream carries the kubelet's message and is closed, as is the data stream: kubectl prints it and (since client-go
closes its connection on a stream's error) ends with "lost connection to pod". The stand-in's pods share the host's
network namespace, so the pod's PORT is 127.0.0.1:PORT here.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

from . import spdy

CHUNK = 65536


class Bridge:
    """One port-forward connection: kubectl's streams, each data stream a socket to the pod's port."""

    def __init__(self, codec: spdy.Codec, pod: str, uid: str) -> None:
        self.codec = codec
        self.pod, self.uid = pod, uid
        self.errors: dict[str, int] = {}  # requestID -> its error stream
        self.sockets: dict[int, socket.socket] = {}  # data stream -> its connection into the pod
        self.lock = threading.Lock()

    def serve(self) -> None:
        """Frames until kubectl goes (or says GOAWAY); every connection into the pod closed after."""
        try:
            while True:
                frame = self.codec.receive()
                if frame.control and frame.kind == spdy.GOAWAY:
                    return
                self.handle(frame)
        except (EOFError, OSError, ValueError):
            return
        finally:
            with self.lock:
                open_now, self.sockets = list(self.sockets.values()), {}
            for sock in open_now:
                sock.close()

    def handle(self, frame: spdy.Frame) -> None:
        if not frame.control:
            with self.lock:
                sock = self.sockets.get(frame.stream)
            if sock is not None:
                with contextlib.suppress(OSError):
                    if frame.payload:
                        sock.sendall(frame.payload)
                    if frame.fin:
                        sock.shutdown(socket.SHUT_WR)
        elif frame.kind == spdy.SYN_STREAM:
            self.open(frame.stream, self.codec.headers(frame))
        elif frame.kind == spdy.RST_STREAM:
            with self.lock:
                sock = self.sockets.pop(frame.stream, None)
            if sock is not None:
                sock.close()
        elif frame.kind == spdy.PING:
            self.codec.control(spdy.PING, frame.payload)

    def open(self, stream: int, headers: dict[str, str]) -> None:
        kind, port, request = headers.get("streamtype"), headers.get("port", ""), headers.get("requestid", "")
        self.codec.reply(stream)
        if kind == "error":
            self.errors[request] = stream
            return
        try:
            sock = socket.create_connection(("127.0.0.1", int(port)), timeout=5)
        except (OSError, ValueError) as exc:
            message = (f"failed to connect to localhost:{port} inside namespace of pod {self.pod}, IPv4: "
                       f"dial tcp4 127.0.0.1:{port}: connect: {(exc.strerror or str(exc)).lower()}")
            error = self.errors.get(request)
            if error is not None:
                self.codec.data(error, message.encode(), fin=True)
            self.codec.data(stream, b"", fin=True)
            return
        sock.settimeout(None)
        with self.lock:
            self.sockets[stream] = sock
        threading.Thread(target=self.pump, args=(stream, sock), daemon=True,
                         name=f"portforward-{self.pod}-{port}").start()

    def pump(self, stream: int, sock: socket.socket) -> None:
        """The pod's bytes back on the data stream, then its FIN."""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(CHUNK):
                self.codec.data(stream, chunk)
            self.codec.data(stream, b"", fin=True)


def exact_reader(read: Callable[[int], bytes]) -> Callable[[int], bytes]:
    """read(n) until n bytes, or EOFError: a socket file's reads."""
    def read_exact(size: int) -> bytes:
        data = read(size) if size else b""
        if len(data) != size:
            raise EOFError("kubectl went away mid-frame")
        return data
    return read_exact


class MessageReader:
    """The SPDY byte stream out of WebSocket binary messages (a ping answered, a close the end)."""

    def __init__(self, receive: Callable[[], tuple[int, bytes]], on_ping: Callable[[bytes], None]) -> None:
        self._receive = receive
        self._on_ping = on_ping
        self._buffer = bytearray()

    def read_exact(self, size: int) -> bytes:
        from .websocket import OP_BINARY, OP_CLOSE, OP_PING

        while len(self._buffer) < size:
            opcode, payload = self._receive()
            if opcode == OP_CLOSE:
                raise EOFError("kubectl closed the WebSocket")
            if opcode == OP_PING:
                self._on_ping(payload)
            elif opcode == OP_BINARY:
                self._buffer += payload
        data, self._buffer = bytes(self._buffer[:size]), self._buffer[size:]
        return data
