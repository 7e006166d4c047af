"""A run can be cut anywhere: SIGKILL at six moments of an apply, then `deployer recover` ends it.

Each moment is made deterministic by something real that blocks there (a git hook, a service that never
gets healthy, a metric that never settles) and writes its pid to a marker file when it is reached; the test
waits for the marker (with a deadline) and kills the deployer process then. After recover: the target is
byte for byte as before, or holds exactly the run's commit and the log says so; no temp files, no lock, no
intent record; `runs verify` passes; a second recover changes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, age_lock, git, work_tree
from fixtures_services import GAUGE, Stack
from polling import wait_for

pytest_plugins = ["fixtures_repo", "fixtures_ssh", "fixtures_services"]

GATE_SCRIPT = """#!/bin/sh
# Blocks here for good: the test kills the deployer (and then this) once the marker names our pid.
echo $$ > "{marker}"
while :; do sleep 0.05; done
"""


def gate(project: Project, name: str) -> tuple[Path, Path]:
    marker = project.root / f"{name}.reached"
    script = project.root / f"{name}.sh"
    script.write_text(GATE_SCRIPT.format(marker=marker))
    script.chmod(0o755)
    return script, marker


def kill_marker(marker: Path) -> None:
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
        os.kill(int(marker.read_text().strip()), signal.SIGKILL)


def run_dir(project: Project) -> Path:
    return sorted(p for p in project.runs.iterdir() if (p / "state.json").is_file())[0]


def state_of(run: Path) -> dict[str, Any]:
    return dict(json.loads((run / "state.json").read_text()))


def start_and_kill(project: Project, reached: Callable[[], bool], what: str, *extra: str) -> Path:
    proc = project.popen("apply", "fix.yaml", "--host", "box", *extra)
    try:
        wait_for(lambda: reached() or proc.poll() is not None, what)
        assert proc.poll() is None, f"the apply ended before {what}: {proc.communicate()}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    age_lock(project.repo)
    return run_dir(project)


def assert_settled(project: Project, run: Path) -> None:
    git_dir = project.repo / ".git"
    assert not (git_dir / "deployer.run.lock").exists(), "the lock is still there"
    assert not (git_dir / "deployer" / "inflight.json").exists(), "the intent record is still there"
    temps = [p.name for p in project.repo.rglob("*.tmp") if "deployer" in p.name]
    assert temps == []
    verified = project.deployer("runs", "verify", run.name)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def recover_twice(project: Project, run: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    first = project.deployer("recover", run.name, *extra)
    assert first.returncode == 0, first.stdout + first.stderr
    snapshot = work_tree(project.repo)
    head = project.head()
    again = project.deployer("recover", run.name)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "nothing to recover" in again.stdout
    assert work_tree(project.repo) == snapshot and project.head() == head
    return first


def commit_with_hooks() -> list[Any]:
    return ["local_compile", "upload", "remote_compile",
            {"diff_bounds": {"files": 1, "insertions": [1, 10], "deletions": [0, 2]}},
            {"commit": {"message": "pkg: answer is 42", "hooks": True}}]


@pytest.mark.parametrize("moment", ["pre-commit", "uploading"])
def test_killed_before_its_commit_the_run_is_restored_byte_for_byte_by_recover(target: Project,
                                                                                 moment: str) -> None:
    os.chown(target.repo / "pkg/a.py", 12345, 12346)
    (target.repo / "pkg/a.py").chmod(0o640)
    before_tree, head = work_tree(target.repo), target.head()
    if moment == "pre-commit":
        script, marker = gate(target, "pre-commit")
        target.hook("pre-commit", f"#!/bin/sh\nexec {script}\n")
        target.playbook(steps=commit_with_hooks())
        reached: Callable[[], bool] = marker.exists
    else:
        # A big second file keeps the upload busy; the kill lands while the state says `changing`.
        big = "x = 1\n" * 2_500_000  # 15 MB: under the 16 MiB a shipped file may have
        target.write("fix/big.py", big)
        target.playbook(files=[{"src": "fix/a.py", "dest": "pkg/a.py"},
                               {"src": "fix/big.py", "dest": "pkg/big.py", "create": True}],
                        steps=["upload", {"commit": {"message": "m"}}])
        marker = target.root / "none"
        # Killed before its chain reached the agent, the run would leave no intent record to recover from (nothing
        # changed, and the next apply goes through): the kill waits for the record on the target too.
        intent = target.repo / ".git" / "deployer" / "inflight.json"
        reached = lambda: intent.exists() and any(  # noqa: E731
            state_of(p).get("phase") == "changing" for p in target.runs.glob("*") if (p / "state.json").is_file())
    run = start_and_kill(target, reached, f"the {moment} moment")
    kill_marker(marker)
    assert state_of(run)["phase"] in ("changing", "changed", "committing")
    blocked = target.deployer("apply", "fix.yaml", "--host", "box")
    assert blocked.returncode == 3, blocked.stdout + blocked.stderr
    assert f"deployer recover {run.name}" in blocked.stderr
    recover_twice(target, run)
    assert target.head() == head
    assert work_tree(target.repo) == before_tree
    st = (target.repo / "pkg/a.py").stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (12345, 12346, 0o640)
    assert git(target.repo, "status", "--porcelain") == ""
    assert state_of(run)["phase"] == "failed_restored"
    assert_settled(target, run)


def killed_after_its_commit(target: Project) -> Path:
    """A run SIGKILLed in its post-commit hook: git made the commit, the run never learnt its hash."""
    script, marker = gate(target, "post-commit")
    target.hook("post-commit", f"#!/bin/sh\nexec {script}\n")
    target.playbook(steps=commit_with_hooks())
    run = start_and_kill(target, marker.exists, "the post-commit hook")
    kill_marker(marker)
    return run


def as_if_ran_ahead_of_its_record(run: Path) -> None:
    """run's record here as when the target made its commit (sent with the upload) before this machine wrote
    `committing` (seen under load)."""
    path = run / "state.json"
    state = json.loads(path.read_text())
    if state["phase"] == "committing":
        state["phase"], state["history"] = "changed", state["history"][:-1]
        path.write_text(json.dumps(state))


@pytest.mark.parametrize("record", ["as_cut", "ahead_of_record"])
def test_killed_after_git_made_the_commit_recover_keeps_exactly_that_commit_and_says_so(target: Project,
                                                                                         record: str) -> None:
    before = target.head()
    run = killed_after_its_commit(target)
    cut = state_of(run)  # the commit went with the upload: the target may make it before the record here says so
    assert cut["sent_ahead"][-1] == "commit" and cut["phase"] in ("changing", "changed", "committing"), cut
    if record == "ahead_of_record":
        as_if_ran_ahead_of_its_record(run)
        assert state_of(run)["phase"] in ("changing", "changed")
    first = recover_twice(target, run)
    head = target.head()
    assert head != before and git(target.repo, "rev-parse", "HEAD~1").strip() == before
    assert f"Deployer-Run: {run.name}" in git(target.repo, "log", "-1", "--format=%B")
    assert target.file("pkg/a.py") == FIXED_A and git(target.repo, "status", "--porcelain") == ""
    assert "failed_committed" in first.stdout and head[:12] in first.stdout
    state = state_of(run)
    assert state["phase"] == "failed_committed"
    lines = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    end = next(e for e in lines if e["type"] == "run_end")
    assert end["git"]["after"] == head
    assert_settled(target, run)
    # And the kept commit can be rolled back like any other.
    rolled = target.deployer("rollback", run.name)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A


# One transport: what is judged is the run logs here (recover --rollback runs over both in
# test_a_commit_that_ran_ahead_of_its_record_here_is_rolled_back_by_recover).
@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_a_rollback_finished_by_recover_is_refused_as_done_by_a_later_rollback(target: Project) -> None:
    before = target.head()
    run = killed_after_its_commit(target)
    recovered = target.deployer("recover", run.name, "--rollback")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    recover_id = target.newest_run()
    revert = target.head()
    assert git(target.repo, "rev-parse", "HEAD~2").strip() == before and target.file("pkg/a.py") == ORIGINAL_A
    again = target.deployer("rollback", run.name)
    assert (again.returncode, again.stderr) == (2, f"error: run {run.name} was already rolled back, finished by "
                                                   f"deployer recover (run {recover_id}, commit {revert[:12]})\n")
    assert target.head() == revert


@pytest.mark.parametrize("moment", ["baseline", "restarting", "draining"])
def test_killed_while_observing_or_restarting_recover_ends_the_run_consistently(
        target: Project, stack: Stack, moment: str) -> None:
    head = target.head()
    steps: list[Any] = ["local_compile", "upload", "remote_compile",
                        {"diff_bounds": {"files": 1, "insertions": [1, 10], "deletions": [0, 2]}},
                        {"commit": {"message": "pkg: answer is 42"}}]
    marker = target.root / "never"
    if moment == "baseline":
        # A metric that is absent keeps the baseline polling (inconclusive until within_s).
        steps.insert(0, {"baseline": {"metric": "absent_metric", "within_s": 120, "interval_s": 0.1}})
    elif moment == "restarting":
        script, marker = gate(target, "start")
        stack.configure(prefill={"start": [str(script)], "health": "http://127.0.0.1:9/health",
                                 "health_timeout_s": 120})
        steps.append({"co_restart": {"services": ["prefill"]}})
    else:
        stack.set_gauge(3.0)
        steps += [{"co_restart": {}}, {"drain": {"metric": GAUGE, "to": 0, "within_s": 120, "interval_s": 0.1}}]
    target.playbook(steps=steps)

    def reached() -> bool:
        if moment == "restarting":
            return marker.exists()
        runs = [p for p in target.runs.glob("*") if (p / "events.jsonl").is_file()]
        wanted = "baseline" if moment == "baseline" else "drain"
        return any(f'"step": "{wanted}"' in (p / "events.jsonl").read_text() and
                   '"type": "sample"' in (p / "events.jsonl").read_text() for p in runs)

    run = start_and_kill(target, reached, f"the {moment} moment")
    kill_marker(marker)
    stack.kill_all()
    # Cut in its restart or checks, the run gets them again from recover: services that can start, a gauge
    # that drains (test_recover_restart.py has the restart that cannot succeed).
    stack.configure()
    stack.set_gauge(0.0)
    recover_twice(target, run)
    state = state_of(run)
    if moment == "baseline":
        assert target.head() == head and target.file("pkg/a.py") == ORIGINAL_A
        assert state["phase"] == "failed_restored"
    else:
        assert git(target.repo, "rev-parse", "HEAD~1").strip() == head
        assert target.file("pkg/a.py") == FIXED_A
        assert state["phase"] == "succeeded"
    assert_settled(target, run)


def test_recover_from_another_machine_uses_the_intent_record_and_gits_objects(target: Project) -> None:
    before_tree, head = work_tree(target.repo), target.head()
    script, marker = gate(target, "pre-commit")
    target.hook("pre-commit", f"#!/bin/sh\nexec {script}\n")
    target.playbook(steps=commit_with_hooks())
    run = start_and_kill(target, marker.exists, "the pre-commit hook")
    kill_marker(marker)
    # The other operator has no run dir: recover by host, from the target's own records.
    elsewhere = target.runs.parent / "other-runs"
    done = target.deployer("recover", "--host", "box", "--runs-dir", str(elsewhere))
    assert done.returncode == 0, done.stdout + done.stderr
    assert run.name in done.stdout and "failed_restored" in done.stdout
    # What it restored, by name; nothing said of removals where there were none.
    assert re.search(r"; restored pkg/a\.py[,;]", done.stdout) and "removed -" not in done.stdout, done.stdout
    assert work_tree(target.repo) == before_tree and target.head() == head
    assert not (target.repo / ".git" / "deployer" / "inflight.json").exists()
    assert any((p / "events.jsonl").is_file() for p in elsewhere.iterdir())


def test_a_commit_that_ran_ahead_of_its_record_here_is_rolled_back_by_recover(target: Project) -> None:
    # The commit goes to the target with the upload: on a slow machine the target makes it while the record
    # here still says `changed` (seen under load). Killed after the commit, that record is what recover finds.
    before = target.head()
    run = killed_after_its_commit(target)
    as_if_ran_ahead_of_its_record(run)
    # Sent whole with the lock, its record here may even be at `changing` still.
    assert state_of(run)["phase"] in ("changing", "changed") and state_of(run)["sent_ahead"][-1:] == ["commit"]
    recovered = target.deployer("recover", run.name, "--rollback")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert git(target.repo, "rev-parse", "HEAD~2").strip() == before and target.file("pkg/a.py") == ORIGINAL_A
    assert state_of(run)["phase"] == "rolled_back"
