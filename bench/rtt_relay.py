"""A TCP relay on 127.0.0.1 that adds a round-trip time (and, when asked, a bandwidth limit), and counts the round
trips it saw and the bytes the client sent.

These machines have no `tc netem`; a relay in front of sshd stands in for a far network. Each
chunk is held RTT/2 in its direction (chunks keep their order and do not serialise: a burst
pipelined behind another arrives RTT/2 after it was sent, as on a real link), and a new
connection waits one RTT before anything flows, the cost of the TCP handshake the relay hides.

A *round trip* is counted per connection each time the server answers after the client spoke
(a client->server burst followed by a server->client burst); the connection's handshake counts
as one. That is what a client waits for on a far link, whatever the bytes are.

`first_byte_at` is the time.monotonic() at which the first client->server byte of the first
connection since reset_counts() reached the relay (stamped as the kernel hands it over, not when
the relay forwards it after the handshake wait): a bench in this process compares it with the
time it spawned the client.

Bounded: at most MAX_CONNECTIONS at once, and each direction buffers at most QUEUE_CHUNKS chunks
before it stops reading (backpressure).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterable, Iterator
from typing import SupportsIndex

MAX_CONNECTIONS = 64
QUEUE_CHUNKS = 256
CHUNK = 65536
C2S, S2C = "c2s", "s2c"


class _StampedReader(asyncio.StreamReader):
    """A stream reader that remembers when its first byte arrived."""

    first_byte_at: float | None = None

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:  # bytes, typed as asyncio's
        if self.first_byte_at is None and data:
            self.first_byte_at = time.monotonic()
        super().feed_data(data)


class LatencyRelay:
    """Listens on 127.0.0.1:<port> and forwards to 127.0.0.1:<target_port> with `rtt_s` added."""

    def __init__(self, target_port: int, rtt_s: float = 0.0) -> None:
        self.target_port = target_port
        self.rtt_s = rtt_s
        self.rate_bps = 0.0  # > 0: each direction of a connection carries at most this many bits a second
        self.round_trips = 0
        self.connections = 0
        self.bytes_sent = 0  # client to server, every connection: what the client puts on the link
        self._first: _StampedReader | None = None  # the client side of the first connection since reset_counts()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rtt-relay", daemon=True)
        self._thread.start()
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self._server = asyncio.run_coroutine_threadsafe(
            self._loop.create_server(self._protocol, "127.0.0.1", 0), self._loop).result(10)
        self.port: int = self._server.sockets[0].getsockname()[1]

    def reset_counts(self) -> None:
        with self._lock:
            self.round_trips = 0
            self.connections = 0
            self.bytes_sent = 0
            self._first = None

    @property
    def first_byte_at(self) -> float | None:
        """When the first connection since reset_counts() got its first client byte; None before that."""
        with self._lock:
            return self._first.first_byte_at if self._first else None

    def _protocol(self) -> asyncio.StreamReaderProtocol:
        """What asyncio.start_server builds per connection, with a reader that stamps its first byte."""
        reader = _StampedReader()
        with self._lock:
            if self._first is None:
                self._first = reader
        return asyncio.StreamReaderProtocol(reader, self._handle)

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            # Relayed connections still open are cut, as a network going away would.
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._server.wait_closed()
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> LatencyRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _count(self, round_trips: int = 0, connections: int = 0, sent: int = 0) -> None:
        with self._lock:
            self.round_trips += round_trips
            self.connections += connections
            self.bytes_sent += sent

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        writers = [client_w]
        try:
            async with self._slots:
                self._count(round_trips=1, connections=1)
                await asyncio.sleep(self.rtt_s)  # the TCP handshake a real far link would cost
                upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", self.target_port)
                writers.append(upstream_w)
                last = [C2S]
                await asyncio.gather(self._pump(client_r, upstream_w, C2S, last),
                                     self._pump(upstream_r, client_w, S2C, last))
        except (OSError, asyncio.CancelledError):
            pass  # refused upstream, a reset, or close(): the connection ends either way
        finally:
            for writer in writers:
                writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str,
                    last: list[str]) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(QUEUE_CHUNKS)
        link_free_at = 0.0  # when the shaped link has sent what it was given so far (rate_bps)

        async def receive() -> None:
            nonlocal link_free_at
            try:
                while data := await reader.read(CHUNK):
                    if direction == S2C and last[0] == C2S:
                        self._count(round_trips=1)
                    elif direction == C2S:
                        self._count(sent=len(data))
                    last[0] = direction
                    sent_at = loop.time()
                    if self.rate_bps > 0:  # a bottleneck: each chunk waits for the ones before it to go through
                        sent_at = link_free_at = max(sent_at, link_free_at) + len(data) * 8 / self.rate_bps
                    await queue.put((sent_at + self.rtt_s / 2, data))
            finally:
                await queue.put(None)

        async def send() -> None:
            broken = False  # keep emptying the queue, so receive() never blocks on a dead peer
            while (item := await queue.get()) is not None:
                due, data = item
                if broken:
                    continue
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                try:
                    writer.write(data)
                    await writer.drain()
                except (OSError, ConnectionError):
                    broken = True
            with contextlib.suppress(OSError, ConnectionError):
                if not broken and writer.can_write_eof():
                    writer.write_eof()

        await asyncio.gather(receive(), send())


@contextlib.contextmanager
def latency_relay(target_port: int, rtt_s: float = 0.0) -> Iterator[LatencyRelay]:
    relay = LatencyRelay(target_port, rtt_s)
    try:
        yield relay
    finally:
        relay.close()
