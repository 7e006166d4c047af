"""Each write to the agent is bounded by its own limit, the wait for the write lock included.

A frozen link is faked here (a pipe whose writes block until it is closed): a real one that freezes inside a
write is tests/transport/test_safety_wire.py's relay; this is the case it cannot time, a small request queued
behind a write that froze."""

from __future__ import annotations

import threading
import time

import pytest

from deployer.agent.client import AgentClient
from deployer.agent.protocol import Run, Stat
from deployer.errors import AgentLost


class FrozenPipe:
    """Takes the first write; every later one blocks until the pipe is closed, then fails."""

    def __init__(self) -> None:
        self.closed = threading.Event()
        self.writes = 0

    def read(self, size: int) -> bytes:
        self.closed.wait()
        return b""

    def write(self, data: bytes) -> None:
        self.writes += 1
        if self.writes > 1:
            self.closed.wait()
            raise OSError("the link is closed")

    def close(self, kill: bool = False) -> None:
        self.closed.set()

    def stderr_tail(self, *, ended: bool = False) -> str:
        return ""


def test_a_request_behind_a_frozen_write_gives_up_at_its_own_limit() -> None:
    pipe = FrozenPipe()
    client = AgentClient(pipe, name="frozen")
    client.submit(Run(("true",)))  # through
    holder = threading.Thread(target=client.submit, args=(Run(("true",), timeout=20),), daemon=True)
    holder.start()  # blocks inside its write, holding the write lock, for up to 25 s
    deadline = time.monotonic() + 10
    while pipe.writes < 2:
        assert time.monotonic() < deadline, "the second write never started"
        time.sleep(0.01)
    started = time.monotonic()
    client.submit(Stat(("/",)), timeout=1.0)  # waits for the lock: its own 1 s bounds that wait
    assert time.monotonic() - started < 8, "the stat waited for the frozen write's limit, not its own"
    with pytest.raises(AgentLost, match=r"sending 'stat' to the agent did not finish within 1s"):
        client.submit(Stat(("/",)))
    holder.join(10)
    assert not holder.is_alive() and pipe.closed.is_set()
