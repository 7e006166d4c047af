"""Waits in slices (deployer/waiting.py): done as soon as the thing is, never before the timeout otherwise."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from deployer.waiting import all_done, waited


def test_waited_is_true_once_done_and_false_only_at_its_timeout() -> None:
    done = threading.Event()
    threading.Timer(0.3, done.set).start()
    assert waited(done.wait, 30)
    calls = []
    started = time.monotonic()
    # A wait that returns at once (an early wake-up) must not end the timeout early.
    assert not waited(lambda seconds: bool(calls.append(seconds)), 0.5)
    assert time.monotonic() - started >= 0.5
    assert all(0 <= seconds <= 0.2 for seconds in calls)


def test_all_done_raises_the_first_failure_after_the_others_ended() -> None:
    ended = []

    def slow() -> None:
        time.sleep(0.3)
        ended.append("slow")

    def failing() -> None:
        raise ValueError("this one failed")

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(slow), pool.submit(failing)]
        with pytest.raises(ValueError, match="this one failed"):
            all_done(futures)
        assert ended == ["slow"]  # what was running went on to its end before the failure came out
