"""Upload faults produced for real on the target's file system: each test answers mutants of tests/MUTATION.md.

Local target only: the agent's put is the same program whichever transport carries it.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from fixtures_repo import Project, git, work_tree

pytestmark = pytest.mark.parametrize("target", ["local"], indirect=True)

# The agent writes a temp file beside the dest: `.deployer-` + 8 random characters + `.tmp`.
TEMP_NAME = len("/.deployer-12345678.tmp")


def deep_dir(root: str, length: int) -> str:
    """A relative directory of ordinary names (each well under NAME_MAX) whose absolute path is length long."""
    parts, total = [], len(root)
    while total < length:
        part = "d" * min(200, length - total - 1)
        parts.append(part)
        total += 1 + len(part)
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
