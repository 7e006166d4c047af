"""upload's plan and run over the in-memory agent: it puts exactly the files it planned, and nothing else."""

from __future__ import annotations

import subprocess

import pytest
from fixtures_memory import MemoryTarget
from fixtures_repo import FIXED_A, ORIGINAL_B, git, tree_snapshot

from deployer.errors import StepFailed
from deployer.steps.upload import Upload, UploadParams

NEW_C = b"def c():\n    return 'c'\n"


def upload() -> Upload:
    return Upload(UploadParams(timeout_s=30), "upload")


def test_upload_writes_exactly_the_planned_files_and_each_as_planned(memory_target: MemoryTarget) -> None:
    files = {"pkg/a.py": FIXED_A.encode(), "pkg/new/c.py": NEW_C}
    ctx = memory_target.context(files)
    step = upload()
    planned = step.plan(ctx)
    assert [a.key for a in planned] == ["write:pkg/a.py", "write:pkg/new/c.py"]
    before = tree_snapshot(memory_target.repo)
    assert step.run(ctx) == "2 file(s) on the target"
    after = tree_snapshot(memory_target.repo)
    changed = {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}
    # Git's own files do not move on a put: the work tree's changed files are the plan's, byte for byte.
    assert changed == {"pkg/a.py", "pkg/new/c.py"}
    for dest, data in files.items():
        assert (memory_target.repo / dest).read_bytes() == data
    uploaded = memory_target.of("uploaded")
    assert [(e["action"], e["path"], e["size"]) for e in uploaded] == [
        (a.key, a.target, len(files[a.key.removeprefix("write:")])) for a in planned]


def test_a_put_keeps_the_replaced_files_mode(memory_target: MemoryTarget) -> None:
    (memory_target.repo / "pkg/b.py").chmod(0o640)
    ctx = memory_target.context({"pkg/b.py": b"VALUE = 2\n"})
    upload().run(ctx)
    assert (memory_target.repo / "pkg/b.py").stat().st_mode & 0o777 == 0o640


def patch_of(memory_target: MemoryTarget, dest: str, new: str) -> bytes:
    """The diff git makes for dest's new content, the tree left as it was."""
    path = memory_target.repo / dest
    old = path.read_text()
    path.write_text(new)
    diff = git(memory_target.repo, "diff", "--", dest).encode()
    path.write_text(old)
    return diff


def test_a_patch_is_checked_applied_and_read_back_as_planned(memory_target: MemoryTarget) -> None:
    patch = patch_of(memory_target, "pkg/a.py", FIXED_A)
    ctx = memory_target.context(patch=patch)
    step = upload()
    planned = step.plan(ctx)
    assert [a.key for a in planned] == ["apply_check", "apply", "verify:pkg/a.py"]
    step.run(ctx)
    assert (memory_target.repo / "pkg/a.py").read_text() == FIXED_A
    assert (memory_target.repo / "pkg/b.py").read_text() == ORIGINAL_B
    ran = [e["action"] for e in memory_target.events if e.get("action") in {a.key for a in planned}]
    assert ran == ["apply_check", "apply", "verify:pkg/a.py"]


def test_a_patch_that_no_longer_applies_is_refused_before_git_apply_writes(memory_target: MemoryTarget) -> None:
    patch = patch_of(memory_target, "pkg/a.py", FIXED_A)
    ctx = memory_target.context(patch=patch)
    # The target moved on between the plan and the run: the check refuses, nothing is written.
    (memory_target.repo / "pkg/a.py").write_text("def answer():\n    return 7\n")
    subprocess.run(["git", "-C", str(memory_target.repo), "commit", "-qam", "moved on"], check=True)
    before = tree_snapshot(memory_target.repo)
    ctx.bus.step = "upload"
    with pytest.raises(StepFailed, match="the patch does not apply to the target's tree"):
        upload().run(ctx)
    assert tree_snapshot(memory_target.repo) == before
    assert [e["action"] for e in memory_target.of("command") if e.get("action")] == ["apply_check"]
