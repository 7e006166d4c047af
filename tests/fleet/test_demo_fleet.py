"""`deployer demo --fleet`: two PD units over four local hosts, one fleet run, every unit drained, nothing left."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from fixtures_repo import deployer
from fixtures_services import alive, wait_dead

GAUGE = "sglang:num_prefill_inflight_queue_reqs"
HOSTS = ("gpu-a", "gpu-b", "gpu-c", "gpu-d")
UNITS = {"pd-1": ["gpu-a", "gpu-b"], "pd-2": ["gpu-c", "gpu-d"]}  # prefill host (the unit's metrics), decode host


def host_pids(workdir: Path) -> dict[str, dict[str, int]]:
    """Every pid file of every host's stack: the demo's first processes and the ones the restart made."""
    return {host: {p.stem: int(p.read_text()) for p in (workdir / host / "repo/.git/deployer").glob("*.pid")}
            for host in HOSTS}


def samples(workdir: Path, run_id: str, step: str) -> list[float]:
    events = [json.loads(line) for line in (workdir / "runs" / run_id / "events.jsonl").read_text().splitlines()]
    return [e["value"] for e in events if e.get("type") == "sample" and e.get("step") == step
            and e.get("metric") == GAUGE]


def test_demo_fleet_deploys_two_pd_units_over_four_hosts_drains_each_and_stops_everything(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    result = deployer("demo", "--fleet", "--workdir", str(workdir), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    fleet_dir = next(p for p in (workdir / "runs").iterdir() if (p / "fleet.json").is_file())
    fleet: dict[str, Any] = json.loads((fleet_dir / "fleet.json").read_text())
    assert fleet["status"] == "successful" and fleet["units"] == UNITS and sorted(fleet["hosts"]) == list(HOSTS)
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
    assert f"deployer rollback {fleet['fleet_id']}" in report
    assert "every process the demo started has been stopped" in report
    pids = host_pids(workdir)
    assert {h: sorted(p) for h, p in pids.items()} == {
        "gpu-a": ["prefill", "router"], "gpu-b": ["decode"], "gpu-c": ["prefill", "router"], "gpu-d": ["decode"]}
    assert all(wait_dead(pid) for found in pids.values() for pid in found.values())


def test_demo_fleet_keep_leaves_every_host_running_until_demo_stop_stops_them(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    result = deployer("demo", "--fleet", "--keep", "--json", "--workdir", str(workdir), cwd=tmp_path)
    pids = host_pids(workdir)
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        summary = json.loads(result.stdout)
        assert summary["status"] == "successful" and summary["units"] == UNITS
        assert all(g["before"] >= 1 and g["after"] == 0 for g in summary["gauges"].values()), summary["gauges"]
        assert all(alive(pid) for found in pids.values() for pid in found.values())
        stopped = deployer("demo", "--stop", "--workdir", str(workdir), "--json", cwd=tmp_path)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert {Path(w).name: p for w, p in json.loads(stopped.stdout)["stopped"].items()} == pids
        assert all(wait_dead(pid) for found in pids.values() for pid in found.values())
    finally:
        for found in pids.values():
            for pid in found.values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
