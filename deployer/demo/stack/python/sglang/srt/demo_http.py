"""HTTP plumbing shared by the demo servers and the demo router.

Only the standard library is used, so the stack runs from a bare checkout. The parts that are
not obvious:

- A client that goes away must abort its request, as in SGLang. A thread blocked waiting for a
  KV transfer never writes to the client, so it would never notice; :func:`client_gone` and
  :class:`DisconnectWatch` look for the EOF/RST on the socket instead.
- A storm opens dozens of connections at once; the listen backlog is raised so ``/health``
  keeps answering promptly instead of waiting out a SYN retransmit.
"""

from __future__ import annotations

import contextlib
import json
import math
import select
import signal
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # demo_latency renders with this module: only its type is needed here
    from sglang.srt.demo_latency import Request

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def require_loopback(host: str, what: str) -> None:
    """The demo must never listen on or talk to anything but this machine."""
    if host not in LOOPBACK_HOSTS:
        raise SystemExit(f"{what}: {host!r} is not a loopback address; the demo stack is local-only")


class DemoHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512

    def __init__(self, host: str, port: int, handler: type[BaseHTTPRequestHandler], app: Any) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.app = app
        super().__init__((host, port), handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Peers hanging up mid-answer is what a storm does all day; only real bugs get a traceback.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the FQDN of the bind address, which can stall on a
        # machine with slow DNS; nothing here needs it.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)


class JSONHandler(BaseHTTPRequestHandler):
    """Keep-alive (HTTP/1.1) handler with JSON and chunked-streaming helpers."""

    protocol_version = "HTTP/1.1"
    server_version = "sglang-demo"
    _streaming = False

    def setup(self) -> None:
        # Headers and body go out in separate writes; with Nagle on, the second one waits for
        # the peer's delayed ACK (~40 ms), which would dwarf every timing knob of the demo.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        # An access log line per request would drown the startup/error lines under a storm.
        return

    def read_json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        if not raw:
            return {}
        value = json.loads(raw)
        if not isinstance(value, dict):
            raise ValueError("request body must be a JSON object")
        return value

    def send_bytes(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, code: int, obj: Any) -> None:
        self.send_bytes(code, json.dumps(obj).encode(), "application/json")

    def send_text(self, code: int, text: str, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_bytes(code, text.encode(), content_type)

    def start_stream(self, code: int = 200, content_type: str = "text/event-stream") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        self._streaming = True

    def write_chunk(self, data: bytes) -> None:
        """Send one chunk; raises OSError once the client is gone."""
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    def end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self._streaming = False

    def abandon(self) -> None:
        """Give up on this connection: the response can no longer be framed correctly."""
        self.close_connection = True
        self._streaming = False


def client_gone(sock: socket.socket) -> bool:
    """True when the peer closed or reset the connection; never blocks, never consumes data."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    if not readable:
        return False
    try:
        data = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except OSError:
        return True
    # Data means the client pipelined another request: it is still there.
    return data == b""


def stream_tokens(handler: JSONHandler, events: list[bytes], last: bytes, request: Request) -> bool:
    """Stream one SSE event per token, each after the request's wait, then ``last`` and ``data: [DONE]``: False
    when the client went away first (a closed stream is how a client cancels), True when the stream ended."""
    sock = handler.connection
    try:
        handler.start_stream()
        for event in events:
            time.sleep(request.wait_s())
            if client_gone(sock):
                raise ConnectionResetError("the client closed the stream")
            handler.write_chunk(event)
            request.token()
        handler.write_chunk(last)
        handler.write_chunk(b"data: [DONE]\n\n")
        handler.end_stream()
    except OSError:
        handler.abandon()
        request.finish(completed=False)
        return False
    request.finish(completed=True)
    return True


class DisconnectWatch:
    """Runs ``on_gone`` once if the client disconnects while the handler is blocked elsewhere.

    The router's handler sits in a blocking read from the decode server; only a second thread
    can notice the client leaving and close the upstream connections so that the servers see
    the disconnect too and abort.
    """

    def __init__(self, sock: socket.socket, on_gone: Callable[[], None], interval: float = 0.02) -> None:
        self.gone = threading.Event()
        self._sock = sock
        self._on_gone = on_gone
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="disconnect-watch", daemon=True)

    def __enter__(self) -> DisconnectWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                readable, _, _ = select.select([self._sock], [], [], self._interval)
            except (OSError, ValueError):
                readable = [self._sock]
            if not readable or self._stop.is_set():
                continue
            if client_gone(self._sock):
                self.gone.set()
                self._on_gone()
                return
            # Pipelined bytes keep the socket readable; stop watching rather than spin.
            return


def shutdown_socket(sock: socket.socket | None) -> None:
    """Unblock whatever thread is reading ``sock`` and make the peer see EOF right away."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def serve_in_background(server: DemoHTTPServer) -> threading.Thread:
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="http-serve", daemon=True
    )
    thread.start()
    return thread


class StopFlag:
    """Set by SIGTERM/SIGINT; the main thread polls it and shuts down in order.

    The signal handler only flips a boolean: taking a lock there (as ``Event.set`` does) can
    deadlock if the signal lands while the main thread holds that same lock.
    """

    def __init__(self) -> None:
        self.requested = False
        self.event = threading.Event()

    def install(self) -> StopFlag:
        def _handler(signum: int, frame: object) -> None:
            self.requested = True

        signal.signal(signal.SIGTERM, _handler)
        signal.signal(signal.SIGINT, _handler)
        return self

    def sleep(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True as soon as a stop was requested."""
        deadline = time.monotonic() + seconds
        while not self.requested:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(remaining, 0.05))
        self.event.set()
        return True

    def wait(self) -> None:
        while not self.sleep(3600.0):
            pass


def install_stop_signals() -> StopFlag:
    return StopFlag().install()


def shutdown_servers(servers: list[DemoHTTPServer]) -> None:
    """Stop all serve loops at once (each takes up to a poll interval) and close the sockets."""
    threads = [threading.Thread(target=server.shutdown, daemon=True) for server in servers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=2.0)
    for server in servers:
        server.server_close()


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape_label(str(labels[k]))}"' for k in sorted(labels))
    return "{" + inner + "}"


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def render_family(
    name: str, kind: str, help_text: str, samples: Iterable[tuple[str, Mapping[str, str], float]]
) -> str:
    """One metric family in the Prometheus text format: HELP, TYPE, then its samples."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for sample_name, labels, value in samples:
        lines.append(f"{sample_name}{format_labels(labels)} {format_value(value)}")
    return "\n".join(lines) + "\n"
