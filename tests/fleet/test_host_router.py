"""Plain hosts behind a router: the demo stack's four hosts (two prefills, two decodes) in no unit, each naming the
demo router and its one worker. Restarting or applying to one of them takes it out of the router and puts it back as
a unit's restart does, while the other prefill or decode serves: a steady load through the router sees no failure.
So does the rollback of one host's run of a unit (its part of the unit out of the router)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures_repo import deployer
from polling import wait_for
from test_rolling_router import (
    PdFleet,
    every_worker,
    listed_healthy,
    load_through,
    make_fleet,
    refused_at_load,
    router_steps,
    running,
)

pytestmark = pytest.mark.long  # tests/conftest.py: scheduled first


def behind_router_alone(fleet: PdFleet) -> None:
    """No units: each host names the router itself, with its worker as the unit named it (same shape)."""
    for unit in fleet.inventory.pop("units").values():
        for worker in unit["workers"]:
            fleet.inventory["hosts"][worker["service"].partition(":")[0]].update(router="pd-router", workers=[worker])
    fleet.write()


@pytest.fixture
def hosts_fleet(tmp_path: Path) -> Iterator[PdFleet]:
    fleet = make_fleet(tmp_path)
    behind_router_alone(fleet)
    with running(fleet):
        yield fleet


def left_and_came_back(fleet: PdFleet, run_id: str, worker: str) -> None:
    """The run log: the worker removed, the router seen listing without it, drained, added, seen listed again."""
    kinds = router_steps(fleet, run_id)
    assert kinds[:2] == ["router_remove", "router_listed"] and "worker_inflight" in kinds, kinds
    assert kinds[-2:] == ["router_add", "router_listed"], kinds
    events = [json.loads(line) for line in (fleet.runs / run_id / "events.jsonl").read_text()
              .splitlines()]
    removed = next(e for e in events if e["type"] == "router_remove")
    seen_without = next(e for e in events if e["type"] == "router_listed")
    assert removed["worker"] == worker and worker not in seen_without["workers"], (removed, seen_without)


def test_a_plain_host_behind_the_router_leaves_it_around_its_restart_and_its_apply_and_no_request_fails(
        hosts_fleet: PdFleet) -> None:
    before = hosts_fleet.pids()
    with load_through(hosts_fleet, "the restart") as load:
        restarted = deployer("restart", "--host", "gpu-b", "--json", cwd=hosts_fleet.root)
        applied = deployer("apply", "note.yaml", "--host", "gpu-d", "--json", cwd=hosts_fleet.root)
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert load.report.failed == 0, f"{load.report.failed} of {load.report.sent} failed: {load.report.failures}"
    after = hosts_fleet.pids()
    assert after["gpu-b"]["decode"] != before["gpu-b"]["decode"] and after["gpu-d"]["decode"] != before["gpu-d"][
        "decode"]
    for result, host in ((restarted, "gpu-b"), (applied, "gpu-d")):
        left_and_came_back(hosts_fleet, json.loads(result.stdout)["run_id"], hosts_fleet.worker_url(host, "decode"))
    assert listed_healthy(hosts_fleet) == every_worker(hosts_fleet)


def test_a_rolling_apply_over_plain_hosts_behind_one_router_takes_one_out_at_a_time_and_no_request_fails(
        hosts_fleet: PdFleet) -> None:
    with load_through(hosts_fleet, "the apply") as load:
        code, report, output = hosts_fleet.apply("gpu-b,gpu-d")  # both decodes: one must serve at any time
    assert code == 0, output
    assert load.report.failed == 0, f"{load.report.failed} of {load.report.sent} failed: {load.report.failures}"
    assert report["batches"] == [["gpu-b"], ["gpu-d"]]
    for host in ("gpu-b", "gpu-d"):
        left_and_came_back(hosts_fleet, report["hosts"][host]["run_id"], hosts_fleet.worker_url(host, "decode"))
    wait_for(lambda: listed_healthy(hosts_fleet) == every_worker(hosts_fleet), "every worker listed again", 10)


def test_a_plain_host_naming_an_unknown_router_or_a_worker_outside_it_is_refused_with_file_line_and_field(
        tmp_path: Path) -> None:
    fleet = make_fleet(tmp_path)  # nothing started: the inventory is refused before any host connects
    behind_router_alone(fleet)
    hosts: dict[str, Any] = fleet.inventory["hosts"]
    hosts["gpu-b"]["router"] = "nope"
    hosts["gpu-d"]["workers"][0]["service"] = "gpu-b:decode"
    refused_at_load(fleet, "gpu-b,gpu-d",
                    r"hosts\.yaml:\d+:13: hosts\.gpu-b\.router: 'nope' is not in routers: \(pd-router\)",
                    r"hosts\.yaml:\d+:\d+: hosts\.gpu-d\.workers\.0\.service: 'gpu-b:decode' is not a service of "
                    r"host 'gpu-d' \(gpu-d:decode\)")


def events_of(fleet: PdFleet, run_id: str) -> list[dict[str, Any]]:
    path = fleet.runs / run_id / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_group_restart_takes_its_routed_hosts_out_of_the_router_one_after_the_other_and_no_request_fails(
        hosts_fleet: PdFleet) -> None:
    hosts_fleet.inventory["groups"] = {"decodes": ["gpu-d", "gpu-b"]}
    hosts_fleet.write()
    before = hosts_fleet.pids()
    with load_through(hosts_fleet, "the restart") as load:
        restarted = deployer("restart", "--host", "decodes", "--json", cwd=hosts_fleet.root)
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert load.report.failed == 0, f"{load.report.failed} of {load.report.sent} failed: {load.report.failures}"
    runs = {host: run["run_id"] for host, run in json.loads(restarted.stdout)["hosts"].items()}
    assert list(runs) == ["gpu-b", "gpu-d"]  # in turn, sorted
    after = hosts_fleet.pids()
    for host, other in (("gpu-b", "gpu-d"), ("gpu-d", "gpu-b")):
        assert after[host]["decode"] != before[host]["decode"], host
        left_and_came_back(hosts_fleet, runs[host], hosts_fleet.worker_url(host, "decode"))
        # While this host was out of the router, the other decode was listed: one out at a time.
        seen_without = next(e for e in events_of(hosts_fleet, runs[host]) if e["type"] == "router_listed")
        assert hosts_fleet.worker_url(other, "decode") in seen_without["workers"], (host, seen_without)
    assert listed_healthy(hosts_fleet) == every_worker(hosts_fleet)


def test_the_plain_output_names_a_plain_host_behind_the_router_as_a_host_not_a_unit(hosts_fleet: PdFleet) -> None:
    result = deployer("restart", "--host", "gpu-d", cwd=hosts_fleet.root)  # not a terminal: plain lines
    assert result.returncode == 0, result.stdout + result.stderr
    decode = hosts_fleet.worker_url("gpu-d", "decode")
    lines = result.stdout.splitlines()
    for expected in (f"[router pd-router] host gpu-d: removed worker {decode} (gpu-d:decode)",
                     f"[router pd-router] host gpu-d: added worker {decode} (gpu-d:decode)"):
        assert expected in lines, (expected, result.stdout)
    assert not [line for line in lines if "unit gpu-d" in line], result.stdout


DOWN = "router pd-router: no other unit serves behind it while gpu-d restarts"  # gpu-d alone behind it


def alone_behind_the_router(fleet: PdFleet) -> None:
    """gpu-d is the only host the inventory puts behind pd-router."""
    for host in ("gpu-a", "gpu-b", "gpu-c"):
        for field in ("router", "workers"):
            fleet.inventory["hosts"][host].pop(field)
    fleet.write()


def test_a_one_host_apply_of_a_host_alone_behind_its_router_is_downtime_planned_and_needs_allow_downtime(
        hosts_fleet: PdFleet) -> None:
    alone_behind_the_router(hosts_fleet)
    down = DOWN
    planned = deployer("plan", "note.yaml", "--host", "gpu-d", "--json", cwd=hosts_fleet.root)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert json.loads(planned.stdout)["downtime"] == [{"router": "pd-router", "units": ["gpu-d"], "expected_s": None}]
    before = hosts_fleet.pids()
    refused = deployer("apply", "note.yaml", "--host", "gpu-d", cwd=hosts_fleet.root)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"{down}: that is downtime; pass --allow-downtime to accept it" in refused.stdout + refused.stderr
    assert hosts_fleet.pids() == before
    applied = deployer("apply", "note.yaml", "--host", "gpu-d", "--allow-downtime", "--json", cwd=hosts_fleet.root)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert hosts_fleet.pids()["gpu-d"]["decode"] != before["gpu-d"]["decode"]
    left_and_came_back(hosts_fleet, json.loads(applied.stdout)["run_id"], hosts_fleet.worker_url("gpu-d", "decode"))
    shown = deployer("plan", "note.yaml", "--host", "gpu-d", cwd=hosts_fleet.root)  # now from the apply's time
    assert re.search(rf"^{re.escape(down)}: downtime, about \d+(\.\d+)?s \(apply needs --allow-downtime\)$",
                     shown.stdout, re.MULTILINE), shown.stdout


def test_the_rollback_of_a_plain_host_behind_the_router_takes_it_out_around_its_restart_and_no_request_fails(
        hosts_fleet: PdFleet) -> None:
    applied = deployer("apply", "note.yaml", "--host", "gpu-d", "--json", cwd=hosts_fleet.root)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    run_id = json.loads(applied.stdout)["run_id"]
    before = hosts_fleet.pids()
    with load_through(hosts_fleet, "the rollback") as load:
        rolled = deployer("rollback", run_id, "--json", cwd=hosts_fleet.root)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert load.report.failed == 0, f"{load.report.failed} of {load.report.sent} failed: {load.report.failures}"
    assert hosts_fleet.pids()["gpu-d"]["decode"] != before["gpu-d"]["decode"]
    rollback = json.loads(rolled.stdout)
    assert rollback["status"] == "successful" and rollback["git"]["after"], rollback
    left_and_came_back(hosts_fleet, rollback["run_id"], hosts_fleet.worker_url("gpu-d", "decode"))
    assert [e["by"] for e in events_of(hosts_fleet, run_id) if e["type"] == "rolled_back_by"] == [rollback["run_id"]]
    assert listed_healthy(hosts_fleet) == every_worker(hosts_fleet)


def test_the_rollback_of_one_host_s_run_of_a_unit_takes_that_host_s_workers_out_around_its_restart(
        tmp_path: Path) -> None:
    with running(make_fleet(tmp_path)) as fleet:  # the units as test_rolling_router has them
        code, report, output = fleet.apply("pd-2")
        assert code == 0, output
        before = fleet.pids()
        with load_through(fleet, "the rollback") as load:
            rolled = deployer("rollback", report["hosts"]["gpu-d"]["run_id"], "--json", cwd=fleet.root)
        assert rolled.returncode == 0, rolled.stdout + rolled.stderr
        assert load.report.failed == 0, f"{load.report.failed} of {load.report.sent} failed: {load.report.failures}"
        after = fleet.pids()
        assert after["gpu-d"]["decode"] != before["gpu-d"]["decode"] and after["gpu-c"] == before["gpu-c"]
        left_and_came_back(fleet, json.loads(rolled.stdout)["run_id"], fleet.worker_url("gpu-d", "decode"))
        assert listed_healthy(fleet) == every_worker(fleet)


def test_the_rollback_of_a_run_of_a_host_alone_behind_its_router_is_downtime_planned_and_needs_allow_downtime(
        hosts_fleet: PdFleet) -> None:
    alone_behind_the_router(hosts_fleet)
    applied = deployer("apply", "note.yaml", "--host", "gpu-d", "--allow-downtime", "--json", cwd=hosts_fleet.root)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    run_id = json.loads(applied.stdout)["run_id"]
    shown = deployer("plan", "--rollback", run_id, cwd=hosts_fleet.root)  # the apply's time to healthy
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert re.search(rf"^{re.escape(DOWN)}: downtime, about \d+(\.\d+)?s \(rollback needs --allow-downtime\)$",
                     shown.stdout, re.MULTILINE), shown.stdout
    before = hosts_fleet.pids()
    refused = deployer("rollback", run_id, cwd=hosts_fleet.root)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"{DOWN}: that is downtime; pass --allow-downtime to accept it" in refused.stdout + refused.stderr
    assert hosts_fleet.pids() == before
    rolled = deployer("rollback", run_id, "--allow-downtime", "--json", cwd=hosts_fleet.root)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert hosts_fleet.pids()["gpu-d"]["decode"] != before["gpu-d"]["decode"]
    left_and_came_back(hosts_fleet, json.loads(rolled.stdout)["run_id"], hosts_fleet.worker_url("gpu-d", "decode"))


def test_a_fleet_apply_dry_run_says_the_downtime_as_plan_does(hosts_fleet: PdFleet) -> None:
    alone_behind_the_router(hosts_fleet)
    before = hosts_fleet.pids()
    planned = deployer("plan", "note.yaml", "--host", "gpu-c,gpu-d", "--json", cwd=hosts_fleet.root)
    dry = deployer("apply", "note.yaml", "--host", "gpu-c,gpu-d", "--dry-run", "--json", cwd=hosts_fleet.root)
    for result in (planned, dry):
        assert result.returncode == 0, result.stdout + result.stderr
        assert json.loads(result.stdout)["downtime"] == [
            {"router": "pd-router", "units": ["gpu-d"], "expected_s": None}], result.stdout
    shown = deployer("apply", "note.yaml", "--host", "gpu-c,gpu-d", "--dry-run", cwd=hosts_fleet.root)
    assert f"{DOWN}: downtime, for an unknown time (apply needs --allow-downtime)" in shown.stdout.splitlines(), \
        shown.stdout
    assert hosts_fleet.pids() == before
