"""`deployer demo --fleet` judges each unit's new build on its latency under the demo's load (issue 37 item 5): the
fix passes its analysis (p99 TTFT before and after the restart, aborted requests: asserted in
tests/fleet/test_demo_fleet.py's kept demo, one demo run fewer), and with `--regression` the fix ships a slower
build, which the first unit's analysis fails, naming the metric and its change, and on_failure rolls that unit back
while the second is never touched. Real processes, the real router, the real run logs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from fixtures_repo import deployer

pytestmark = pytest.mark.long  # tests/conftest.py: scheduled first

UNITS = {"pd-1": ("gpu-a", "gpu-b"), "pd-2": ("gpu-c", "gpu-d")}  # prefill host (the unit's metrics), decode host


def fleet_record(workdir: Path) -> dict[str, Any]:
    [record] = (workdir / "runs").glob("*/fleet.json")
    found: dict[str, Any] = json.loads(record.read_text())
    return found


def analysis_of(workdir: Path, run_id: str) -> dict[str, Any]:
    """The one analysis event in a run's log."""
    lines = (workdir / "runs" / run_id / "events.jsonl").read_text().splitlines()
    [event] = [e for e in map(json.loads, lines) if e.get("type") == "analysis"]
    return event


def judged(workdir: Path, hosts: dict[str, Any]) -> str:
    """What each unit's analysis found (the outcome, each check's why and windows), for a failure's message."""
    found = []
    for unit, (prefill, _) in UNITS.items():
        run_id = hosts[prefill].get("run_id")
        events = (workdir / "runs" / str(run_id) / "events.jsonl")
        for event in map(json.loads, events.read_text().splitlines() if run_id and events.is_file() else []):
            if event.get("type") == "analysis":
                found += [f"{unit}: {event['outcome']}"] + [
                    f"  {v['check']}: {v['outcome']}: {v['why']}; windows (count, value) before "
                    f"{[(w['count'], w['value']) for w in v['baseline_windows']]}, after "
                    f"{[(w['count'], w['value']) for w in v['canary_windows']]}" for v in event["verdicts"]]
    return "\n".join(found) or "no analysis in any unit's log"


def test_the_fleet_demo_with_a_regression_fails_its_p99_ttft_and_rolls_the_first_unit_back(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    result = deployer("demo", "--fleet", "--regression", "--workdir", str(workdir), cwd=tmp_path)
    said = result.stdout + result.stderr
    assert result.returncode == 5, said
    record = fleet_record(workdir)
    hosts = record["hosts"]
    states = {host: (run["status"], run["state"]) for host, run in hosts.items()}
    assert record["status"] == "failed" and [hosts[h]["state"] for h in UNITS["pd-1"]] == ["rolled_back"] * 2, (
        f"{states}\n{judged(workdir, hosts)}")
    assert [hosts[h]["status"] for h in UNITS["pd-2"]] == ["untouched"] * 2, states  # no further batch started
    event = analysis_of(workdir, hosts["gpu-a"]["run_id"])
    ttft = event["verdicts"][0]
    assert event["outcome"] == "fail" and ttft["outcome"] == "fail" and ttft["change"] > 0.10, ttft
    # The failure names the metric, both sides' p99 and the change against what is allowed.
    verdict = re.search(r"p99 TTFT \S+ -> \S+ \(\+(\d+\.\d)%, allowed \+10%\): fail \(Mann-Whitney U p=\S+, "
                        r"effect \+(\d\.\d\d) toward worse, 0.5 needed to fail\)", said)
    assert verdict and float(verdict[1]) > 10 and float(verdict[2]) >= 0.5, said
    assert "Rolled back every host of the unit (gpu-a, gpu-b)" in said, said
    for host in UNITS["pd-1"]:  # the reverted build is the one each repo holds
        build = workdir / host / "repo" / "python/sglang/srt/demo_build.py"
        assert "SLOWDOWN = 0.0" in build.read_text()
    # The summary draws the analysis: a bar per window, before, then after, with its verdict.
    report = result.stdout[result.stdout.index("demo report"):]
    assert re.search(r"analysis: fail \(one bar per window: before, then after\)\n +p99 TTFT +before ", report), report
