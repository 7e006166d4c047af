"""Each run state has one meaning (the docs' table): refusals are no part of the history but with `runs list
--all`, a step that failed before the target changed is `failed` (nothing was restored), every commit a run made is
shown, and `rollback last` rolls back the newest run that left a commit (issue 34, item 2)."""

from __future__ import annotations

import json
import shutil

from fixtures_repo import ORIGINAL_A, Project, hold_lock


def rows(project: Project, *args: str) -> dict[str, list[str]]:
    shown = project.deployer("runs", "list", *args)
    assert shown.returncode == 0, shown.stderr
    return {line.split()[0]: line.split()[1:] for line in shown.stdout.splitlines()[1:] if line.strip()}


def refused(project: Project) -> str:
    """An apply refused by a held lock; the lock is gone after."""
    lock = hold_lock(project)
    assert project.deployer("apply", "fix.yaml", "--host", "box").returncode == 3
    shutil.rmtree(lock)
    return project.newest_run()


def test_runs_list_leaves_refused_runs_out_unless_asked_with_all_or_their_state(target: Project) -> None:
    applied = target.applied()
    locked_out = refused(target)

    assert list(rows(target)) == [applied]
    assert [r["run_id"] for r in json.loads(target.deployer("runs", "list", "--json").stdout)["runs"]] == [applied]
    assert {run: row[0] for run, row in rows(target, "--all").items()} == {applied: "succeeded",
                                                                          locked_out: "refused"}
    assert list(rows(target, "--state", "refused")) == [locked_out]
    assert list(rows(target, "--all", "--last", "1")) == [locked_out]


def test_runs_list_shows_every_commit_a_run_made_a_rollbacks_revert_included(target: Project) -> None:
    applied = target.applied()
    fix = target.head()
    assert target.deployer("rollback", applied).returncode == 0
    rollback, revert = target.newest_run(), target.head()

    shown = rows(target)
    assert shown[applied][:3] == ["succeeded", "box", fix[:12]]
    assert shown[rollback][:3] == ["rolled_back", "box", revert[:12]], shown
    listed = {r["run_id"]: r["commits"] for r in json.loads(target.deployer("runs", "list", "--json").stdout)["runs"]}
    assert listed == {applied: [fix], rollback: [revert]}


def test_a_step_failing_before_the_target_changed_is_failed_and_one_after_the_upload_failed_restored(
        target: Project) -> None:
    target.write("fix/a.py", "def answer(:\n")  # local_compile fails here; remote_compile there, after the upload
    target.playbook()
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 1
    compiled_here = target.newest_run()
    target.playbook(steps=["upload", "remote_compile"])
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 1
    compiled_there = target.newest_run()

    assert {run: row[0] for run, row in rows(target).items()} == {compiled_here: "failed",
                                                                 compiled_there: "failed_restored"}
    assert list(rows(target, "--state", "failed")) == [compiled_here]
    assert target.file("pkg/a.py") == ORIGINAL_A


def test_rollback_last_rolls_back_the_newest_run_that_left_a_commit_and_names_the_newer_ones_passed_over(
        target: Project) -> None:
    applied = target.applied()
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    unchanged = target.newest_run()
    locked_out = refused(target)

    rolled = target.deployer("rollback", "last")
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert target.events()[0]["rollback_of"] == applied and target.file("pkg/a.py") == ORIGINAL_A
    notice = " ".join(rolled.stderr.split())
    assert (f"notice: last: run {applied}, the newest that left a commit to roll back; passed over "
            f"{locked_out} (apply, refused), {unchanged} (apply, unchanged)") in notice, rolled.stderr

    again = target.deployer("rollback", "last")  # the rollback, and a run it already rolled back: nothing left
    assert again.returncode == 2 and f"no run in {target.runs} left a commit to roll back" in again.stderr, \
        again.stderr
