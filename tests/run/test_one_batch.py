"""After preflight, the chain up to the commit goes as one batch whose order the agent enforces on the target:
the intent record, the changes, the checks, and the commit behind all of them (and the release behind it)."""

from __future__ import annotations

import json

from fixtures_repo import FIXED_A, ORIGINAL_A, Project, git

pytest_plugins = ["fixtures_repo"]


def types_in_order(project: Project) -> list[tuple[str, str | None]]:
    return [(e["type"], e.get("step")) for e in project.events()]


def test_the_commit_is_sent_with_the_changes_behind_every_check_and_recorded_here_before_it_goes(
        target: Project) -> None:
    target.playbook()  # local_compile, upload, remote_compile, diff_bounds, commit
    before = target.head()
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    assert target.file("pkg/a.py") == FIXED_A and git(target.repo, "rev-parse", "HEAD~1").strip() == before
    state = json.loads((target.runs / target.newest_run() / "state.json").read_text())
    assert state["sent_ahead"] == ["upload", "remote_compile", "diff_bounds", "commit"]
    order = types_in_order(target)
    # Sent with the lock, before any answer was read (the lock's included) ...
    sent = order.index(("sent_ahead", "preflight"))
    assert sent < order.index(("sent_whole", "preflight")) < order.index(("lock_acquired", "preflight"))
    assert order.index(("lock_acquired", "preflight")) < order.index(("commit", "commit"))
    ahead = next(e for e in target.events() if e["type"] == "sent_ahead")
    # ... behind the intent record (the premise), the staged file, the compile (which installs) and the count.
    assert ahead["steps"] == ["commit"] and ahead["behind"] == 4
    # ... and the release went behind the commit: no round trip of its own after it.
    assert order.index(("lock_released", "commit")) > order.index(("commit", "commit"))


def test_a_target_that_counts_the_diff_otherwise_judges_the_bounds_by_its_own_count_in_the_same_batch(
        target: Project) -> None:
    # The target's git treats *.py as binary (its own attributes): its count differs from the one made here;
    # the agent judges the bounds by the target's own count, which passes, so the commit sent behind it runs.
    (target.repo / ".git" / "info").mkdir(exist_ok=True)
    (target.repo / ".git" / "info" / "attributes").write_text("*.py binary\n")
    target.playbook(steps=["upload", "remote_compile", {"diff_bounds": {"files": 1}},
                           {"commit": {"message": "pkg: answer is 42"}}])
    before = target.head()
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    assert target.file("pkg/a.py") == FIXED_A and git(target.repo, "rev-parse", "HEAD~1").strip() == before
    order = types_in_order(target)
    assert ("sent_ahead", "preflight") in order and ("sent_whole", "preflight") in order
    assert [e["files"] for e in target.events() if e["type"] == "diffstat"] == [
        [{"path": "pkg/a.py", "insertions": 0, "deletions": 0, "binary": True}]]
    assert [e["files"] for e in target.events() if e["type"] == "commit"] == [["pkg/a.py"]]


def test_a_count_outside_the_bounds_on_the_target_lets_no_commit_through(target: Project) -> None:
    # Judged here, the projection passes; the target's own count (binary: no insertions) does not.
    (target.repo / ".git" / "info").mkdir(exist_ok=True)
    (target.repo / ".git" / "info" / "attributes").write_text("*.py binary\n")
    target.playbook(steps=["upload", {"diff_bounds": {"files": 1, "insertions": [1, 10]}},
                           {"commit": {"message": "pkg: answer is 42"}}])
    before = target.head()
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stderr
    assert "insertions 0 outside [1, 10]" in result.stderr
    assert target.head() == before and target.file("pkg/a.py") == ORIGINAL_A
    assert not [e for e in target.events() if e["type"] == "commit"]
