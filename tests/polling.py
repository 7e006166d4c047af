"""Waiting on a condition the way the tests do: polled against a deadline, never a sleep that hopes."""

from __future__ import annotations

import time
from collections.abc import Callable


def within(condition: Callable[[], object], seconds: float, interval_s: float = 0.02) -> bool:
    """Whether `condition()` came true within `seconds` (asked once more at the deadline)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() >= deadline:
            return bool(condition())
        time.sleep(interval_s)
    return True


def wait_for(condition: Callable[[], object], what: str, seconds: float = 60) -> None:
    """Fail the test, naming `what`, unless `condition()` comes true within `seconds`."""
    assert within(condition, seconds), f"not within {seconds}s: {what}"
