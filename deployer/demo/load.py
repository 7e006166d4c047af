"""A steady client load through a router while a rollout runs: a few clients, each request bounded by a timeout,
the whole load bounded in count and time, and what the clients saw (sent, ok, failed, p50/p99 of the answers).
`deployer demo --fleet` runs it during its rolling apply, and bench/bench_rollout.py to compare restarts.

A request counts as ok only on HTTP 200 with a full streamed generation: the router's and the servers' answers are
input, so a broken stream, a `finish_reason` of error or abort, or a body that is not a generation is a failure.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from pydantic import BaseModel

from deployer.text import shown

if TYPE_CHECKING:
    from deployer.steps.cancel import CancelToken

KEPT_FAILURES = 5  # the first few failures, for the message; the counts say how many
SERVED_POLL_S = 0.1


class LoadReport(BaseModel):
    sent: int
    ok: int
    failed: int
    p50_ms: float | None  # of the requests that succeeded (None: none did)
    p99_ms: float | None
    failures: list[str]  # the first KEPT_FAILURES, escaped

    def summary(self) -> dict[str, int | float | None]:
        return self.model_dump(exclude={"failures"})


def percentile(values: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile (no interpolation: the value some request really took)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))]


def failure_of(status: int, body: str) -> str | None:
    """Why a streamed /generate answer is not a full generation, None when it is."""
    if status != 200:
        return f"HTTP {status}: {shown(body)}"
    chunks = []
    for line in body.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            try:
                chunks.append(json.loads(line[len("data: "):]))
            except ValueError:
                return f"not a JSON chunk: {shown(line)}"
    last = chunks[-1] if chunks and isinstance(chunks[-1], dict) else {}
    meta = last.get("meta_info")
    finish = meta.get("finish_reason") if isinstance(meta, dict) else None
    kind = finish.get("type") if isinstance(finish, dict) else finish
    if kind not in ("length", "stop"):  # error, abort, missing: the generation did not end as one
        return f"finish_reason {shown(finish)} (last chunk {shown(last)})"
    return None


class Load:
    """`clients` threads sending streamed /generate requests to `url` one after the other (`pause_s` between),
    until stopped, `max_requests` were sent, or `seconds` passed; each request gives up after `timeout_s`."""

    def __init__(self, url: str, *, clients: int = 3, max_requests: int = 3000, seconds: float = 120.0,
                 timeout_s: float = 10.0, pause_s: float = 0.02, max_new_tokens: int = 4) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"load URL {url!r}: expected http://HOST:PORT")
        self.host, self.port, self.path = parts.hostname, parts.port, parts.path or "/generate"
        self.clients, self.max_requests, self.seconds = clients, max_requests, seconds
        self.timeout_s, self.pause_s = timeout_s, pause_s
        self.body = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": max_new_tokens}, "stream": True})
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sent = 0
        self._latencies: list[float] = []
        self._failures: list[str] = []
        self._failed = 0
        self._threads: list[threading.Thread] = []
        self.report: LoadReport | None = None  # once stopped

    def one(self) -> str | None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.request("POST", self.path, body=self.body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return failure_of(resp.status, resp.read().decode("utf-8", "replace"))
        except (OSError, http.client.HTTPException) as exc:
            return f"{type(exc).__name__}: {shown(str(exc))}"
        finally:
            conn.close()

    def _client(self, deadline: float) -> None:
        while not self._stop.is_set() and time.monotonic() < deadline:
            with self._lock:
                if self._sent >= self.max_requests:
                    return
                self._sent += 1
            started = time.monotonic()
            failure = self.one()
            took_ms = (time.monotonic() - started) * 1000
            with self._lock:
                if failure is None:
                    self._latencies.append(took_ms)
                else:
                    self._failed += 1
                    if len(self._failures) < KEPT_FAILURES:
                        self._failures.append(failure)
            self._stop.wait(self.pause_s)

    @property
    def ok(self) -> int:
        """The requests served so far."""
        with self._lock:
            return len(self._latencies)

    def served(self, count: int, within_s: float, cancel: CancelToken) -> bool:
        """Wait until count requests were served, at most within_s (a signal cuts it short); whether they were."""
        deadline = time.monotonic() + within_s
        while self.ok < count and (left := deadline - time.monotonic()) > 0:
            cancel.wait(min(SERVED_POLL_S, left))
        return self.ok >= count

    def __enter__(self) -> Load:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.report = self.stop()

    def start(self) -> Load:
        deadline = time.monotonic() + self.seconds
        self._threads = [threading.Thread(target=self._client, args=(deadline,), name=f"load-{i}", daemon=True)
                         for i in range(self.clients)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> LoadReport:
        """Stop sending, wait for the requests in flight (each bounded by its timeout), and say what was seen."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout_s + 5)
        with self._lock:
            latencies, failed = list(self._latencies), self._failed
            return LoadReport(sent=len(latencies) + failed, ok=len(latencies), failed=failed,
                              p50_ms=rounded(percentile(latencies, 0.50)),
                              p99_ms=rounded(percentile(latencies, 0.99)), failures=list(self._failures))


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
