"""A start tells its own story, and its waits can be seen: what health answered and for how long, the new
process's pid and memory, each phase as it happens, each service's time to healthy, and budgets that fit.

The servers are the demo stack's real SGLang stand-in (`python -m sglang.launch_server`), whose `/health`
answers 503 for SGLANG_DEMO_STARTUP_S after it binds, as SGLang's does until its warm-up ends."""

from __future__ import annotations

import re
import shutil
import sys
from typing import Any

from fixtures_repo import Project
from fixtures_services import Stack, events, free_port

from deployer.demo.run import STACK


def demo_server(stack: Stack, name: str, startup_s: float, budget_s: float) -> dict[str, Any]:
    """The demo decode server as a service, its copy of the stack outside the source tree, warming up
    (health 503) for startup_s."""
    copy = stack.project.root / "stack"
    if not copy.exists():
        shutil.copytree(STACK, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    port = stack.ports[name]
    return {"start": [sys.executable, "-m", "sglang.launch_server", "--disaggregation-mode", "decode",
                      "--port", str(port), "--disaggregation-bootstrap-port", str(free_port())],
            "cwd": str(copy / "python"), "health": f"http://127.0.0.1:{port}/health",
            "env": {"SGLANG_DEMO_STARTUP_S": str(startup_s), "PYTHONDONTWRITEBYTECODE": "1"},
            "health_timeout_s": budget_s, "stop_grace_s": 2}


def restart_only(project: Project) -> None:
    project.playbook(steps=[{"co_restart": {}}])


def last_run_events(project: Project) -> list[dict[str, Any]]:
    return events(project)


# -- item 4: the failure says what health answered, and whether the process lives -------------------------

def test_a_server_whose_health_stays_503_past_its_budget_fails_with_the_answers_counted_and_its_pid_and_rss(
        stack: Stack) -> None:
    stack.configure(decode=demo_server(stack, "decode", startup_s=60, budget_s=3))
    restart_only(stack.project)
    result = stack.project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "did not answer 200 within 3s" in result.stderr
    told = re.search(r"/health: (no answer x(\d+), )?503 x(\d+) over (\d+) s; pid (\d+) alive, RSS (\d+) MiB",
                     result.stderr)
    assert told, result.stderr
    assert int(told.group(3)) >= 3 and int(told.group(4)) >= 3  # polled for the whole budget, 503 each time
    assert int(told.group(5)) == stack.pids()["decode"]
    assert int(told.group(6)) >= 5  # a python interpreter with an HTTP server loaded holds some memory
    polled = next(e for e in last_run_events(stack.project) if e.get("action") == "decode.up_health")
    assert sum(times for _, times in polled["outcomes"]) == polled["count"]
    assert ["503", int(told.group(3))] in polled["outcomes"]  # the message counts what the run log recorded


def test_a_server_that_exits_during_start_up_says_after_how_long_and_what_health_answered(stack: Stack) -> None:
    port = free_port()
    dies = {"start": [sys.executable, "-c", "import time; time.sleep(1.5); raise SystemExit('CUDA out of memory')"],
            "health": f"http://127.0.0.1:{port}/health", "health_timeout_s": 30}
    stack.configure(decode=dies)
    restart_only(stack.project)
    result = stack.project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stdout + result.stderr
    told = re.search(r"exited during start-up after (\d+\.\d)s; /health: no answer x(\d+) over \d+ s", result.stderr)
    assert told, result.stderr
    assert 1.0 <= float(told.group(1)) < 30
    assert "alive" not in result.stderr.split("exited during start-up")[1].splitlines()[0]
    assert "CUDA out of memory" in result.stderr  # the log's tail still follows
