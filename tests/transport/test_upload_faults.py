"""Upload faults produced for real on the target's file system: each test answers mutants of tests/MUTATION.md.

Local target only: the agent's put is the same program whichever transport carries it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from fixtures_repo import (
    AFTER_UPLOAD_FAILS,
    COMPILE_REFUSED,
    FIXED_A,
    ORIGINAL_A,
    Project,
    git,
    refusing_python,
    work_tree,
)

pytestmark = pytest.mark.parametrize("target", ["local"], indirect=True)

# The agent writes a temp file beside the dest: `.deployer-` + 8 random characters + `.tmp`.
TEMP_NAME = len("/.deployer-12345678.tmp")


def deep_dir(root: str, length: int) -> str:
    """A relative directory of ordinary names (each well under NAME_MAX) whose absolute path is length long."""
    parts, total = [], len(root)
    while total < length:
        left = length - total - 1  # after this part's slash
        size = left if left <= 200 else 200 if left - 201 >= 1 else 150  # never leave room for an empty name
        parts.append("d" * size)
        total += 1 + size
    assert total == length, (total, length)
    return "/".join(parts)


def test_a_temp_file_the_dests_directory_cannot_hold_fails_the_upload_as_os_error_and_leaves_the_tree(
        target: Project) -> None:
    limit = os.pathconf(target.repo, "PC_PATH_MAX") - 1  # the longest path the kernel takes, without its NUL
    # The dest's own path fits; the temp file's path beside it is longer than the kernel accepts.
    directory = deep_dir(str(target.repo), limit - TEMP_NAME + 1)
    dest = f"{directory}/a.py"
    assert len(f"{target.repo}/{dest}") <= limit < len(f"{target.repo}/{directory}") + TEMP_NAME
    target.write("fix/deep.py", "DEEP = 1\n")
    files: list[dict[str, Any]] = [{"src": "fix/deep.py", "dest": dest, "create": True}]
    path = target.playbook(files=files, steps=["upload", {"commit": {"message": "m"}}])
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if text == "- upload")
    head, before = target.head(), work_tree(target.repo)
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stderr
    # The upload step's line in the playbook, the op, the error kind and the directory, as the kernel said it.
    assert result.stderr == (f"error: fix.yaml:{line}:3: box: agent refused 'put' (os_error): cannot create a temp "
                             f"file in {target.repo}/{directory}: File name too long\n"), result.stderr
    # The directories made for the new file are gone again, and nothing was committed.
    assert work_tree(target.repo) == before and not (target.repo / directory.split("/")[0]).exists()
    assert target.head() == head and git(target.repo, "status", "--porcelain") == ""


# -- a concurrent writer on the target, at a moment the test controls --------------------------------------
#
# A wrapper for one program on the agent's PATH changes the dests just before the real program runs:
# the same thing another writer on the target would do, but at a known point of the run, never a race.

OTHER_A = "def answer():\n    return 40\n"
OTHER_B = "VALUE = 0\n"


def before_program(project: Project, bindir: Path, program: str, when: str, action: str) -> None:
    """Put `program` on the agent's PATH: in the target repo, when its arguments match the shell pattern
    `when`, it first runs the shell `action` (another writer, at a point the test chooses), then the real one."""
    bindir.mkdir(exist_ok=True)
    real = shutil.which(program)
    wrapper = bindir / program
    wrapper.write_text(f'#!/bin/sh\nif [ "$(pwd -P)" = "{os.path.realpath(project.repo)}" ]; then\n'
                       f'  case " $* " in {when}) {action};; esac\nfi\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    project.extra_env["PATH"] = f"{bindir}:{os.environ['PATH']}"


def writer_before(project: Project, bindir: Path, program: str, when: str) -> None:
    """before_program that overwrites pkg/a.py and pkg/b.py with other bytes."""
    before_program(project, bindir, program, when, f'printf "{OTHER_A}" > pkg/a.py; printf "{OTHER_B}" > pkg/b.py')


def patch_playbook(project: Project) -> Path:
    (project.repo / "pkg/a.py").write_text(FIXED_A)
    patch = git(project.repo, "diff", "--", "pkg/a.py")
    git(project.repo, "checkout", "-q", "--", "pkg/a.py")
    project.write("fix.diff", patch)
    return project.playbook(patch="fix.diff", steps=["upload", {"commit": {"message": "m"}}])


@pytest.mark.parametrize(("when", "failure"), [
    ("*' apply --check '*", "the patch does not apply to the target's tree"),  # after preflight, before the check
    ("*' apply - '*", "git apply failed"),  # after the target's check, before git apply
], ids=["before_the_targets_check", "before_git_apply"])
def test_a_file_changed_after_the_patch_was_checked_fails_the_upload_and_gets_its_pre_run_bytes_back(
        target: Project, tmp_path: Path, when: str, failure: str) -> None:
    path = patch_playbook(target)
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if text == "- upload")
    head = target.head()
    writer_before(target, tmp_path / "bin", "git", when)
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stderr
    assert f"error: fix.yaml:{line}:3: step 'upload' failed: {failure}\n" in result.stderr, result.stderr
    assert "patch does not apply" in result.stderr  # git's own words, in the stderr tail
    # The restore puts back the bytes the run found (the writer's edit came after it read them).
    assert target.file("pkg/a.py") == ORIGINAL_A and target.head() == head


def test_a_file_changed_while_the_restore_runs_is_reported_not_called_restored(
        target: Project, tmp_path: Path) -> None:
    target.write("fix/b.py", "VALUE = 2\n")
    target.playbook(files=[{"src": "fix/a.py", "dest": "pkg/a.py"}, {"src": "fix/b.py", "dest": "pkg/b.py"}],
                    steps=AFTER_UPLOAD_FAILS)
    python = refusing_python(target)
    target.write_inventory(python=python)
    # The restore looks for the upload's temp files (find) after writing the pre-run bytes back, and reads
    # every file back after that: the writer strikes in between.
    writer_before(target, tmp_path / "bin", "find", "*' -name '*")
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 6, result.stderr
    run_id = sorted(target.runs.iterdir())[-1].name
    # The failure that started the restore comes first, then what the restore left and how to finish it.
    assert result.stderr.startswith(f"error: fix.yaml:9:3: step 'remote_compile' failed: the target's {python} "
                                    "cannot compile the shipped files; none of them was installed\n"), result.stderr
    assert result.stderr.endswith(
        "\nThe restore after it failed: after the restore, pkg/a.py, pkg/b.py still differ from their pre-run bytes "
        f"(did something else write them meanwhile?). Finish it with: deployer recover {run_id}\n"), result.stderr
    assert COMPILE_REFUSED in result.stderr
    assert target.file("pkg/a.py") == OTHER_A and target.file("pkg/b.py") == OTHER_B


def test_a_dests_directory_removed_during_the_restore_is_made_again_with_the_pre_run_bytes(
        target: Project, tmp_path: Path) -> None:
    (target.repo / "pkg" / "sub").mkdir()
    (target.repo / "pkg" / "sub" / "c.py").write_text("C = 1\n")
    git(target.repo, "add", "pkg/sub/c.py")
    git(target.repo, "commit", "-q", "-m", "sub")
    target.write("fix/c.py", "C = 2\n")
    target.playbook(files=[{"src": "fix/c.py", "dest": "pkg/sub/c.py"}], steps=AFTER_UPLOAD_FAILS)
    target.write_inventory(python=refusing_python(target))
    # The restore lists the index (ls-files -s) right before it writes the pre-run bytes back: the directory
    # goes away then.
    before_program(target, tmp_path / "bin", "git", "*' ls-files -s '*", "rm -rf pkg/sub")
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stderr
    assert "step 'remote_compile' failed" in result.stderr and COMPILE_REFUSED in result.stderr
    assert target.file("pkg/sub/c.py") == "C = 1\n"
    assert git(target.repo, "status", "--porcelain") == ""
