"""A canary `via:` the router proves the new workers behind it: its request through the router is sent once the unit's
workers are back in the router and listed (while they are out, the router could only send it to the other units),
and when it fails the unit leaves the router again before its rollback restarts it, and comes back on the old code.
Over the demo PD fleet of test_rolling_router (four hosts, one router, real HTTP servers) and a plain host behind
the router."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_host_router import behind_router_alone
from test_rolling_router import (
    PLAYBOOK,
    PdFleet,
    RouterHost,
    every_worker,
    listed_healthy,
    load_through,
    make_fleet,
    running,
)

pytestmark = pytest.mark.long  # tests/conftest.py: scheduled first

CANARY = {"canary": {"service": "prefill", "via": "pd-router", "max_new_tokens": 4}}
# The demo router picks a prefill and a decode at random; this one picks its newest (the last added), so that its
# request after a unit came back reaches that unit's new workers every time (the canary asks once).
NEWEST = "import random, runpy; random.choice = lambda seq: seq[-1]; " \
         "runpy.run_module('sglang_router.launch_router', run_name='__main__')"
# pd-1's decode, started by deployer: 1s a token on any build (the rollback's restart too).
SLOW_ALWAYS = 'export SGLANG_DEMO_TOKEN_S=1; exec "$@"'
# pd-1's decode, started on the shipped note, takes 1s a token: the pair through the router answers the canary's
# 4 tokens past its 2s bound (a direct generation does not wait on tokens); the clients are only slower.
SLOW_ON_THE_NOTE = 'grep -q rolled sglang/srt/demo_note.py 2>/dev/null && export SGLANG_DEMO_TOKEN_S=1; exec "$@"'


def with_canary(fleet: PdFleet, canary: dict[str, Any], **playbook: Any) -> None:
    steps = [*PLAYBOOK["steps"], canary]
    (fleet.root / "note.yaml").write_text(yaml.safe_dump({**PLAYBOOK, "steps": steps, **playbook}, sort_keys=False))


def events(fleet: PdFleet, run_id: str) -> list[dict[str, Any]]:
    path = fleet.runs / run_id / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def order(fleet: PdFleet, run_id: str) -> list[str]:
    """The run's router steps and canary answers in order: router_add, router_listed, canary:direct, canary:router...
    (a rollback's canary answers as rollback:canary:direct, rollback:canary:router)."""
    return [e["type"] if e["type"] != "canary" else ("rollback:" if (e["step"] or "").startswith("rollback:") else "")
            + "canary:" + ("router" if "router" in e else "direct")
            for e in events(fleet, run_id) if e["type"] in ("router_remove", "router_add", "router_listed", "canary")]


def slow_decode(fleet: PdFleet, knob: str) -> None:
    """pd-1's decode started by deployer through `knob` (a shell line ending in exec "$@")."""
    decode = fleet.inventory["hosts"]["gpu-b"]["services"]["decode"]
    decode["start"] = ["sh", "-c", knob, "canary-knob", *decode["start"]]
    fleet.write()


def asked_once_back(kinds: list[str], adds: int) -> bool:
    """Out, the direct canary, back in and seen listed, then the canary through the router."""
    return (kinds.count("canary:router") == 1 and kinds.index("canary:direct") < kinds.index("router_add")
            and kinds[-adds - 2:] == ["router_add"] * adds + ["router_listed", "canary:router"])


@pytest.fixture
def newest_fleet(tmp_path: Path) -> Iterator[PdFleet]:
    """The PD fleet whose router sends each request to its newest prefill and decode."""
    fleet = make_fleet(tmp_path)
    router = fleet.stacks["gpu-a"]
    assert isinstance(router, RouterHost)
    router.router = [router.router[0], "-c", NEWEST, *router.router[3:]]  # python -m launch_router ARGS
    fleet.inventory["hosts"]["gpu-a"]["services"]["router"]["start"] = router.router
    fleet.write()
    with running(fleet):
        yield fleet


def test_a_rolling_apply_asks_the_canary_through_the_router_once_each_units_workers_are_listed_again(
        newest_fleet: PdFleet) -> None:
    fleet = newest_fleet
    with_canary(fleet, CANARY)
    with load_through(fleet, "the apply") as load:
        code, report, output = fleet.apply("pd-1,pd-2")
    assert code == 0, output
    assert load.report.failed == 0, f"{load.report.failed} of {load.report.sent} failed: {load.report.failures}"
    for unit, prefill in (("pd-1", "gpu-a"), ("pd-2", "gpu-c")):
        kinds = order(fleet, report["hosts"][prefill]["run_id"])
        assert asked_once_back(kinds, adds=2), (unit, kinds)
        [through] = [e for e in events(fleet, report["hosts"][prefill]["run_id"])
                     if e["type"] == "canary" and "router" in e]
        assert through["ok"] is True and through["text"].split() == ["tok0", "tok1", "tok2", "tok3"], through
    assert listed_healthy(fleet) == every_worker(fleet)


def test_a_canary_through_the_router_that_fails_takes_the_unit_out_again_rolls_it_back_and_puts_the_old_workers_back(
        newest_fleet: PdFleet) -> None:
    """...and the automatic rollback asks its own canary through the router only once the old workers are listed
    again (while out, the router would send it to pd-2)."""
    fleet = newest_fleet
    slow_decode(fleet, SLOW_ON_THE_NOTE)
    with_canary(fleet, {"canary": {**CANARY["canary"], "latency_s": 2}}, on_failure="rollback")
    before = fleet.pids()
    with load_through(fleet, "the apply") as load:
        code, report, output = fleet.apply("pd-1,pd-2")
    assert code == 5, output
    assert load.report.failed == 0, f"{load.report.failed} of {load.report.sent} failed: {load.report.failures}"
    error = report["error"]
    assert f"canary POST http://127.0.0.1:{fleet.router_port}/generate through router pd-router (on gpu-a): " \
           "answered in" in error and "over the 2s bound" in error, error
    assert "Rolled back every host of the unit (gpu-a, gpu-b) and restarted it again" in error, error
    assert "The old workers are back in router pd-router" in error, error
    assert [report["hosts"][h]["status"] for h in ("gpu-c", "gpu-d")] == ["untouched", "untouched"]
    run_id = report["hosts"]["gpu-a"]["run_id"]
    kinds = [k for k in order(fleet, run_id) if k != "router_listed"]
    # out, restarted, back in, the canary through the router fails; out again, rolled back, back in, asked again
    assert kinds == ["router_remove"] * 2 + ["canary:direct"] + ["router_add"] * 2 + ["canary:router"] + [
        "router_remove"] * 2 + ["rollback:canary:direct"] + ["router_add"] * 2 + ["rollback:canary:router"], kinds
    assert order(fleet, run_id)[-2:] == ["router_listed", "rollback:canary:router"]  # once listed again
    [again] = [e for e in events(fleet, run_id) if e["type"] == "canary" and e["step"].startswith("rollback:")
               and "router" in e]
    assert again["ok"] is True and again["text"].split() == ["tok0", "tok1", "tok2", "tok3"], again  # the old pair
    after = fleet.pids()
    assert after["gpu-b"]["decode"] != before["gpu-b"]["decode"]  # restarted onto the old code
    assert listed_healthy(fleet) == every_worker(fleet)  # the old workers listed again


def test_a_rollbacks_canary_through_the_router_that_fails_leaves_the_old_workers_in_it_and_says_a_person_must_look(
        newest_fleet: PdFleet) -> None:
    fleet = newest_fleet
    slow_decode(fleet, SLOW_ALWAYS)  # the old build too, once deployer restarts it
    with_canary(fleet, {"canary": {**CANARY["canary"], "latency_s": 2}}, on_failure="rollback")
    with load_through(fleet, "the apply") as load:
        code, report, output = fleet.apply("pd-1,pd-2")
    assert code == 6, output  # RollbackFailed
    assert load.report.failed == 0, f"{load.report.failed} of {load.report.sent} failed: {load.report.failures}"
    error = report["error"]
    assert "The old workers are back in router pd-router, but the rollback's check through it failed: " \
           "note.yaml:11:3: step 'canary (through the router)' failed" in error, error
    assert error.count("over the 2s bound") == 2, error  # the apply's canary, then the rollback's
    assert "The unit stays in router pd-router on the old build: a person must look" in error, error
    kinds = order(fleet, report["hosts"]["gpu-a"]["run_id"])
    assert kinds[-4:] == ["router_add"] * 2 + ["router_listed", "rollback:canary:router"], kinds
    assert listed_healthy(fleet) == every_worker(fleet)  # left in the router


def test_a_plain_host_behind_the_router_asks_its_canary_through_the_router_once_its_worker_is_listed_again(
        tmp_path: Path) -> None:
    fleet = make_fleet(tmp_path)
    behind_router_alone(fleet)
    with running(fleet):
        with_canary(fleet, CANARY)
        with load_through(fleet, "the apply") as load:
            code, report, output = fleet.apply("gpu-c")
        assert code == 0, output
        assert load.report.failed == 0, f"{load.report.failed} of {load.report.sent} failed: {load.report.failures}"
        kinds = order(fleet, report["run_id"])  # one host: its run's report
        assert asked_once_back(kinds, adds=1), kinds
        assert listed_healthy(fleet) == every_worker(fleet)
