"""The patch chain end to end, over every transport: what lands, what fails, what is restored."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from fixtures_repo import (
    AFTER_UPLOAD_FAILS,
    COMPILE_REFUSED,
    FIXED_A,
    ORIGINAL_A,
    ORIGINAL_B,
    Project,
    git,
    refusing_python,
    signal_one,
    staged_bytes,
    target_python,
    tree_snapshot,
)

from deployer.diffs import DiffStat, FileStat
from deployer.steps.git import BoundsParams, DiffBounds


def run_dirs(project: Project) -> list[Path]:
    return sorted(p for p in project.runs.iterdir()) if project.runs.exists() else []


def last_run_end(project: Project) -> dict[str, object]:
    return next(e for e in project.events() if e["type"] == "run_end")


def uploaded(project: Project) -> list[tuple[object, object]]:
    """What the run log says the upload step put on the target: sha256 and size of each file, in order."""
    return [(e["sha256"], e["size"]) for e in project.events() if e["type"] == "uploaded"]


def test_apply_ships_compiles_bounds_and_commits_exactly_the_shipped_files(target: Project) -> None:
    target.write("fix/new_mod.py", "NEW = True\n")
    target.playbook(files=[{"src": "fix/a.py", "dest": "pkg/a.py"},
                           {"src": "fix/new_mod.py", "dest": "pkg/sub/new_mod.py", "create": True}],
                    steps=["local_compile", "upload", "remote_compile",
                           {"diff_bounds": {"files": 2, "insertions": [2, 12], "deletions": [0, 2]}},
                           {"commit": {"message": "pkg: answer is 42"}}])
    before = target.head()
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr + result.stdout
    assert target.file("pkg/a.py") == FIXED_A
    assert target.file("pkg/sub/new_mod.py") == "NEW = True\n"
    assert uploaded(target) == [(hashlib.sha256(FIXED_A.encode()).hexdigest(), len(FIXED_A)),
                                (hashlib.sha256(b"NEW = True\n").hexdigest(), 11)]
    assert git(target.repo, "rev-parse", "HEAD~1").strip() == before
    changed = git(target.repo, "diff", "--name-only", "HEAD~1", "HEAD").split()
    assert sorted(changed) == ["pkg/a.py", "pkg/sub/new_mod.py"]
    message = git(target.repo, "log", "-1", "--format=%B")
    run_id = run_dirs(target)[-1].name
    assert message.startswith("pkg: answer is 42")
    assert f"Deployer-Run: {run_id}" in message
    assert git(target.repo, "status", "--porcelain") == ""
    end = last_run_end(target)
    assert end["status"] == "successful"
    assert end["git"] == {"before": before, "after": target.head()}


def test_local_syntax_error_touches_nothing_on_the_target(target: Project) -> None:
    target.write("fix/a.py", "def answer(:\n    return 42\n")
    target.playbook()
    snapshot = tree_snapshot(target.repo)
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1
    assert "local_compile" in result.stderr and "fix/a.py:1:" in result.stderr  # the file to fix
    assert "shipped as pkg/a.py" in result.stderr
    assert tree_snapshot(target.repo) == snapshot


def strict_python(project: Project) -> str:
    """The target's venv python, configured stricter than ours: warnings are errors there."""
    wrapper = project.write("venv/bin/python", f"#!/bin/sh\nexec {sys.executable} -W error \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def test_remote_compile_error_restores_the_files_and_commits_nothing(target: Project) -> None:
    # Valid here, but an invalid escape sequence is an error under the target's -W error.
    target.write("fix/a.py", 'PATTERN = "\\d+"\n')
    target.write_inventory(python=strict_python(target))
    target.playbook()
    head = target.head()
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stdout
    assert "remote_compile" in result.stderr
    assert "exited 1" in result.stderr
    assert "invalid escape sequence" in result.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A
    assert target.head() == head
    assert git(target.repo, "status", "--porcelain") == ""


def test_bounds_too_high_restores_and_commits_nothing(target: Project) -> None:
    target.playbook(steps=["upload", {"diff_bounds": {"insertions": [0, 2]}}, {"commit": {"message": "m"}}])
    head = target.head()
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1
    assert "insertions 5 outside [0, 2]" in result.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A
    assert target.head() == head
    assert git(target.repo, "status", "--porcelain") == ""


def test_zero_changes_already_applied_are_nothing_to_do_in_plan_and_apply_committing_nothing(target: Project) -> None:
    target.write("fix/a.py", ORIGINAL_A)
    target.playbook(steps=["upload", {"diff_bounds": {"files": [0, 5]}}, {"commit": {"message": "m"}}])
    head = target.head()
    plan = target.deployer("plan", "fix.yaml", "--host", "box")
    assert plan.returncode == 0 and "bounds: FAIL" not in plan.stdout, plan.stdout
    assert f"nothing to do: every file already holds these bytes at HEAD {head}: apply would end `unchanged`" \
        in " ".join(plan.stdout.split()), plan.stdout
    assert json.loads(target.deployer("plan", "fix.yaml", "--host", "box", "--json").stdout)["already_applied"]
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr  # already applied: nothing to do (tests/cli/test_already_applied.py)
    assert f"run {target.newest_run()}: unchanged (exit 0)" in result.stdout
    assert target.head() == head
    assert git(target.repo, "status", "--porcelain") == ""


def test_zero_changes_without_an_explanation_mean_the_upload_did_not_land() -> None:
    # A lost upload cannot be produced for real here (put verifies its sha256 on the target),
    # so this checks the verdict itself.
    bounds = DiffBounds(BoundsParams(), "diff_bounds")
    assert bounds.judge(DiffStat(())) == ["zero changes against HEAD: the upload did not land"]
    assert bounds.judge(DiffStat((FileStat("a.py", 1, 0),))) == []


def test_an_unchanged_file_beside_a_changed_one_is_left_out_of_the_commit(target: Project) -> None:
    target.write("fix/b.py", ORIGINAL_B)
    target.playbook(files=[{"src": "fix/a.py", "dest": "pkg/a.py"}, {"src": "fix/b.py", "dest": "pkg/b.py"}],
                    steps=["upload", {"diff_bounds": {"files": 1}}, {"commit": {"message": "m"}}])
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    assert git(target.repo, "diff", "--name-only", "HEAD~1", "HEAD").split() == ["pkg/a.py"]
    assert "pkg/b.py already up to date" in result.stdout


def test_new_file_is_removed_with_its_new_directories_on_failure(target: Project) -> None:
    target.write("fix/new_mod.py", "NEW = 1\n")
    target.playbook(files=[{"src": "fix/new_mod.py", "dest": "pkg/deep/er/new_mod.py", "create": True}],
                    steps=AFTER_UPLOAD_FAILS)
    target.write_inventory(python=refusing_python(target))
    snapshot = tree_snapshot(target.repo)
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1
    assert not (target.repo / "pkg/deep").exists()
    assert tree_snapshot(target.repo) == snapshot


def test_dirty_target_file_is_refused_before_any_change(target: Project) -> None:
    (target.repo / "pkg/a.py").write_text(ORIGINAL_A + "# hand edit on the box\n")
    target.playbook()
    snapshot = tree_snapshot(target.repo)
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1
    assert "uncommitted changes in pkg/a.py" in result.stderr
    assert "--allow-dirty" in result.stderr
    assert tree_snapshot(target.repo) == snapshot


def test_plan_changes_nothing_and_its_stat_equals_what_apply_commits(target: Project) -> None:
    target.write("fix/new_mod.py", "A = 1\nB = 2\n")
    target.playbook(files=[{"src": "fix/a.py", "dest": "pkg/a.py"},
                           {"src": "fix/new_mod.py", "dest": "pkg/new_mod.py", "create": True}],
                    steps=["local_compile", "upload", "remote_compile",
                           {"diff_bounds": {"files": 2, "insertions": [1, 20]}},
                           {"commit": {"message": "m"}}])
    snapshot = tree_snapshot(target.repo)
    plan = target.deployer("plan", "fix.yaml", "--host", "box", "--verbose")
    assert plan.returncode == 0, plan.stderr
    assert tree_snapshot(target.repo) == snapshot
    assert "-    return 41" in plan.stdout and "+    return 42" in plan.stdout
    assert "bounds: ok" in plan.stdout
    assert "diff --numstat -z --no-renames --diff-algorithm=myers HEAD -- pkg/a.py" in plan.stdout
    projected = re.search(r"^ (\d+ files? changed.*)$", plan.stdout, re.M)
    assert projected is not None

    dry = target.deployer("apply", "--dry-run", "fix.yaml", "--host", "box", "--json")
    assert json.loads(dry.stdout)["stat"] == projected.group(1)
    assert tree_snapshot(target.repo) == snapshot

    applied = target.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stderr
    committed = git(target.repo, "show", "--stat", "--format=", "HEAD").strip().splitlines()[-1].strip()
    assert committed == projected.group(1)


def test_plan_shows_a_failing_bounds_verdict(target: Project) -> None:
    target.playbook(steps=["upload", {"diff_bounds": {"files": 3}}])
    plan = target.deployer("plan", "fix.yaml", "--host", "box")
    assert plan.returncode == 1  # a plan that breaks its bounds fails, so it can gate CI (issue 8.12)
    assert "bounds: FAIL" in plan.stdout and "files 1 outside 3" in plan.stdout


def test_patch_mode_applies_with_git_apply(target: Project) -> None:
    patch = ("--- a/pkg/b.py\n+++ b/pkg/b.py\n@@ -1 +1,2 @@\n-VALUE = 1\n+VALUE = 2\n+OTHER = 3\n")
    target.write("fix/b.diff", patch)
    target.playbook(patch="fix/b.diff", steps=["local_compile", "upload", "remote_compile",
                                               {"diff_bounds": {"files": 1, "insertions": 2, "deletions": 1}},
                                               {"commit": {"message": "patch b"}}])
    plan = target.deployer("plan", "fix.yaml", "--host", "box", "--verbose")
    assert plan.returncode == 0, plan.stderr
    assert "+OTHER = 3" in plan.stdout and "apply --check -" in plan.stdout
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    assert target.file("pkg/b.py") == "VALUE = 2\nOTHER = 3\n"
    assert git(target.repo, "diff", "--name-only", "HEAD~1", "HEAD").split() == ["pkg/b.py"]


def test_patch_that_does_not_apply_is_refused_before_any_change(target: Project) -> None:
    target.write("fix/b.diff", "--- a/pkg/b.py\n+++ b/pkg/b.py\n@@ -1 +1 @@\n-VALUE = 9\n+VALUE = 2\n")
    target.playbook(patch="fix/b.diff", steps=["upload"])
    snapshot = tree_snapshot(target.repo)
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1
    assert "does not apply" in result.stderr
    assert tree_snapshot(target.repo) == snapshot


def test_run_log_chain_verifies_and_detects_edits_removals_and_truncation(target: Project) -> None:
    target.playbook()
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    run = run_dirs(target)[-1]
    assert oct(run.stat().st_mode & 0o777) == "0o700"
    # Files 0600, directories (the pre-run copies in before/) 0700: they hold production source.
    assert all(oct(p.stat().st_mode & 0o777) == ("0o700" if p.is_dir() else "0o600") for p in run.rglob("*"))
    assert any(p.is_file() for p in (run / "before").iterdir())
    ok = target.deployer("runs", "verify", run.name, "--runs-dir", str(target.runs))
    assert ok.returncode == 0, ok.stderr
    events = run / "events.jsonl"
    original = events.read_text()
    lines = original.splitlines(keepends=True)

    events.write_text(original.replace('"status": "successful"', '"status": "failed"'))
    assert target.deployer("runs", "verify", run.name).returncode == 5
    events.write_text("".join(lines[:3] + lines[4:]))
    removed = target.deployer("runs", "verify", run.name)
    assert removed.returncode == 5 and "line 4" in removed.stderr
    events.write_text("".join(lines[:-1]))
    assert target.deployer("runs", "verify", run.name).returncode == 5
    events.write_text(original[:-20])
    assert target.deployer("runs", "verify", run.name).returncode == 5
    events.write_text(original)
    (run / "playbook.yaml").write_text("name: forged\n")
    forged = target.deployer("runs", "verify", run.name)
    assert forged.returncode == 5 and "playbook.yaml" in forged.stderr


def test_runs_list_and_show(target: Project) -> None:
    target.playbook()
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    run_id = run_dirs(target)[-1].name
    listed = target.deployer("runs", "list")
    assert run_id in listed.stdout and "succeeded" in listed.stdout
    before = git(target.repo, "rev-parse", "HEAD~1").strip()
    shown = target.deployer("runs", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert f"run {run_id}  state succeeded  host box" in shown.stdout
    assert f"git: before {before}  after {target.head()}" in shown.stdout
    steps = {line.split()[0]: line.split()[1] for line in shown.stdout.splitlines() if line.startswith("  ")}
    assert steps == {"local_compile": "ok", "upload": "ok", "remote_compile": "ok", "diff_bounds": "ok",
                     "commit": "ok"}
    assert re.search(rf"^  commit +ok +[\d.]+s commit {target.head()[:12]}", shown.stdout, re.M), shown.stdout


def test_json_summary(target: Project) -> None:
    target.playbook()
    result = target.deployer("apply", "fix.yaml", "--host", "box", "--json")
    summary = json.loads(result.stdout)
    assert summary["status"] == "successful" and summary["git"]["after"] == target.head()


@pytest.mark.parametrize(("signum", "to"), [(signal.SIGINT, "process"), (signal.SIGTERM, "process"),
                                           (signal.SIGHUP, "process"), (signal.SIGTERM, "worker thread")])
def test_a_signal_after_upload_restores_the_target_and_exits_130(target: Project, signum: int, to: str) -> None:
    """`worker thread`: the signal goes to a thread that is not the main one (the kernel may hand it to any), while
    the main thread waits for the compile's reply; the stop must come at once, before the commit sent behind it."""
    target.write_inventory(python=target_python(target, "sleep 2"))
    target.playbook()
    head = target.head()
    proc = target.popen("apply", "fix.yaml", "--host", "box")
    deadline = time.monotonic() + 30
    # The upload stages the fix beside its dest; it goes live only once the target's python compiled it.
    while staged_bytes(target.repo, "pkg/a.py") != FIXED_A:
        assert time.monotonic() < deadline, "the upload never landed"
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    signal_one(proc.pid, signum, to_a_worker_thread=to == "worker thread")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert target.file("pkg/a.py") == ORIGINAL_A and staged_bytes(target.repo, "pkg/a.py") is None
    assert target.head() == head
    assert not (target.repo / ".git" / "deployer.run.lock").exists()
    assert last_run_end(target)["status"] == "canceled"
    # Shown as what it was, not as a failure: stopped before its commit, the target as it was.
    run_id = run_dirs(target)[-1].name
    assert f"run {run_id}: canceled (exit 130)" in out, out
    listed = target.deployer("runs", "list")
    assert any(line.split()[:2] == [run_id, "canceled"] for line in listed.stdout.splitlines()), listed.stdout
    events = [json.loads(x) for x in (run_dirs(target)[-1] / "events.jsonl").read_text().splitlines()]
    canceled = [e for e in events if e["type"] == "step_end" and e["status"] == "canceled"]
    started = [e["step"] for e in events if e["type"] == "step_start"]
    assert [e["step"] for e in canceled] == started[-1:]  # logged under the step it stopped, once


def test_hostile_names_reach_the_target_literally(target: Project, tmp_path: Path) -> None:
    # A repo path, a file name and a commit message full of shell syntax: nothing may run.
    marker = "PWNED"
    hostile = f"repo $(touch {marker}) `touch {marker}` 'q' \"d\" ; -x"
    repo = target.repo.parent / hostile
    target.repo.rename(repo)
    target.repo = repo
    target.write_inventory(repo=str(repo))
    dest = f"pkg/-n $(touch {marker}) 'it''s'.py"
    message = f"fix `touch {marker}` $(touch {marker}) \"quoted\"\nsecond line; rm -rf /"
    target.write("fix/odd.py", "ODD = 1\n")
    target.playbook(files=[{"src": "fix/odd.py", "dest": dest, "create": True}],
                    steps=["local_compile", "upload", "remote_compile", {"diff_bounds": {"files": 1}},
                           {"commit": {"message": message}}])
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    assert (repo / dest).read_text() == "ODD = 1\n"
    assert git(repo, "log", "-1", "--format=%B").startswith(message)
    assert git(repo, "diff", "--name-only", "HEAD~1", "HEAD").strip() == dest
    assert not list(tmp_path.rglob(marker)) and not (Path.cwd() / marker).exists()


def test_a_file_that_is_not_a_patch_is_a_config_error(target: Project) -> None:
    target.write("fix/b.diff", "this is not a diff\n")
    target.playbook(patch="fix/b.diff", steps=["upload"])
    result = target.deployer("plan", "fix.yaml", "--host", "box")
    assert result.returncode == 2 and "not a patch git can read" in result.stderr


def test_markup_in_user_text_is_printed_literally(target: Project) -> None:
    target.playbook(name="fix.yaml")
    body = (target.root / "fix.yaml").read_text().replace("name: answer fix", "name: '[bold]fix[/] [/]'")
    body = body.replace("message: 'pkg: answer is 42'", "message: '[disagg] x [/]'")
    assert "[disagg]" in body
    (target.root / "fix.yaml").write_text(body)
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    listed = target.deployer("runs", "list")
    assert listed.returncode == 0 and "[bold]fix[/] [/]" in listed.stdout
    deploys = target.deployer("rollback", "--host", "box", "--list")
    assert deploys.returncode == 0 and "[disagg] x [/]" in deploys.stdout


def test_allow_dirty_restores_the_bytes_and_keeps_the_users_staging(target: Project) -> None:
    (target.repo / "pkg/a.py").write_text(ORIGINAL_A + "# staged by hand\n")
    git(target.repo, "add", "pkg/a.py")
    staged = git(target.repo, "diff", "--cached")
    target.playbook(steps=AFTER_UPLOAD_FAILS)
    target.write_inventory(python=refusing_python(target))
    result = target.deployer("apply", "fix.yaml", "--host", "box", "--allow-dirty")
    assert result.returncode == 1 and COMPILE_REFUSED in result.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A + "# staged by hand\n"
    assert git(target.repo, "diff", "--cached") == staged


def test_shipped_and_restored_files_keep_their_owner(target: Project) -> None:
    # As root (CI and this machine), a file owned by a service user must not become root's.
    if os.geteuid() != 0:
        pytest.skip("only root can give a file to another owner to set this up")
    os.chown(target.repo / "pkg/a.py", 4321, 4321)
    os.chown(target.repo / "pkg/b.py", 4321, 4321)
    target.write("fix/b.py", "VALUE = 2\n")
    target.playbook(files=[{"src": "fix/a.py", "dest": "pkg/a.py"}, {"src": "fix/b.py", "dest": "pkg/b.py"}],
                    steps=["upload", {"diff_bounds": {"files": 2}}, {"commit": {"message": "m"}}])
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    assert (target.repo / "pkg/a.py").stat().st_uid == 4321
    target.write("fix/b.py", "VALUE = 3\n")
    target.playbook(files=[{"src": "fix/b.py", "dest": "pkg/b.py"}], steps=AFTER_UPLOAD_FAILS)
    target.write_inventory(python=refusing_python(target))
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 1  # restored
    assert target.file("pkg/b.py") == "VALUE = 2\n"
    assert (target.repo / "pkg/b.py").stat().st_uid == 4321
