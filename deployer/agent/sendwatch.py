"""A bound on each write to the agent: one thread per client keeps it, not a timer thread per request.

A frozen link blocks a large write for good (the window never opens), so every write has a limit. A run sends
dozens of requests in its first round trips; a thread started and stopped for each cost more than the write."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class SendWatch:
    """Calls on_expiry(reason) when a write is still going past its limit. The client writes one at a time
    (under its write lock), so one deadline is enough; the thread starts with the first write."""

    def __init__(self, name: str, on_expiry: Callable[[str], None]) -> None:
        self._name = name
        self._on_expiry = on_expiry
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._reason = ""
        self._thread: threading.Thread | None = None
        self._stopped = False

    @contextmanager
    def bounded(self, limit: float, reason: str) -> Iterator[None]:
        """The write inside must end within limit seconds, or on_expiry(reason) is called (from the watch)."""
        with self._cond:
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._watch, name=f"agent-send-{self._name}", daemon=True)
                self._thread.start()
            self._deadline, self._reason = time.monotonic() + limit, reason
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._deadline = None

    def stop(self) -> None:
        """No more writes: the thread ends."""
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _watch(self) -> None:
        with self._cond:
            while not self._stopped:
                left = None if self._deadline is None else self._deadline - time.monotonic()
                if left is None or left > 0:
                    self._cond.wait(left)
                    continue
                reason, self._deadline = self._reason, None
                self._cond.release()  # on_expiry closes the pipe; a write ending meanwhile must not wait on us
                try:
                    self._on_expiry(reason)
                finally:
                    self._cond.acquire()
