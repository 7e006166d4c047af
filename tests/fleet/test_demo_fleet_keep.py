"""`deployer demo --fleet --keep`: every host left running until `demo --stop` stops them, and each unit's fix
judged on its latency (split from test_demo_fleet.py, whose helpers it reuses, so that the suite's workers share the
fleet demo's long runs)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import pytest
from fixtures_repo import deployer
from fixtures_services import alive, wait_dead
from test_demo_fleet import UNITS, events, fleet_record, host_pids

from deployer.demo.judged import WINDOWS

pytestmark = pytest.mark.long  # tests/conftest.py: scheduled first


def test_demo_fleet_keep_leaves_every_host_running_until_demo_stop_stops_them(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    result = deployer("demo", "--fleet", "--keep", "--json", "--workdir", str(workdir), cwd=tmp_path)
    pids = host_pids(workdir)
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        summary = json.loads(result.stdout)
        assert summary["status"] == "successful" and summary["units"] == UNITS
        assert all(g["before"] >= 1 and g["after"] == 0 for g in summary["gauges"].values()), summary["gauges"]
        load = summary["load"]
        assert load["sent"] > 0 and load["failed"] == 0 and load["ok"] == load["sent"], load
        assert 0 < load["p50_ms"] <= load["p99_ms"], load
        proof = summary["proof"]
        assert proof["error"] is None and proof["storm"]["sent"] == 200, proof
        assert all(u["peak"] >= 1 and u["after"] == 0 for u in proof["units"].values()) and list(proof["units"]) == [
            "pd-1", "pd-2"], proof
        # Each unit's fix judged on its latency under the demo's load (issue 37 item 5; the --regression variant:
        # tests/demo/test_demo_analysis.py): p99 TTFT before and after the restart, aborted requests.
        passed = {"outcome": "pass", "checks": {"p99 TTFT": "pass", "aborted requests": "pass"}}
        assert summary["analyses"] == {unit: passed for unit in UNITS}, summary["analyses"]
        fleet = fleet_record(workdir)
        for unit, (prefill, _) in UNITS.items():
            analysis = next(e for e in events(workdir, fleet["hosts"][prefill]["run_id"]) if e["type"] == "analysis")
            ttft = analysis["verdicts"][0]
            assert analysis["mode"] == "before-after" and ttft["check"] == "p99 TTFT", analysis
            assert len(ttft["baseline_windows"]) == len(ttft["canary_windows"]) == WINDOWS["windows"], ttft
            assert ttft["method"] == "mann-whitney" and ttft["outcome"] == "pass", (unit, ttft)
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
