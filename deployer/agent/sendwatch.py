"""A bound on each write to the agent: one thread per client keeps them, not a timer thread per request.

A frozen link blocks a large write for good (the window never opens), so every write has a limit, counted from
before it waits for the write lock: a small request queued behind a frozen upload must not wait as long as the
upload may. A run sends dozens of requests in its first round trips; a thread started and stopped for each cost
more than the writes."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

IDLE_S = 30.0  # a watch with nothing to watch this long ends; the next write starts another


class SendWatch:
    """Calls on_expiry(reason) when a write is still waiting or going past its limit (then the client gives up on
    the pipe, which unblocks every writer)."""

    def __init__(self, name: str, on_expiry: Callable[[str], None]) -> None:
        self._name = name
        self._on_expiry = on_expiry
        self._cond = threading.Condition()
        self._deadlines: dict[int, tuple[float, str]] = {}  # each write in progress: its deadline and reason
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    @contextmanager
    def bounded(self, limit: float, reason: str) -> Iterator[None]:
        """What runs inside (the wait for the write lock, then the write) must end within limit seconds, or
        on_expiry(reason) is called from the watch."""
        with self._cond:
            key = next(self._ids)
            self._deadlines[key] = (time.monotonic() + limit, reason)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name=f"agent-send-{self._name}", daemon=True)
                self._thread.start()
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._deadlines.pop(key, None)

    def _watch(self) -> None:
        with self._cond:
            try:
                while self._deadlines or self._cond.wait(IDLE_S) or self._deadlines:
                    if not self._deadlines:
                        continue
                    key, (deadline, reason) = min(self._deadlines.items(), key=lambda item: item[1][0])
                    left = deadline - time.monotonic()
                    if left > 0:
                        self._cond.wait(min(left, IDLE_S))
                        continue
                    del self._deadlines[key]
                    self._cond.release()  # on_expiry closes the pipe; a write ending meanwhile must not wait on us
                    try:
                        self._on_expiry(reason)
                    finally:
                        self._cond.acquire()
            finally:
                self._thread = None  # idle (or broken): the next write starts a watch again
