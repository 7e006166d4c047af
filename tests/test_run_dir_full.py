"""Local disk trouble never strands the target: a run log that stops growing mid-run (the kernel refuses the
write with EFBIG under a file-size limit on deployer, as a full disk refuses it with ENOSPC) stops the run
at its next safe point; the target gets its pre-run bytes back and the run exits 1 saying why, never with a
traceback. Over SSH, so the limit applies to deployer and not to the agent on the target."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fixtures_repo import ORIGINAL_A, Project, git, work_tree

pytest_plugins = ["fixtures_repo", "fixtures_ssh"]

LIMITED = """
import resource, runpy, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
sys.argv = ["deployer", *sys.argv[2:]]
runpy.run_module("deployer", run_name="__main__", alter_sys=True)
"""


def log_size_after_upload(project: Project) -> int:
    """Where a normal run's log stands once its upload is done (measured on a run of the same playbook)."""
    done = project.deployer("apply", "fix.yaml", "--host", "box")
    assert done.returncode == 0, done.stderr
    [run] = [p for p in project.runs.iterdir() if (p / "events.jsonl").is_file()]
    size = 0
    for line in (run / "events.jsonl").read_bytes().splitlines(keepends=True):
        size += len(line)
        if json.loads(line)["type"] == "uploaded":
            return size
    raise AssertionError("the run uploaded nothing")


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_run_log_that_cannot_grow_stops_the_run_restores_the_target_and_exits_1(target: Project) -> None:
    target.playbook()
    base, before = target.head(), work_tree(target.repo)
    limit = log_size_after_upload(target) + 16  # the next event no longer fits: the upload has landed
    git(target.repo, "reset", "-q", "--hard", base)
    env = {**os.environ, "DEPLOYER_INVENTORY": str(target.inventory), "DEPLOYER_RUNS_DIR": str(target.runs),
           "NO_COLOR": "1"}
    result = subprocess.run([sys.executable, "-c", LIMITED, str(limit), "apply", "fix.yaml", "--host", "box"],
                            cwd=target.root, env=env, capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "could not be written" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert target.head() == base and target.file("pkg/a.py") == ORIGINAL_A and work_tree(target.repo) == before
    assert git(target.repo, "status", "--porcelain") == ""
    assert not (target.repo / ".git" / "deployer.lock").exists()
    assert not (target.repo / ".git" / "deployer" / "inflight.json").exists()
    run = max(p for p in target.runs.iterdir() if (p / "state.json").is_file())
    assert json.loads((run / "state.json").read_text())["phase"] == "failed_restored"
    # The log ends with its last whole event: no torn line.
    assert (run / "events.jsonl").read_bytes().endswith(b"\n")
