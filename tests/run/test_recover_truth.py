"""What recover leaves must be what the target shows, and its cut run's log must verify again afterwards.

Every way a run can end: killed before its lock (no run_end, nothing on the target), killed holding only its
lock, ended by its own failed restore (its own run_end), killed after its commit. Recover appends a `run_end`
only where the log has none, one `recovered_by` line, and nothing at all when run again; it never takes a
commit that does not carry the run's trailer for the run's own.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from fixtures_repo import FIXED_A, ORIGINAL_A, Project, age_lock, git, target_python, work_tree
from fixtures_services import Stack
from polling import wait_for
from test_recover import gate, kill_marker, killed_after_its_commit, start_and_kill, state_of

pytest_plugins = ["fixtures_repo", "fixtures_ssh", "fixtures_services"]


def kinds(project: Project, run: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in project.events(run.name) if e["type"] == kind]


def ok(result: subprocess.CompletedProcess[str], code: int = 0) -> subprocess.CompletedProcess[str]:
    assert result.returncode == code, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def assert_second_recover_changes_nothing(project: Project, run: Path, *args: str) -> None:
    """Run again, recover finds nothing: the tree, HEAD and the cut run's log bytes stay exactly as they are."""
    log, tree, head = (run / "events.jsonl").read_bytes(), work_tree(project.repo), project.head()
    again = ok(project.deployer("recover", *(args or (run.name,))))
    assert "nothing to recover" in again.stdout
    assert (run / "events.jsonl").read_bytes() == log, "a second recover wrote to the cut run's log"
    assert work_tree(project.repo) == tree and project.head() == head


def test_a_recover_ends_a_run_killed_before_its_lock_so_that_its_log_verifies(target: Project) -> None:
    # The host's python blocks before it becomes the agent: the run has connected (or is connecting) and
    # recorded `locked`, but nothing, not even the lock, reached the target.
    script, marker = gate(target, "agent-start")
    target.write_inventory(python=str(script))
    target.playbook()
    tree, head = work_tree(target.repo), target.head()
    # The connection opens on a thread of its own: wait for the run's record too.
    run = start_and_kill(target, lambda: marker.exists() and any(target.runs.glob("*/state.json")),
                         "the agent's start")
    kill_marker(marker)
    target.write_inventory()
    assert kinds(target, run, "run_end") == [] and not (target.repo / ".git" / "deployer.run.lock").exists()
    assert target.deployer("runs", "verify", run.name).returncode == 5
    first = ok(target.deployer("recover", run.name))
    # failed: it changed nothing; failed_restored where its record said `changing` (a whole chain's record is
    # written before its request goes out): as `runs list` shows it either way.
    said = re.search(rf"run {run.name} -> (\w+)", first.stdout)
    assert said and said[1] in ("failed", "failed_restored"), first.stdout
    assert re.search(rf"{run.name} +{said[1]} ", target.deployer("runs", "list").stdout)
    ok(target.deployer("runs", "verify", run.name))
    [end], [link] = kinds(target, run, "run_end"), kinds(target, run, "recovered_by")
    assert (end["phase"], end["ended_by"], link["outcome"]) == ("failed_restored", link["by"], "failed_restored")
    assert state_of(run)["phase"] == "failed_restored"
    assert work_tree(target.repo) == tree and target.head() == head
    assert_second_recover_changes_nothing(target, run)


def test_a_recover_ends_a_run_killed_before_its_log_named_its_host(target: Project) -> None:
    # Killed between its first state record and its run_start line: only state.json says which host it was for.
    script, marker = gate(target, "agent-start")
    target.write_inventory(python=str(script))
    target.playbook()
    run = start_and_kill(target, lambda: marker.exists() and any(target.runs.glob("*/state.json")),
                         "the agent's start")
    kill_marker(marker)
    target.write_inventory()
    (run / "events.jsonl").write_bytes(b"")
    first = ok(target.deployer("recover", run.name))
    # failed: it changed nothing; failed_restored where its record said `changing` (a whole chain's record is
    # written before its request goes out): as `runs list` shows it either way.
    said = re.search(rf"run {run.name} -> (\w+)", first.stdout)
    assert said and said[1] in ("failed", "failed_restored"), first.stdout
    assert re.search(rf"{run.name} +{said[1]} ", target.deployer("runs", "list").stdout)
    ok(target.deployer("runs", "verify", run.name))


def test_a_recover_by_host_releases_the_lock_of_a_run_killed_before_its_intent_record(
        target: Project, stack: Stack) -> None:
    # An absent metric keeps the baseline polling: the run holds its lock, and has written no intent record.
    target.playbook(steps=[{"baseline": {"metric": "absent_metric", "within_s": 120, "interval_s": 0.1}},
                           "local_compile", "upload", {"commit": {"message": "m"}}])
    lock = target.repo / ".git" / "deployer.run.lock"
    elsewhere = ["--runs-dir", str(target.root / "other-runs")]
    proc = target.popen("apply", "fix.yaml", "--host", "box")
    try:
        wait_for(lambda: any('"type": "sample"' in (p / "events.jsonl").read_text()
                             for p in target.runs.glob("*") if (p / "events.jsonl").is_file()), "the baseline")
        live = target.deployer("recover", "--host", "box", *elsewhere)
        assert live.returncode == 3 and "heartbeat is fresh" in live.stderr, live.stdout + live.stderr
        assert lock.is_symlink(), "a live run's lock was taken"
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    [run] = [p for p in target.runs.iterdir() if (p / "state.json").is_file()]
    assert lock.is_symlink() and not (target.repo / ".git" / "deployer" / "inflight.json").exists()
    # What a kill inside the agent's write of the intent record leaves (the temp, never renamed): planted, since
    # no signal can be timed into that write.
    debris = target.repo / ".git" / "deployer" / ".deployer-k1lled.tmp"
    debris.parent.mkdir(exist_ok=True)
    debris.write_text('{"run_id": ')
    age_lock(target.repo)
    done = ok(target.deployer("recover", "--host", "box", *elsewhere))
    assert f"run {run.name} -> failed_restored; removed temp files {debris}; its lock was released" in done.stdout, \
        done.stdout
    assert not lock.exists() and not lock.is_symlink()
    assert not debris.exists(), "recover left the temp of a write the cut run never finished"
    # Nothing left on the target: the same answer as `recover RUN` gives, exit 0 too.
    again = ok(target.deployer("recover", "--host", "box", *elsewhere))
    assert again.stdout == "box: nothing to recover (no intent record or lock of it on the target, its record " \
                           "and log ended)\n"
    assert json.loads(ok(target.deployer("recover", "--host", "box", "--json", *elsewhere)).stdout)["exit_code"] == 0
    # The run dir here still ends the run's own record and log.
    ok(target.deployer("recover", run.name))
    assert state_of(run)["phase"] == "failed_restored"
    ok(target.deployer("runs", "verify", run.name))
    assert_second_recover_changes_nothing(target, run)


def test_a_recover_refuses_a_commit_that_only_quotes_the_runs_trailer_and_ends_a_run_that_wrote_its_own_end(
        target: Project) -> None:
    # remote_compile waits until the test has committed on the target, then fails: the run's restore finds
    # HEAD moved by a commit that is not the run's, refuses it (exit 6) and writes its own run_end.
    go = target.root / "go"
    marker = target.root / "compile.reached"
    python = target_python(target, f'echo $$ > "{marker}"; while [ ! -e "{go}" ]; do sleep 0.05; done',
                           then="exit 1")
    target.write_inventory(python=python)
    target.playbook(steps=["local_compile", "upload", "remote_compile", {"commit": {"message": "m"}}])
    head, tree = target.head(), work_tree(target.repo)
    proc = target.popen("apply", "fix.yaml", "--host", "box")
    try:
        wait_for(marker.exists, "remote_compile")
        run = next(p for p in target.runs.iterdir() if (p / "state.json").is_file())
        git(target.repo, "commit", "-q", "--allow-empty", "-m", "other work",
            "-m", f"This is not Deployer-Run: {run.name}, it only quotes it.")
        foreign = target.head()
        go.touch()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 6 and "not by this run's commit" in err, err
    assert len(kinds(target, run, "run_end")) == 1 and state_of(run)["phase"] == "interrupted"
    target.write_inventory()
    refused = ok(target.deployer("recover", run.name), 6)
    assert "not by this run's commit" in refused.stderr
    state = state_of(run)
    assert state["git_after"] is None and state["phase"] == "interrupted" and target.head() == foreign
    assert kinds(target, run, "recovered_by") == []
    # The operator takes the other commit off; now recover restores, and adds no second run_end.
    git(target.repo, "reset", "-q", "--soft", head)
    ok(target.deployer("recover", run.name))
    assert work_tree(target.repo) == tree and target.file("pkg/a.py") == ORIGINAL_A
    assert len(kinds(target, run, "run_end")) == 1 and len(kinds(target, run, "recovered_by")) == 1
    assert state_of(run)["phase"] == "failed_restored"
    ok(target.deployer("runs", "verify", run.name))
    assert_second_recover_changes_nothing(target, run)


def test_a_recover_removes_the_upload_temp_files_when_the_runs_commit_exists(target: Project) -> None:
    run = killed_after_its_commit(target)
    # What an upload cut earlier leaves beside a dest and in deployer's state dir.
    temps = [target.repo / "pkg" / ".a.py.deployer-0a1b2c.tmp",
             target.repo / ".git" / "deployer" / ".deployer-3d4e.tmp"]
    for temp in temps:
        temp.parent.mkdir(exist_ok=True)
        temp.write_text("half an upload")
    done = ok(target.deployer("recover", run.name))
    assert "failed_committed" in done.stdout and "removed temp files" in done.stdout, done.stdout
    assert [t for t in temps if t.exists()] == []
    assert target.file("pkg/a.py") == FIXED_A
    assert state_of(run)["git_after"] == target.head()
    assert len(kinds(target, run, "run_end")) == 1
    assert_second_recover_changes_nothing(target, run)
