"""`deployer demo --fleet`: two PD units over four local hosts behind one router, rolled one unit at a time under a
client load that sees no failure, every unit drained, nothing left."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_repo import deployer
from fixtures_services import wait_dead
from ports import demo_ports

from deployer.demo.proof import prove
from deployer.demo.run import PLAYBOOK, DemoStack, start_stacks
from deployer.steps.cancel import CancelToken

pytestmark = pytest.mark.long  # tests/conftest.py: scheduled first

GAUGE = "sglang:num_prefill_inflight_queue_reqs"
HOSTS = ("gpu-a", "gpu-b", "gpu-c", "gpu-d")
UNITS = {"pd-1": ["gpu-a", "gpu-b"], "pd-2": ["gpu-c", "gpu-d"]}  # prefill host (the unit's metrics), decode host


def host_pids(workdir: Path) -> dict[str, dict[str, int]]:
    """Every pid file of every host's stack: the demo's first processes and the ones the restart made."""
    return {host: {p.stem: int(p.read_text()) for p in (workdir / host / "repo/.git/deployer").glob("*.pid")}
            for host in HOSTS}


def events(workdir: Path, run_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (workdir / "runs" / run_id / "events.jsonl").read_text().splitlines()]


def samples(workdir: Path, run_id: str, step: str) -> list[float]:
    return [e["value"] for e in events(workdir, run_id) if e.get("type") == "sample" and e.get("step") == step
            and e.get("metric") == GAUGE]


def fleet_record(workdir: Path) -> dict[str, Any]:
    [record] = (workdir / "runs").glob("*/fleet.json")
    found: dict[str, Any] = json.loads(record.read_text())
    return found


def router_changes(workdir: Path, fleet: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Every unit's router_remove/router_add events, in the order they happened: (time, unit, change)."""
    return sorted((e["time"], e["unit"], e["type"]) for unit, (first, _) in UNITS.items()
                  for e in events(workdir, fleet["hosts"][first]["run_id"])
                  if e.get("type") in ("router_remove", "router_add"))


def test_demo_fleet_deploys_two_pd_units_over_four_hosts_drains_each_and_stops_everything(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    result = deployer("demo", "--fleet", "--workdir", str(workdir), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    fleet_dir = next(p for p in (workdir / "runs").iterdir() if (p / "fleet.json").is_file())
    fleet: dict[str, Any] = json.loads((fleet_dir / "fleet.json").read_text())
    assert fleet["status"] == "successful" and fleet["units"] == UNITS and sorted(fleet["hosts"]) == list(HOSTS)
    assert fleet["batches"] == [["gpu-a", "gpu-b"], ["gpu-c", "gpu-d"]]  # rolling: one unit per batch
    # Out of the router, back in, then the next unit: never both out at once (each worker once per change).
    assert [(unit, change) for _, unit, change in router_changes(workdir, fleet)] == [
        ("pd-1", "router_remove")] * 2 + [("pd-1", "router_add")] * 2 + [("pd-2", "router_remove")] * 2 + [
        ("pd-2", "router_add")] * 2
    for host in HOSTS:
        run = fleet["hosts"][host]
        assert run["status"] == "successful", run
        trailer = subprocess.run(["git", "-C", str(workdir / host / "repo"), "log", "-1", "--format=%B"],
                                 capture_output=True, text=True, check=True).stdout
        assert f"Deployer-Run: {run['run_id']}" in trailer
    report = result.stdout[result.stdout.index("demo report"):]
    for unit, (prefill_host, decode_host) in UNITS.items():
        run_id = fleet["hosts"][prefill_host]["run_id"]
        before, after = samples(workdir, run_id, "baseline"), samples(workdir, run_id, "drain")
        assert before and before[-1] >= 1, f"{unit}: the bug never showed: {before}"
        assert after and after[-1] == 0, f"{unit}: did not drain: {after}"
        assert not samples(workdir, fleet["hosts"][decode_host]["run_id"], "drain")  # read once, on the metrics host
        line = next(line for line in report.splitlines() if line.strip().startswith(unit))
        assert f"{before[-1]:g} before the fix -> 0 after" in line, line
    for host in HOSTS:
        assert host in result.stdout  # the per-host table
    load = re.search(r"load +(\d+) requests through the router during the rollout: (\d+) ok, (\d+) failed", report)
    assert load and int(load[1]) > 0 and int(load[2]) == int(load[1]) and load[3] == "0", report
    # Every unit back in the router: the playbook's storm through it reached each unit, and each drained.
    proof = re.search(r"proof +after the rollout, the playbook's storm through the router: 200 sent, .*; in-flight "
                      r"queue during -> after: pd-1 (\d+) -> 0, pd-2 (\d+) -> 0$", report, re.M)
    assert proof and int(proof[1]) >= 1 and int(proof[2]) >= 1, report
    # Its stacks are stopped: a rollback would start them again and leave them running.
    assert "deployer rollback" not in report and "to try one, run the demo again with --keep" in report, report
    assert "every process the demo started has been stopped" in report
    pids = host_pids(workdir)
    assert {h: sorted(p) for h, p in pids.items()} == {
        "gpu-a": ["prefill", "router"], "gpu-b": ["decode"], "gpu-c": ["prefill"], "gpu-d": ["decode"]}  # one router
    assert all(wait_dead(pid) for found in pids.values() for pid in found.values())


def test_the_proof_through_the_router_fails_naming_the_unit_whose_gauge_stays_up_on_the_buggy_code(
        tmp_path: Path) -> None:
    stack = DemoStack(tmp_path / "host", demo_ports()[0])  # the buggy stack: prefill, decode and its router
    playbook = yaml.safe_load(PLAYBOOK.read_text())
    for step in playbook["steps"]:
        if isinstance(step, dict) and "drain" in step:
            step["drain"]["within_s"] = 1  # a short wait: on the buggy code nothing drains anyway
    (tmp_path / "playbook.yaml").write_text(yaml.safe_dump(playbook))
    stack.create()
    try:
        start_stacks([stack], CancelToken())
        # A storm whose every request timed out before the router handed it on (a loaded machine: 0.2 s each)
        # reached no server, and a gauge read that timed out reads nothing: at most two more storms, until one
        # reached the prefill and its gauge was read after it.
        for _ in range(3):
            proof = prove(stack.url("router", ""), {"pd-1": stack.url("prefill", "/metrics")},
                          tmp_path / "playbook.yaml", CancelToken())
            if (proof.units["pd-1"].peak or 0) >= 1 and proof.units["pd-1"].after is not None:
                break
    finally:
        stack.stop()
    stuck = proof.units["pd-1"].after
    assert proof.storm["sent"] == 200 and stuck is not None and stuck >= 1, proof
    assert proof.error == f"unit pd-1: {GAUGE} {stuck:g} after the storm through the router, not 0 within 1s", proof
