"""local_compile and remote_compile over the in-memory agent: a broken file is refused, and said where."""

from __future__ import annotations

import sys

import pytest
from fixtures_memory import MemoryTarget
from fixtures_repo import FIXED_A, tree_snapshot

from deployer.errors import StepFailed
from deployer.steps.compile import LocalCompile, RemoteCompile, RemoteCompileParams
from deployer.steps.context import Context
from deployer.steps.upload import Upload, UploadParams

BROKEN = b"def answer(:\n    return 42\n"


def test_local_compile_refuses_a_broken_file_naming_its_line_before_the_target_is_touched(
        memory_target: MemoryTarget) -> None:
    ctx = memory_target.context({"pkg/a.py": BROKEN, "pkg/b.py": b"VALUE = 2\n"})
    step = LocalCompile(LocalCompile.Params(), "local_compile")
    assert [a.key for a in step.plan(ctx)] == ["compile:pkg/a.py", "compile:pkg/b.py"]
    where = memory_target.root / "a.py"  # the playbook's src, beside it
    assert step.judge_here(ctx, lambda: pytest.fail("compile needs no diff")) == [
        f"{where}:1:12: invalid syntax (shipped as pkg/a.py)"]
    before, sent = tree_snapshot(memory_target.repo), len(memory_target.events)
    with pytest.raises(StepFailed) as refused:
        step.run(ctx)
    said = str(refused.value)
    assert f"{where}:1:12: invalid syntax (shipped as pkg/a.py); nothing on the target was changed" in said
    assert tree_snapshot(memory_target.repo) == before
    assert memory_target.events[sent:] == []  # not even a command: it all happened here


def test_local_compile_passes_good_files_and_logs_each(memory_target: MemoryTarget) -> None:
    ctx = memory_target.context({"pkg/a.py": FIXED_A.encode(), "README": b"not python\n"})
    step = LocalCompile(LocalCompile.Params(), "local_compile")
    assert step.run(ctx) == "1 file(s) compile here"
    assert [e["action"] for e in memory_target.of("local")] == ["compile:pkg/a.py"]


def shipped(memory_target: MemoryTarget, files: dict[str, bytes]) -> Context:
    ctx = memory_target.context(files)
    Upload(UploadParams(), "upload").run(ctx)
    return ctx


def test_remote_compile_refuses_a_broken_file_with_the_targets_own_error(memory_target: MemoryTarget) -> None:
    ctx = shipped(memory_target, {"pkg/a.py": BROKEN, "README": b"not python\n"})
    step = RemoteCompile(RemoteCompileParams(timeout_s=30), "remote_compile")
    [planned] = step.plan(ctx)
    assert planned.argv[:3] == (sys.executable, "-I", "-S") and planned.argv[-1:] == ("pkg/a.py",)
    ctx.bus.step = "remote_compile"
    with pytest.raises(StepFailed) as refused:
        step.run(ctx)
    said = str(refused.value)
    assert f"the target's {sys.executable} cannot compile the shipped files" in said and "SyntaxError" in said
    [ran] = memory_target.of("command", lambda e: e.get("action") == "compile")
    assert ran["exit_code"] == 1


def test_remote_compile_passes_what_compiles_there(memory_target: MemoryTarget) -> None:
    ctx = shipped(memory_target, {"pkg/a.py": FIXED_A.encode()})
    step = RemoteCompile(RemoteCompileParams(timeout_s=30), "remote_compile")
    assert step.run(ctx) == f"1 file(s) compile under {sys.executable}"
    assert not list(memory_target.repo.rglob("*.pyc"))  # compiled, never written into the target's tree
