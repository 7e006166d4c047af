"""Rollback by recorded commit, the deploy lock, secrets and signals, over every transport."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from fixtures_repo import FIXED_A, ORIGINAL_A, Project, git, staged_bytes, target_python, tree_snapshot
from fixtures_services import GAUGE, Stack, alive, gauge_server
from polling import wait_for

FULL_STEPS = ["local_compile", "upload", "remote_compile", {"diff_bounds": {"files": 1}},
              {"commit": {"message": "pkg: answer is 42"}}, "co_restart",
              {"drain": {"metric": GAUGE, "to": 5, "interval_s": 0.2, "within_s": 10}}]
# What a rollback judges the reverted build's gauge against (without it, a rollback's drain is not run).
BASELINE = {"baseline": {"metric": GAUGE, "interval_s": 0.1, "within_s": 10}}


def slow_python(project: Project, seconds: float) -> str:
    return target_python(project, f"sleep {seconds}")


def gated_python(project: Project) -> tuple[str, Path, Path]:
    """A python for the target that announces it was called, then waits (bounded) for a gate file.

    The test decides when the paused run may go on: no window to race. Returns the wrapper's path,
    the file it creates on entry and the gate the test creates to let it continue."""
    entered, gate = project.root / "python-entered", project.root / "python-gate"
    wrapper = target_python(project, f"touch '{entered}'\ni=0\n"
                                     f"while [ ! -e '{gate}' ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done")
    return wrapper, entered, gate


def test_apply_then_rollback_restores_the_tree_restarts_and_verifies(stack: Stack) -> None:
    project = stack.project
    stack.start_services()
    project.playbook(steps=[BASELINE, *FULL_STEPS])
    pre_tree = git(project.repo, "rev-parse", "HEAD^{tree}").strip()
    assert project.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    applied = project.newest_run()
    deployed_pids = stack.pids()
    assert project.file("pkg/a.py") == FIXED_A

    project.sealed()  # the apply's last write, which lands after it exited
    preview_snapshot = tree_snapshot(project.repo)
    preview = project.deployer("plan", "--rollback", applied)
    assert preview.returncode == 0, preview.stderr
    assert "-    return 42" in preview.stdout and "+    return 41" in preview.stdout
    assert tree_snapshot(project.repo) == preview_snapshot

    result = project.deployer("rollback", applied)
    assert result.returncode == 0, result.stderr + result.stdout
    rollback_id = project.newest_run()
    assert git(project.repo, "rev-parse", "HEAD^{tree}").strip() == pre_tree
    message = git(project.repo, "log", "-1", "--format=%B")
    assert f"Deployer-Run: {rollback_id}" in message and f"Deployer-Rollback-Of: {applied}" in message
    new_pids = stack.pids()
    assert all(new_pids[n] != deployed_pids[n] and alive(new_pids[n]) for n in new_pids)
    ran = [(e["step"], e["status"]) for e in project.events() if e["type"] == "step_end"]
    assert ("rollback:co_restart", "ok") in ran and ("rollback:drain", "ok") in ran

    assert f"rolled back by run {rollback_id}" in project.deployer("runs", "show", applied).stdout
    assert f"rollback of run {applied}" in project.deployer("runs", "show", rollback_id).stdout
    assert project.deployer("runs", "verify", applied).returncode == 0
    assert project.deployer("runs", "verify", rollback_id).returncode == 0
    original = project.runs / applied / "events.jsonl"
    lines = original.read_text().splitlines(keepends=True)
    original.write_text("".join(lines[:-1]))  # drop the rolled_back_by line at the very end
    cut = project.deployer("runs", "verify", applied)
    assert cut.returncode == 5 and "rolled_back_by line for it is missing" in cut.stderr
    original.write_text("".join(lines))

    listed = project.deployer("rollback", "--host", "box", "--list", "--json")
    deploys = json.loads(listed.stdout)["deploys"]
    assert [d["run_id"] for d in deploys] == [rollback_id, applied]
    assert deploys[0]["rollback_of"] == applied


def test_rollback_refuses_unknown_uncommitted_and_foreign_runs(target: Project) -> None:
    assert target.deployer("rollback", "20990101T000000Z-abcdef").returncode == 2

    target.playbook(steps=["upload", {"diff_bounds": {"files": 7}}, {"commit": {"message": "m"}}])
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 1
    failed = target.deployer("rollback", target.newest_run())
    assert failed.returncode == 2 and "made no commit (status failed); there is nothing to roll back. A run that " \
        "failed before its commit restored the target itself.\n" in failed.stderr, failed.stderr

    target.playbook()
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    applied = target.newest_run()
    git(target.repo, "reset", "-q", "--hard", "HEAD~1")
    head = target.head()
    foreign = target.deployer("rollback", applied)
    assert foreign.returncode == 1 and "is not in the history" in foreign.stderr
    assert target.head() == head


def test_rollback_refuses_files_changed_since_unless_forced(target: Project) -> None:
    target.playbook()
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    applied = target.newest_run()
    (target.repo / "pkg/a.py").write_text(FIXED_A + "# later hotfix\n")
    git(target.repo, "commit", "-q", "-am", "later hotfix by hand")
    head = target.head()
    refused = target.deployer("rollback", applied)
    assert refused.returncode == 1 and "changed on the target since" in refused.stderr
    assert target.head() == head
    forced = target.deployer("rollback", applied, "--force")
    assert forced.returncode == 0, forced.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A


def test_a_second_apply_exits_3_naming_the_holder_and_the_lock_goes_away(target: Project) -> None:
    python, entered, gate = gated_python(target)
    target.write_inventory(python=python)
    target.playbook()
    lock = target.repo / ".git" / "deployer.run.lock" / "info.json"
    first = target.popen("apply", "fix.yaml", "--host", "box")
    try:
        # remote_compile runs after the upload, under the lock: the first run is parked there.
        wait_for(entered.exists, seconds=30, what="the first run's remote_compile")
        holder = json.loads(lock.read_text())["run_id"]
        # The fix is staged beside the live file, which keeps its old bytes until the compile passed.
        assert staged_bytes(target.repo, "pkg/a.py") == FIXED_A and target.file("pkg/a.py") == ORIGINAL_A
        head, status_before = target.head(), git(target.repo, "status", "--porcelain")
        second = target.deployer("apply", "fix.yaml", "--host", "box")
        assert second.returncode == 3
        assert f"held by run {holder}" in second.stderr and "since" in second.stderr
        # The refused run touched nothing: the first run's upload is exactly as it left it.
        assert staged_bytes(target.repo, "pkg/a.py") == FIXED_A and target.file("pkg/a.py") == ORIGINAL_A
        assert target.head() == head
        assert git(target.repo, "status", "--porcelain") == status_before
        [second_run] = [p for p in target.runs.iterdir() if p.name != holder]
        second_events = [json.loads(x) for x in (second_run / "events.jsonl").read_text().splitlines()]
        assert not [e for e in second_events if e["type"] == "step_start"]
        assert [e["status"] for e in second_events if e["type"] == "run_end"] == ["failed"]
        status = target.deployer("lock", "status", "--host", "box")
        assert status.returncode == 3 and holder in status.stdout
    finally:
        gate.touch()
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, out + err
    assert not lock.parent.exists()
    assert target.deployer("lock", "status", "--host", "box").returncode == 0


def test_a_failed_run_releases_the_lock(target: Project) -> None:
    target.playbook(steps=["upload", {"diff_bounds": {"files": 9}}])
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 1
    assert not (target.repo / ".git" / "deployer.run.lock").exists()


def test_sigkill_leaves_a_parseable_log_and_a_lock_that_turns_stale(target: Project) -> None:
    target.write_inventory(python=slow_python(target, 30), lock_ttl_s=1)
    target.playbook()
    proc = target.popen("apply", "fix.yaml", "--host", "box")
    wait_for(lambda: staged_bytes(target.repo, "pkg/a.py") == FIXED_A, seconds=30, what="the upload")
    run_id = target.newest_run()
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    for line in (target.runs / run_id / "events.jsonl").read_text().splitlines():
        json.loads(line)
    deadline = time.monotonic() + 30
    while True:
        status = target.deployer("lock", "status", "--host", "box")
        if "STALE" in status.stdout:
            break
        assert time.monotonic() < deadline, status.stdout
        time.sleep(0.3)
    assert run_id in status.stdout and status.returncode == 3
    blocked = target.deployer("apply", "fix.yaml", "--host", "box", "--allow-dirty")
    assert blocked.returncode == 3 and "STALE" in blocked.stderr
    assert target.deployer("lock", "release", "--host", "box").returncode == 2  # --force is required
    released = target.deployer("lock", "release", "--host", "box", "--force")
    assert released.returncode == 0 and run_id in released.stdout
    assert target.deployer("lock", "status", "--host", "box").returncode == 0
    audit = sorted(target.runs.iterdir())[-1]
    assert '"lock_force_released"' in (audit / "events.jsonl").read_text()
    # SIGKILL allows no restore: the new bytes stay staged beside the file (never installed: the compile was
    # cut), and the intent record on the target stops the next apply with the exact command that ends the cut run.
    assert staged_bytes(target.repo, "pkg/a.py") == FIXED_A and target.file("pkg/a.py") == ORIGINAL_A
    refused = target.deployer("apply", "fix.yaml", "--host", "box")
    assert refused.returncode == 3 and f"deployer recover {run_id} --host box" in refused.stderr
    recovered = target.deployer("recover", run_id)
    assert recovered.returncode == 0, recovered.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A and staged_bytes(target.repo, "pkg/a.py") is None


SECRET = "hf_Zq8sEcReT_t0ken_value"


def test_a_secret_never_appears_in_logs_output_or_errors(stack: Stack) -> None:
    project = stack.project
    leaky = {"start": [sys.executable, "-c", f"import sys; print('token is {SECRET}'); sys.exit(3)"],
             "env": {"HF_TOKEN": {"secret": True, "value": SECRET}},
             "health": "http://127.0.0.1:9/health"}
    stack.configure(prefill=leaky)
    project.write("fix/a.py", FIXED_A + f"# {SECRET}\n")
    project.playbook(steps=["upload", {"diff_bounds": {"files": 1}}, {"commit": {"message": f"m {SECRET}"}},
                            "co_restart"])
    plan = project.deployer("plan", "fix.yaml", "--host", "box", "--verbose")
    brief = project.deployer("plan", "fix.yaml", "--host", "box")
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 5
    assert "***" in result.stderr and "service prefill" in result.stderr
    assert "HF_TOKEN=***" in plan.stdout  # the exact plan shows the start command's environment, masked
    assert "start prefill: " in brief.stdout
    for text in (plan.stdout, plan.stderr, brief.stdout, brief.stderr, result.stdout, result.stderr):
        assert SECRET not in text
    for path in Path(project.runs).rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_secret_from_the_environment(target: Project) -> None:
    target.write_inventory(env={"API_KEY": {"value_from_env": "DEPLOYER_TEST_SECRET"}})
    target.playbook()
    missing = target.deployer("plan", "fix.yaml", "--host", "box")
    assert missing.returncode == 2 and "DEPLOYER_TEST_SECRET is not set" in missing.stderr


def test_sigint_after_the_commit_rolls_back_and_exits_130(stack: Stack) -> None:
    project = stack.project
    # The fix never drains, the reverted build does: the rollback drains again, as a manual one does.
    stack.configure(**{name: {**stack.service(name), "env": {"PYTHONDONTWRITEBYTECODE": "1"},
                              "start": gauge_server(project.root, port, project.repo, stack.www)}
                       for name, port in stack.ports.items()})
    stack.start_services()
    pre_tree = git(project.repo, "rev-parse", "HEAD^{tree}").strip()
    project.playbook(steps=[BASELINE, "upload", {"commit": {"message": "m"}}, "co_restart",
                            {"drain": {"metric": GAUGE, "to": 0, "interval_s": 0.2, "within_s": 60}}],
                     on_failure="rollback")
    proc = project.popen("apply", "fix.yaml", "--host", "box")

    def draining() -> bool:  # the apply's own dir may exist a moment before its log in it
        newest = project.runs / project.newest_run() / "events.jsonl"
        return newest.is_file() and any(e["type"] == "sample" and e.get("step") == "drain"
                                        for e in project.events())

    wait_for(draining, seconds=30, what="the drain step")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert "Rolled back" in err
    assert git(project.repo, "rev-parse", "HEAD^{tree}").strip() == pre_tree
    assert not (project.repo / ".git" / "deployer.run.lock").exists()
    end = next(e for e in project.events() if e["type"] == "run_end")
    assert end["status"] == "canceled" and end["facts"]["rollback_commit"] == project.head()
    assert [e["status"] for e in project.events() if e["type"] == "step_end" and e["step"] == "rollback:drain"] \
        == ["ok"]


def test_a_rollback_that_was_cut_off_after_its_commit_can_be_finished(stack: Stack) -> None:
    project = stack.project
    project.playbook(steps=FULL_STEPS)
    assert project.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    applied = project.newest_run()
    # What a rollback killed between its revert commit and its restart leaves behind.
    before = json.loads((project.runs / applied / "events.jsonl").read_text().splitlines()[-1])["git"]["before"]
    git(project.repo, "checkout", before, "--", "pkg/a.py")
    git(project.repo, "commit", "-q", "-m", "half-done rollback", "--", "pkg/a.py")
    head, pids = project.head(), stack.pids()
    finished = project.deployer("rollback", applied)
    assert finished.returncode == 0, finished.stderr
    assert project.head() == head  # nothing left to commit ...
    assert all(stack.pids()[n] != pids[n] for n in pids)  # ... but the restart and checks ran
    assert project.file("pkg/a.py") == ORIGINAL_A


def test_a_lock_path_that_cannot_be_created_is_not_reported_as_held(target: Project) -> None:
    (target.repo / ".git" / "deployer.run.lock").write_text("not a lock directory\n")
    target.playbook()
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stderr
    assert "cannot create the deploy lock" in result.stderr and "held by" not in result.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A
