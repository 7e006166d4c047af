"""The demo's load waits for the requests it served, not for a time: `deployer demo --fleet` starts its rollout
once the load is steady (deployer/demo/run.py's warm-up). A real HTTP server on 127.0.0.1 answers the clients."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
from fixtures_services import served

from deployer.demo.load import Load
from deployer.errors import Interrupted
from deployer.steps.cancel import CancelToken

GENERATION = ("data: " + json.dumps({"text": "x", "meta_info": {"finish_reason": {"type": "length"}}})
              + "\n\ndata: [DONE]\n\n").encode()


@pytest.fixture
def serving() -> Iterator[str]:
    with served(lambda path: GENERATION) as server:
        yield f"http://127.0.0.1:{server.port}/generate"


@pytest.fixture
def failing() -> Iterator[str]:
    with served(lambda path: b"no", status=500) as server:
        yield f"http://127.0.0.1:{server.port}/generate"


def test_served_returns_once_the_load_served_that_many(serving: str) -> None:
    with Load(serving, clients=2, max_requests=200, seconds=30, pause_s=0.01) as load:
        assert load.served(10, 20.0, CancelToken())
        assert load.ok >= 10
    assert load.report is not None and load.report.failed == 0


def test_served_gives_up_at_its_deadline_when_nothing_is_served(failing: str) -> None:
    with Load(failing, clients=2, max_requests=200, seconds=30, pause_s=0.01) as load:
        started = time.monotonic()
        assert not load.served(1, 0.5, CancelToken())
        assert 0.5 <= time.monotonic() - started < 10
    assert load.report is not None and load.report.ok == 0 and load.report.failed > 0


def test_a_signal_cuts_the_wait_short(failing: str) -> None:
    cancel = CancelToken()
    with Load(failing, clients=1, max_requests=50, seconds=30, pause_s=0.01) as load:
        threading.Timer(0.2, cancel.cancel).start()
        started = time.monotonic()
        with pytest.raises(Interrupted):
            load.served(1, 60.0, cancel)
        assert time.monotonic() - started < 30
