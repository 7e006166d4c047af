"""diff_bounds and commit over the in-memory agent: bounds refuse a diff outside them, and a commit's run
sends exactly the actions its plan shows."""

from __future__ import annotations

import pytest
from fixtures_memory import MemoryTarget
from fixtures_repo import FIXED_A, ORIGINAL_B, git

from deployer.errors import StepFailed
from deployer.steps.context import Context
from deployer.steps.git import LOG_SHA256, RUN_ID, BoundsParams, Commit, CommitParams, DiffBounds
from deployer.steps.upload import Upload, UploadParams

NEW_C = b"C = 3\n"


def shipped(memory_target: MemoryTarget, files: dict[str, bytes]) -> Context:
    ctx = memory_target.context(files)
    Upload(UploadParams(), "upload").run(ctx)
    return ctx


def bounds(**limits: object) -> DiffBounds:
    return DiffBounds(BoundsParams.model_validate(limits), "diff_bounds")


def test_diff_bounds_passes_a_diff_inside_them_and_counts_it_on_the_target(memory_target: MemoryTarget) -> None:
    ctx = shipped(memory_target, {"pkg/a.py": FIXED_A.encode(), "pkg/c.py": NEW_C})
    step = bounds(files=2, insertions=[5, 6], deletions=[1, 1])
    assert [a.key for a in step.plan(ctx)] == ["numstat", "numstat:pkg/c.py"]
    assert step.run(ctx) == ctx.facts.diffstat
    [stat] = memory_target.of("diffstat")
    assert (len(stat["files"]), stat["insertions"], stat["deletions"]) == (2, 6, 1)


@pytest.mark.parametrize(("limits", "refusal"), [
    ({"insertions": [0, 4]}, "insertions 5 outside [0, 4]"),
    ({"files": 2}, "files 1 outside 2"),
    ({"deletions": 0}, "deletions 1 outside 0"),
])
def test_diff_bounds_refuses_a_diff_over_its_bounds(memory_target: MemoryTarget, limits: dict[str, object],
                                                     refusal: str) -> None:
    ctx = shipped(memory_target, {"pkg/a.py": FIXED_A.encode()})
    ctx.bus.step = "diff_bounds"
    with pytest.raises(StepFailed) as refused:
        bounds(**limits).run(ctx)
    assert refusal in str(refused.value)


def test_diff_bounds_says_the_upload_did_not_land_when_the_target_has_no_change(memory_target: MemoryTarget) -> None:
    ctx = memory_target.context({"pkg/a.py": FIXED_A.encode()})  # planned, never uploaded
    with pytest.raises(StepFailed, match="zero changes against HEAD: the upload did not land"):
        bounds(files=1).run(ctx)


def test_diff_bounds_judged_here_agrees_with_the_count_on_the_target(memory_target: MemoryTarget) -> None:
    from deployer.run.preflight import projected_stat

    ctx = memory_target.context({"pkg/a.py": FIXED_A.encode()})
    step = bounds(insertions=[0, 4])
    head: dict[str, bytes | None] = {"pkg/a.py": (memory_target.repo / "pkg/a.py").read_bytes()}
    assert step.judge_here(ctx, lambda: projected_stat(ctx, head)) == ["insertions 5 outside [0, 4]"]


def committed(memory_target: MemoryTarget, files: dict[str, bytes]) -> tuple[Context, Commit, list[str]]:
    ctx = shipped(memory_target, files)
    ctx.facts.log_sha256 = "ab" * 32
    step = Commit(CommitParams(message="pkg: answer is 42"), "commit")
    planned = [a.key for a in step.plan(ctx)]
    ctx.bus.step = "commit"
    step.run(ctx)
    return ctx, step, planned


def test_commit_runs_exactly_its_plan_and_commits_exactly_the_shipped_files(memory_target: MemoryTarget) -> None:
    before = git(memory_target.repo, "rev-parse", "HEAD").strip()
    (memory_target.repo / "stray.txt").write_text("not ours\n")  # untracked: never swept into the commit
    ctx, step, planned = committed(memory_target, {"pkg/a.py": FIXED_A.encode(), "pkg/c.py": NEW_C})
    assert planned == ["add", "commit", "head", "files"]
    ran = memory_target.of("command", lambda e: e.get("action") in planned)
    assert [e["action"] for e in ran] == planned
    shown = {a.key: a for a in step.plan(ctx)}
    bound = {RUN_ID: ctx.run_id, LOG_SHA256: "ab" * 32}
    assert [e["command"] for e in ran] == [ctx.shown_action(shown[key], bound) for key in planned]
    head = git(memory_target.repo, "rev-parse", "HEAD").strip()
    assert ctx.git_after == head and git(memory_target.repo, "rev-parse", "HEAD~1").strip() == before
    assert git(memory_target.repo, "show", "--name-only", "--format=", "HEAD").split() == ["pkg/a.py", "pkg/c.py"]
    message = git(memory_target.repo, "log", "-1", "--format=%B")
    assert f"Deployer-Run: {ctx.run_id}" in message and f"Deployer-Log: sha256:{'ab' * 32}" in message
    assert git(memory_target.repo, "status", "--porcelain") == "?? stray.txt\n"


def test_commit_leaves_out_a_shipped_file_head_already_has(memory_target: MemoryTarget) -> None:
    ctx, _, _ = committed(memory_target, {"pkg/a.py": FIXED_A.encode(), "pkg/b.py": ORIGINAL_B.encode()})
    assert ctx.facts.unchanged == ["pkg/b.py"] and ctx.facts.files == ["pkg/a.py"]
    assert git(memory_target.repo, "show", "--name-only", "--format=", "HEAD").split() == ["pkg/a.py"]


def test_commit_of_nothing_new_fails_as_its_plan_says(memory_target: MemoryTarget) -> None:
    ctx = memory_target.context({"pkg/b.py": ORIGINAL_B.encode()})
    step = Commit(CommitParams(message="m"), "commit")
    [planned] = step.plan(ctx)
    assert "nothing to commit" in planned.what
    head = git(memory_target.repo, "rev-parse", "HEAD")
    with pytest.raises(StepFailed, match=r"nothing to commit: the target already has these bytes in pkg/b\.py"):
        step.run(ctx)
    assert git(memory_target.repo, "rev-parse", "HEAD") == head
