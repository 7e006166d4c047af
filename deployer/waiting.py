"""Waits that a signal can cut into, whichever thread the kernel handed it to.

Python runs a signal's handler in the main thread, and only once that thread runs Python code again. The kernel
may give a process's SIGTERM to any of its threads: while the main thread sat in a lock's wait (a future's result,
a thread's join, an event without a timeout), the handler of a signal another thread took waited as long as that
wait did, and a fleet's stop came only after every host had committed (the fleet signal test's exit 0). These
waits wake every SLICE_S, so a handler runs within that of its signal."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, wait

SLICE_S = 0.2


def waited(wait_for: Callable[[float], bool], timeout: float | None = None) -> bool:
    """wait_for(seconds) -> done, called a slice at a time until it is done (True) or timeout passed (False)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if wait_for(SLICE_S if left is None else max(0.0, min(SLICE_S, left))):
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False


def joined(thread: threading.Thread) -> None:
    """thread.join(), a slice at a time."""
    waited(lambda seconds: _joined(thread, seconds))


def _joined(thread: threading.Thread, seconds: float) -> bool:
    thread.join(seconds)
    return not thread.is_alive()


def all_done(futures: Sequence[Future[object]]) -> None:
    """Every future done, a slice at a time, as list(pool.map(...)) waits: the first failure cancels what has not
    started and is raised once what runs has ended."""
    waited(lambda seconds: _settled(futures, seconds))
    for future in futures:
        if not future.cancelled():
            future.result()


def _settled(futures: Sequence[Future[object]], seconds: float) -> bool:
    if any(f.done() and not f.cancelled() and f.exception() is not None for f in futures):
        for future in futures:
            future.cancel()  # those not started; what runs goes on to its end
        return not wait([f for f in futures if not f.done()], seconds).not_done
    return not wait(futures, seconds, return_when=FIRST_EXCEPTION).not_done
