"""co_restart, baseline and drain against real processes and real HTTP scrapes, over every transport.

The services here are `python -m http.server` processes serving a directory the test controls:
`/health` is a file, and `/metrics` is a Prometheus text file the test rewrites to make a
gauge drain (or not). The scrape, the parse and the restarts are all real.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures_repo import Project, git, tree_snapshot

GAUGE = "sglang:num_prefill_inflight_queue_reqs"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def metrics_text(value: float, name: str = GAUGE) -> str:
    return (f"# HELP {name} inflight\n# TYPE {name} gauge\n"
            f'{name}{{engine_type="prefill",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"}} {value}\n'
            f'{name}{{engine_type="prefill",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="1"}} 0.0\n')


class Stack:
    """Two http.server services (prefill, decode) described in the project's inventory."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self.www = project.root / "www"
        self.www.mkdir()
        (self.www / "health").write_text("ok\n")
        self.set_gauge(3.0)
        self.ports = {"prefill": free_port(), "decode": free_port()}

    def set_gauge(self, value: float) -> None:
        tmp = self.www / "metrics.tmp"
        tmp.write_text(metrics_text(value))
        os.replace(tmp, self.www / "metrics")

    def service(self, name: str, **extra: Any) -> dict[str, Any]:
        port = self.ports[name]
        return {"start": [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                          "--directory", str(self.www)],
                "health": f"http://127.0.0.1:{port}/health", "health_timeout_s": 20, "stop_grace_s": 5, **extra}

    def configure(self, **services: dict[str, Any]) -> None:
        chosen = services or {"prefill": self.service("prefill"), "decode": self.service("decode")}
        self.project.write_inventory(services=chosen,
                                     metrics=f"http://127.0.0.1:{self.ports['prefill']}/metrics")

    def pids(self) -> dict[str, int]:
        state = self.project.repo / ".git" / "deployer"
        return {p.stem: int(p.read_text()) for p in state.glob("*.pid")}

    def kill_all(self) -> None:
        for pid in self.pids().values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def stack(target: Project) -> Iterator[Stack]:
    stack = Stack(target)
    stack.configure()
    yield stack
    stack.kill_all()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def wait_dead(pid: int, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def events(project: Project) -> list[dict[str, Any]]:
    run = sorted(project.runs.iterdir())[-1]
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def restart_only(project: Project, **extra: Any) -> None:
    project.playbook(steps=[{"co_restart": extra}])


def test_co_restart_changes_every_pid_and_restarts_in_order(stack: Stack) -> None:
    project = stack.project
    restart_only(project)
    first = project.deployer("apply", "fix.yaml", "--host", "box")
    assert first.returncode == 0, first.stderr
    old = stack.pids()
    second = project.deployer("apply", "fix.yaml", "--host", "box")
    assert second.returncode == 0, second.stderr
    new = stack.pids()
    assert set(new) == {"prefill", "decode"}
    assert all(new[name] != old[name] for name in new)
    assert all(wait_dead(pid) for pid in old.values())
    order = [(e["type"], e["service"]) for e in events(project) if e["type"] in ("service_stopped", "service_started")]
    assert order == [("service_stopped", "decode"), ("service_stopped", "prefill"),
                     ("service_started", "prefill"), ("service_started", "decode")]
    restart = next(e for e in events(project) if e["type"] == "restart")
    assert restart["pids"]["prefill"] == {"old": old["prefill"], "new": new["prefill"]}


def test_a_service_that_never_becomes_healthy_fails_with_its_log_tail(stack: Stack) -> None:
    project = stack.project
    never = {"start": [sys.executable, "-c", "import time; print('boom: cannot load model', flush=True); "
                                             "time.sleep(60)"],
             "health": f"http://127.0.0.1:{free_port()}/health", "health_timeout_s": 2, "stop_grace_s": 1}
    stack.configure(prefill=never)
    restart_only(project)
    started = time.monotonic()
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1
    assert time.monotonic() - started < 30
    assert "service prefill" in result.stderr and "did not answer 200 within 2s" in result.stderr
    assert "boom: cannot load model" in result.stderr


def test_a_service_that_exits_at_start_fails_with_its_log_tail(stack: Stack) -> None:
    project = stack.project
    crash = {"start": [sys.executable, "-c", "import sys; sys.exit('fatal: CUDA out of memory')"],
             "health": f"http://127.0.0.1:{free_port()}/health", "health_timeout_s": 20}
    stack.configure(prefill=crash)
    restart_only(project)
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1
    assert "exited during start-up" in result.stderr and "CUDA out of memory" in result.stderr


def test_a_stop_that_ignores_term_is_killed_after_the_grace_period(stack: Stack) -> None:
    project = stack.project
    stubborn = stack.service("prefill", stop_grace_s=1.5)
    stubborn["start"] = ["sh", "-c", 'trap "" TERM; exec "$@"', "sh", *stubborn["start"]]
    stack.configure(prefill=stubborn)
    restart_only(project)
    assert project.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    old = stack.pids()["prefill"]
    started = time.monotonic()
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started >= 1.5
    assert wait_dead(old)
    stopped = next(e for e in events(project) if e["type"] == "service_stopped" and e["service"] == "prefill")
    assert stopped["how"] == "killed after 1.5s grace"


def drain_playbook(project: Project, **drain: Any) -> None:
    project.playbook(steps=[{"drain": {"metric": GAUGE, "to": 0, "interval_s": 0.2, "within_s": 10, **drain}}])


def test_drain_passes_when_the_gauge_drains_and_holds(stack: Stack) -> None:
    project = stack.project
    restart_only(project)
    assert project.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    drain_playbook(project)
    timer = threading.Timer(1.0, stack.set_gauge, args=(0.0,))
    timer.start()
    try:
        result = project.deployer("apply", "fix.yaml", "--host", "box")
    finally:
        timer.cancel()
    assert result.returncode == 0, result.stderr
    values = [e["value"] for e in events(project) if e["type"] == "sample"]
    assert values[0] == 3.0 and values[-3:] == [0.0, 0.0, 0.0]


def test_drain_on_a_missing_metric_is_inconclusive(stack: Stack) -> None:
    project = stack.project
    restart_only(project)
    assert project.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    drain_playbook(project, metric="sglang:no_such_gauge", within_s=1.5)
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1
    assert "inconclusive" in result.stderr and "sglang:no_such_gauge" in result.stderr


def test_drain_times_out_with_the_last_samples(stack: Stack) -> None:
    project = stack.project
    restart_only(project)
    assert project.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    drain_playbook(project, within_s=1.5, labels={"tp_rank": "0"})
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1
    assert "did not reach <= 0" in result.stderr and "last samples: 3, 3" in result.stderr


def test_drain_failure_after_commit_rolls_back_and_restarts(stack: Stack) -> None:
    project = stack.project
    restart_only(project)
    assert project.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    pre_tree = git(project.repo, "rev-parse", "HEAD^{tree}").strip()
    project.playbook(steps=["local_compile", "upload", "remote_compile", {"commit": {"message": "fix"}},
                            "co_restart",
                            {"drain": {"metric": GAUGE, "to": 0, "interval_s": 0.2, "within_s": 1.5}}],
                     on_failure="rollback")
    before_pids = stack.pids()
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 5, result.stderr
    assert "Rolled back" in result.stderr and "last samples" in result.stderr
    assert git(project.repo, "rev-parse", "HEAD^{tree}").strip() == pre_tree
    log = git(project.repo, "log", "--format=%B", "-1")
    run_id = sorted(project.runs.iterdir())[-1].name
    assert f"Deployer-Rollback-Of: {run_id}" in log
    after_pids = stack.pids()
    assert all(after_pids[n] != before_pids[n] and alive(after_pids[n]) for n in after_pids)
    assert git(project.repo, "status", "--porcelain") == ""


def test_plan_of_the_verification_steps_changes_nothing(stack: Stack) -> None:
    project = stack.project
    project.playbook(steps=["upload", "co_restart", {"storm": {"url": "http://127.0.0.1:1/generate"}},
                            {"drain": {"metric": GAUGE, "to": 0}}])
    snapshot = tree_snapshot(project.repo)
    plan = project.deployer("plan", "fix.yaml", "--host", "box")
    assert plan.returncode == 0, plan.stderr
    assert "stop decode" in plan.stdout and "start prefill" in plan.stdout
    assert "storm http://127.0.0.1:1/generate: 200 streaming requests" in plan.stdout
    assert tree_snapshot(project.repo) == snapshot
    assert stack.pids() == {}
