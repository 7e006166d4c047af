"""The analysis step applied by deployer itself (local and over the real sshd) to a real demo SGLang server it
restarts: the server exports SGLang's latency histograms as real Prometheus text, and loads the code it serves at
start, which decides its latency. The shipped fix (pkg.a.answer() == 42) makes the server slower where the test
says so (SGLANG_DEMO_SLOWDOWN), the original build never is. The test sends bounded load the whole time.

- a fix that slows the server fails its analysis against the same server before the restart (analysis_baseline's
  reads): the verdict is in the run log, and on_failure: rollback gives the original build back;
- a fix that leaves the latency alone passes against an unslowed sibling read at the same instants;
- no traffic is too few observations: inconclusive, exit 7, held (the commit kept, though on_failure says
  rollback), never a pass."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures_repo import ORIGINAL_A, Project
from polling import within
from ports import free_ports

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "deployer" / "demo" / "stack"
TTFT = "sglang:time_to_first_token_seconds"

# The demo decode server, its slowdown decided by the code it loaded at start (a regression the fix's bytes bring).
LAUNCHER = """
import os, sys
repo, stack, port, slowdown = sys.argv[1:5]
sys.path.insert(0, repo)
from pkg.a import answer
env = {**os.environ, "PYTHONPATH": stack + "/python", "PYTHONDONTWRITEBYTECODE": "1",
       "SGLANG_DEMO_STARTUP_S": "0.1", "SGLANG_DEMO_TTFT_S": "0.1", "SGLANG_DEMO_TOKEN_S": "0.002",
       "SGLANG_DEMO_SLOWDOWN": slowdown if answer() == 42 else "0"}
os.execve(sys.executable, [sys.executable, "-m", "sglang.launch_server", "--disaggregation-mode", "decode",
                           "--port", port, "--enable-metrics"], env)
"""
CHECKS = [{"kind": "histogram", "name": "p99 TTFT", "metric": TTFT, "min_samples": 30},
          {"kind": "critical", "name": "aborted requests", "metric": "sglang:num_aborted_requests_total"}]
# 4 s a side: enough requests that a CPU-starved moment (a busy CI machine) in one window cannot carry the p99
WINDOWS = {"interval_s": 1.0, "windows": 4}




class Load:
    """Streaming generations to the given ports from four threads a port until stopped, at most `most` in all;
    a request refused by a restart is counted, not raised."""

    def __init__(self, ports: list[int], most: int = 4000) -> None:
        self.most, self.sent, self.answered = most, 0, 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.worker, args=(port,), daemon=True) for port in ports * 4]
        for thread in self.threads:
            thread.start()

    def worker(self, port: int) -> None:
        while not self.stop.is_set() and self.sent < self.most:
            self.sent += 1
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                conn.request("POST", "/generate", body=json.dumps(
                    {"text": "hello", "stream": True, "sampling_params": {"max_new_tokens": 2}}),
                    headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                self.answered += response.status == 200
            except (OSError, http.client.HTTPException):
                self.stop.wait(0.05)  # restarting: not answering for a moment
            finally:
                conn.close()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(15)


@pytest.fixture
def project(target: Project) -> Iterator[Project]:
    """The target, its services killed at the end (deployer's pid files)."""
    yield target
    for pid in (target.repo / ".git" / "deployer").glob("*.pid"):
        with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
            os.killpg(int(pid.read_text()), signal.SIGKILL)


def launch(project: Project, port: int, slowdown: float) -> list[str]:
    """The argv of the demo server on port, on the code the target repo holds when it starts."""
    launcher = project.write("launch_server.py", LAUNCHER)
    return [sys.executable, str(launcher), str(project.repo), str(STACK), str(port), str(slowdown)]


def serving(project: Project, slowdown: float) -> int:
    """The decode service in the inventory, its metrics the host's, started by deployer on the original build."""
    (port,) = free_ports(1)
    project.write_inventory(services={"decode": {
        "start": launch(project, port, slowdown), "health": f"http://127.0.0.1:{port}/health",
        "health_timeout_s": 30, "stop_grace_s": 5}}, metrics=f"http://127.0.0.1:{port}/metrics")
    project.playbook(steps=[{"co_restart": {}}])  # the fix's files not shipped: the original build starts
    started = project.deployer("apply", "fix.yaml", "--host", "box")
    assert started.returncode == 0, started.stdout + started.stderr
    return port


def fix(*steps: Any) -> list[Any]:
    return ["upload", {"commit": {"message": "pkg: answer is 42"}}, {"co_restart": {}}, *steps]


def analysis(project: Project, step: str = "analysis") -> dict[str, Any]:
    [event] = [e for e in project.events() if e["type"] == "analysis" and e["step"] == step]
    return event


def test_a_fix_that_slows_the_server_fails_its_analysis_against_before_the_restart_and_is_rolled_back(
        project: Project) -> None:
    port = serving(project, slowdown=2.0)  # 3x: a slower baseline window under load (p99 0.38 -> 0.57) hid 2x once
    load = Load([port])
    try:
        project.playbook(on_failure="rollback", steps=[{"analysis_baseline": WINDOWS}, *fix(
            {"analysis": {**WINDOWS, "checks": CHECKS, "baseline": "before", "initial_delay_s": 0.3}})])
        result = project.deployer("apply", "fix.yaml", "--host", "box")
    finally:
        load.close()
    assert result.returncode == 5, result.stdout + result.stderr
    judged = analysis(project)
    assert (judged["mode"], judged["outcome"]) == ("before-after", "fail"), judged["why"]
    ttft = judged["verdicts"][0]
    assert (ttft["check"], ttft["outcome"], ttft["method"]) == ("p99 TTFT", "fail", "mann-whitney"), ttft["why"]
    assert ttft["change"] > 0.10 and len(ttft["baseline_windows"]) == len(ttft["canary_windows"]) == 4
    assert "p99 TTFT" in result.stderr and "fail (Mann-Whitney U p=" in result.stderr
    # the summary draws each side's windows, the p99 of each alone: before, then after
    lines = result.stdout.splitlines()
    at = lines.index("  analysis: fail (one bar per window: before, then after)")
    before, after = (line.split() for line in lines[at + 1:at + 3])
    assert before[:3] == ["p99", "TTFT", "before"] and len(before[3]) == 4 and len(before[4:]) == 4, lines
    assert after[0] == "after" and len(after[1]) == 4 and after[-1] == "fail", lines
    assert project.file("pkg/a.py") == ORIGINAL_A  # rolled back
    # the reverted build is the one its reads before the restart were of: not judged against itself again
    [end] = [e for e in project.events() if e["type"] == "run_end"]
    assert end["facts"]["rollback_checks"]["analysis"].startswith("not run: its baseline is the reverted build"), end


def test_a_fix_that_leaves_latency_alone_passes_against_an_unslowed_sibling_read_at_the_same_instants(
        project: Project) -> None:
    port = serving(project, slowdown=0.0)
    (sibling_port,) = free_ports(1)
    # Its own session: the demo server forks its scheduler, which a kill of the server alone leaves running.
    sibling = subprocess.Popen(launch(project, sibling_port, 0.0), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert within(lambda: answers(sibling_port), 30), "the sibling never answered"
        load = Load([port, sibling_port])
        try:
            project.playbook(on_failure="rollback", steps=fix({"analysis": {
                **WINDOWS, "checks": CHECKS, "initial_delay_s": 0.3,
                "baseline": {"metrics": f"http://127.0.0.1:{sibling_port}/metrics"}}}))
            result = project.deployer("apply", "fix.yaml", "--host", "box")
        finally:
            load.close()
    finally:
        os.killpg(sibling.pid, signal.SIGKILL)
        sibling.wait()
    assert result.returncode == 0, result.stdout + result.stderr
    judged = analysis(project)
    assert (judged["mode"], judged["outcome"]) == ("canary-baseline", "pass"), judged["why"]
    assert [v["outcome"] for v in judged["verdicts"]] == ["pass", "pass"]
    assert project.file("pkg/a.py") != ORIGINAL_A  # the fix stands


def test_an_analysis_without_traffic_is_inconclusive_exit_7_and_held_not_rolled_back(project: Project) -> None:
    serving(project, slowdown=0.0)
    project.playbook(on_failure="rollback", steps=[{"analysis_baseline": WINDOWS}, *fix(
        {"analysis": {**WINDOWS, "checks": CHECKS}})])
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 7, result.stdout + result.stderr
    judged = analysis(project)
    assert judged["outcome"] == "inconclusive" and "too few observations" in judged["verdicts"][0]["why"]
    assert "inconclusive (held, never passed)" in result.stderr
    assert project.file("pkg/a.py") != ORIGINAL_A  # held: the commit kept for a person to decide
    assert "stays on the target (held for a person to decide" in result.stderr
    assert f"To undo it: deployer rollback {project.newest_run()}" in result.stderr


def answers(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()
