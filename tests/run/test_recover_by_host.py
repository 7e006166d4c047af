"""`deployer recover --host H` of a run made on this machine recovers it as `recover RUN_ID` does: with the cut
run's own playbook, its checks after the restart included. Found by a new user: it used the bare restart-only
playbook meant for a run dir on another machine, skipped the drain and still called the cut run succeeded."""

from __future__ import annotations

import json
from typing import Any

from fixtures_repo import FIXED_A, Project, git
from fixtures_services import GAUGE, Stack
from test_recover import gate, kill_marker, start_and_kill, state_of

pytest_plugins = ["fixtures_repo", "fixtures_ssh", "fixtures_services"]


def test_recover_by_host_of_a_run_made_here_runs_its_own_checks_after_the_restart(target: Project,
                                                                                  stack: Stack) -> None:
    head = target.head()
    script, marker = gate(target, "start")
    stack.configure(prefill={"start": [str(script)], "health": "http://127.0.0.1:9/health",
                             "health_timeout_s": 120})
    steps: list[Any] = ["local_compile", "upload", "remote_compile",
                        {"diff_bounds": {"files": 1, "insertions": [1, 10], "deletions": [0, 2]}},
                        {"commit": {"message": "pkg: answer is 42"}}, {"co_restart": {"services": ["prefill"]}},
                        {"drain": {"metric": GAUGE, "to": 0, "within_s": 60, "interval_s": 0.1}}]
    target.playbook(steps=steps)
    run = start_and_kill(target, marker.exists, "the restart")
    kill_marker(marker)
    stack.kill_all()
    stack.configure()
    stack.set_gauge(0.0)
    recovered = target.deployer("recover", "--host", "box")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    recover_id = target.newest_run()
    events = [json.loads(line) for line in (target.runs / recover_id / "events.jsonl").read_text().splitlines()]
    ran = [e["step"] for e in events if e["type"] == "step_end" and e.get("status") == "ok"]
    assert "drain" in ran, ran  # the cut run's check after its restart, not only a restart
    assert git(target.repo, "rev-parse", "HEAD~1").strip() == head and target.file("pkg/a.py") == FIXED_A
    assert state_of(run)["phase"] == "succeeded"
