"""The end of a run log is anchored on the target: a note on the run's newest commit (refs/notes/deployer) holds
the sha256 of the log when the release was sent and the end that release proves. A log re-chained after its
commit (run_end flipped, every hash recomputed) is caught by `runs verify --target` and refused by rollback."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from fixtures_repo import Project, git
from test_safety_git import rechain, refused_on_target, run_end

# The default playbook ends with its commit (the release rides behind the commit's batch); the other has a step
# after the commit, so the release (and the note) go in the run's last round trip of their own.
COMMIT_LAST = None
STEP_AFTER = ["local_compile", "upload", {"diff_bounds": {"files": 1}}, {"commit": {"message": "m"}},
              "remote_compile"]


def note(project: Project, commit: str = "HEAD") -> str:
    return git(project.repo, "notes", "--ref", "deployer", "show", commit)


def flip(events: list[dict[str, Any]]) -> None:
    end = run_end(events)
    end.update(status="failed", exit_code=5, phase="failed_committed", error="drain did not reach 0")


@pytest.mark.parametrize("steps", [COMMIT_LAST, STEP_AFTER], ids=["commit-last", "step-after-commit"])
def test_a_genuine_run_writes_its_end_note_and_verifies_on_the_target(target: Project, steps: Any) -> None:
    run_id = target.applied(steps=steps)
    end = run_end(target.events(run_id))
    assert end["anchor"] == "notes"
    assert note(target).startswith("deployer-end sha256:") and "status=successful exit_code=0 phase=succeeded" in \
        note(target)
    checked = target.deployer("runs", "verify", run_id, "--target")
    assert checked.returncode == 0, checked.stderr
    assert "notice:" not in checked.stderr


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_runs_verify_target_says_what_the_target_vouched_for_and_without_it_that_it_was_not_asked(
        target: Project) -> None:
    run_id = target.applied()
    commit = target.head()
    target.sealed()
    before = git(target.repo, "rev-parse", "HEAD~1").strip()
    alone = target.deployer("runs", "verify", run_id)
    assert alone.returncode == 0, alone.stderr
    assert "--target also checks it against the target" in alone.stdout and "vouches" not in alone.stdout
    checked = target.deployer("runs", "verify", run_id, "--target")
    assert checked.returncode == 0, checked.stderr
    lines = checked.stdout.splitlines()
    assert lines[1] == "on box, the target vouches for it:", checked.stdout
    said = "\n".join(lines[2:])
    assert re.search(rf"commit {commit[:12]}: its Deployer-Log matches the log's first \d+ lines", said), said
    assert f"commit {commit[:12]} is the log's: parent {before[:12]}, files pkg/a.py" in said
    assert f"the end note on {commit[:12]}: the run ended successful (exit 0, phase succeeded)" in said
    assert f"the seal on {commit[:12]}: every line through the run_end" in said
    as_json = json.loads(target.deployer("runs", "verify", run_id, "--target", "--json").stdout)
    assert as_json["exit_code"] == 0 and len(as_json["on_target"]["box"]) == 4


@pytest.mark.parametrize("steps", [COMMIT_LAST, STEP_AFTER], ids=["commit-last", "step-after-commit"])
def test_a_run_end_flipped_and_rechained_after_the_commit_is_caught_and_rollback_refuses_it(
        target: Project, steps: Any) -> None:
    run_id = target.applied(steps=steps)
    head = target.head()
    rechain(target, run_id, flip)
    checked = refused_on_target(target, run_id, head, "end note")
    assert f"says run {run_id} ended successful (exit 0, phase succeeded)" in checked
    assert "but this log ends failed (exit 5, phase failed_committed)" in checked


@pytest.mark.parametrize("tamper", ["edited", "removed", "garbled"])
def test_an_end_note_edited_or_removed_on_the_target_is_caught(target: Project, tamper: str) -> None:
    run_id = target.applied()
    if tamper == "removed":
        git(target.repo, "notes", "--ref", "deployer", "remove", "HEAD")
        said = "has no end note (refs/notes/deployer), but the log says its run wrote one"
    else:
        text = re.sub(r"sha256:.", lambda m: "sha256:" + ("1" if m[0][-1] != "1" else "2"), note(target)) \
            if tamper == "edited" else "ok\x1b]0;pwned\x07\n"
        git(target.repo, "notes", "--ref", "deployer", "add", "-f", "-m", text, "HEAD")
        said = "has no such beginning" if tamper == "edited" else r"is not deployer's: 'ok\x1b]0;pwned\x07"
    checked = target.deployer("runs", "verify", run_id, "--target")
    assert checked.returncode == 5, checked.stderr
    assert said in checked.stderr
    assert "\x1b" not in checked.stderr


def test_a_run_from_before_end_notes_verifies_with_a_notice(target: Project) -> None:
    # An older deployer wrote no note and no anchor field: made by hand from a genuine run.
    run_id = target.applied()
    git(target.repo, "notes", "--ref", "deployer", "remove", "HEAD")

    def older(events: list[dict[str, Any]]) -> None:
        del run_end(events)["anchor"]
    rechain(target, run_id, older)
    checked = target.deployer("runs", "verify", run_id, "--target")
    assert checked.returncode == 0, checked.stderr
    assert f"notice: the end of run {run_id}'s log is not anchored on the target" in checked.stderr


def test_a_rollback_writes_the_end_note_of_its_own_commit(target: Project) -> None:
    run_id = target.applied()
    forward = target.head()
    rolled = target.deployer("rollback", run_id)
    assert rolled.returncode == 0, rolled.stderr
    assert target.head() != forward and "status=successful" in note(target)
    rollback_id = target.newest_run()
    checked = target.deployer("runs", "verify", rollback_id, "--target")
    assert checked.returncode == 0 and "notice:" not in checked.stderr, checked.stderr
    assert target.deployer("runs", "verify", run_id, "--target").returncode == 0  # its own note, untouched


def drop(kind: str) -> Callable[[list[dict[str, Any]]], None]:
    def edit(events: list[dict[str, Any]]) -> None:
        events.remove(next(e for e in events if e["type"] == kind))
        for seq, event in enumerate(events):
            event["seq"] = seq
    return edit


def fail_the_compile(events: list[dict[str, Any]]) -> None:
    next(e for e in events if e["type"] == "command" and e.get("step") == "remote_compile")["exit_code"] = 1


def insert_a_sample(events: list[dict[str, Any]]) -> None:
    at = events.index(run_end(events))
    events.insert(at, {**events[at - 1], "type": "sample", "value": 0.0})
    for seq, event in enumerate(events):
        event["seq"] = seq


# One transport: the note and the seal that catch a rewrite are read by the same agent over either (both write
# them in the tests above); six rewrites over ssh too would only run that path again.
@pytest.mark.parametrize("target", ["local"], indirect=True)
@pytest.mark.parametrize("steps", [COMMIT_LAST, STEP_AFTER], ids=["commit-last", "step-after-commit"])
@pytest.mark.parametrize("tamper", [drop("uploaded"), fail_the_compile, insert_a_sample],
                         ids=["deleted", "edited", "inserted"])
def test_a_line_deleted_edited_or_inserted_anywhere_before_run_end_and_rechained_fails_on_the_target(
        target: Project, steps: Any, tamper: Callable[[list[dict[str, Any]]], None]) -> None:
    run_id = target.applied(steps=steps)
    assert target.sealed().startswith("deployer-seal sha256:")
    rechain(target, run_id, tamper)
    # Before its end note's beginning, the note catches it; after it, the seal.
    refused_on_target(target, run_id, target.head(), "the log was rewritten after")

