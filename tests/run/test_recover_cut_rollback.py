"""A rollback is a run too: SIGKILLed in its restart, `deployer recover ROLLBACK_RUN` finishes it.

Found by hand: recover of a rollback cut in its co_restart failed with an internal error (`no transition
rolling_back -> failed_restored`), exit 1, and kept the lock. The cut is made deterministic by a service whose
start blocks (a script that writes its pid to a marker and never returns), as in test_recover.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fixtures_repo import ORIGINAL_A, Project, age_lock, git
from fixtures_services import Stack
from polling import wait_for
from test_recover import assert_settled, gate, kill_marker, state_of

pytest_plugins = ["fixtures_repo", "fixtures_ssh", "fixtures_services"]


def newest(project: Project) -> Path:
    return max((p for p in project.runs.iterdir() if (p / "state.json").is_file()), key=lambda p: p.name)


def test_a_rollback_killed_in_its_restart_is_finished_by_recover_of_that_rollback(target: Project,
                                                                                 stack: Stack) -> None:
    before = target.head()
    steps: list[Any] = ["local_compile", "upload", "remote_compile",
                        {"diff_bounds": {"files": 1, "insertions": [1, 10], "deletions": [0, 2]}},
                        {"commit": {"message": "pkg: answer is 42"}}, {"co_restart": {"services": ["prefill"]}}]
    target.playbook(steps=steps)
    applied = target.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    original = newest(target)
    # The rollback's restart blocks in the service's start until the test kills it.
    script, marker = gate(target, "start")
    stack.configure(prefill={"start": [str(script)], "health": "http://127.0.0.1:9/health",
                             "health_timeout_s": 120})
    proc = target.popen("rollback", original.name)
    try:
        wait_for(lambda: marker.exists() or proc.poll() is not None, "the rollback's restart")
        assert proc.poll() is None, f"the rollback ended before its restart: {proc.communicate()}"
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    kill_marker(marker)
    stack.kill_all()
    age_lock(target.repo)
    rollback = newest(target)
    assert rollback != original and state_of(rollback)["phase"] == "rolling_back"
    assert target.file("pkg/a.py") == ORIGINAL_A  # the revert commit went in before the restart
    revert = target.head()
    assert git(target.repo, "rev-parse", "HEAD~2").strip() == before

    stack.configure()  # services that can start again
    recovered = target.deployer("recover", rollback.name)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert "internal error" not in recovered.stderr
    # Said as what it was: the rollback finished with its revert kept, not the rollback "rolled back" by its own revert.
    assert f"its rollback of run {original.name} finished, its revert {target.head()[:12]} kept" in recovered.stdout
    assert "rolled back by" not in recovered.stdout
    recover_id = target.newest_run()
    # The rollback ends as it would have: the revert kept (no second revert), the services up on it, its
    # record rolled_back; the run it undid keeps its own end, and its log names the rollback.
    assert target.head() == revert and target.file("pkg/a.py") == ORIGINAL_A
    assert state_of(rollback)["phase"] == "rolled_back", state_of(rollback)
    assert state_of(original)["phase"] == "succeeded", state_of(original)
    assert stack.fetch(stack.service("prefill")["health"]) is not None
    assert_settled(target, rollback)
    again = target.deployer("rollback", original.name)
    assert again.returncode == 2 and "already rolled back" in again.stderr, again.stdout + again.stderr
    lines = [json.loads(line) for line in (rollback / "events.jsonl").read_text().splitlines()]
    end = next(e for e in lines if e["type"] == "run_end")
    assert (end["status"], end["phase"], end["ended_by"]) == ("successful", "rolled_back", recover_id)
    assert [e["type"] for e in lines].count("recovered_by") == 1
    verified = target.deployer("runs", "verify", original.name, "--target")
    assert verified.returncode == 0, verified.stdout + verified.stderr
