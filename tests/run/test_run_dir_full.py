"""Local disk trouble never strands the target: a run log that stops growing mid-run (the kernel refuses the
write with EFBIG under a file-size limit on deployer, as a full disk refuses it with ENOSPC) stops the run
at its next safe point; the target gets its pre-run bytes back and the run exits 1 saying why, never with a
traceback. Over SSH, so the limit applies to deployer and not to the agent on the target.

A runs dir that is really full (a small tmpfs, filled while the run waits at a gate on the target) still takes
the run's end: room for it is kept from the run's start (a file in the run dir, given back right before the end
is written). The target is made consistent, its intent record and lock cleared, the record and the log's end say
what it holds, and the log says that events are missing. A run whose end finds no room at all (a file-size limit)
exits 6 naming `deployer recover`, which records what the target holds."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_repo import (
    ORIGINAL_A,
    Project,
    act_when,
    git,
    target_python,
    work_tree,
)

pytest_plugins = ["fixtures_repo", "fixtures_ssh"]

LIMITED = """
import resource, runpy, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
sys.argv = ["deployer", *sys.argv[2:]]
runpy.run_module("deployer", run_name="__main__", alter_sys=True)
"""


def log_size_through(project: Project, kind: str) -> int:
    """Where a normal run's log stands once it wrote its first `kind` event (measured on a run of the same
    playbook)."""
    done = project.deployer("apply", "fix.yaml", "--host", "box")
    assert done.returncode == 0, done.stderr
    [run] = [p for p in project.runs.iterdir() if (p / "events.jsonl").is_file()]
    size = 0
    for line in (run / "events.jsonl").read_bytes().splitlines(keepends=True):
        size += len(line)
        if json.loads(line)["type"] == kind:
            return size
    raise AssertionError(f"the run wrote no {kind}")


def limited(project: Project, limit: int, *args: str) -> subprocess.CompletedProcess[str]:
    """deployer *args under a file-size limit: no file it writes grows past `limit` bytes."""
    return subprocess.run([sys.executable, "-c", LIMITED, str(limit), *args], cwd=project.root, env=project.env(),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_run_log_that_cannot_grow_stops_the_run_restores_the_target_and_exits_1(target: Project) -> None:
    target.playbook()
    base, before = target.head(), work_tree(target.repo)
    limit = log_size_through(target, "uploaded") + 16  # the next event no longer fits: the upload has landed
    git(target.repo, "reset", "-q", "--hard", base)
    # The commit went to the target with the upload: a slow compile before it lets the stop take it back first.
    target.write_inventory(python=target_python(target, "sleep 2"))
    result = limited(target, limit, "apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "could not be written" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert target.head() == base and target.file("pkg/a.py") == ORIGINAL_A and work_tree(target.repo) == before
    assert git(target.repo, "status", "--porcelain") == ""
    assert not (target.repo / ".git" / "deployer.run.lock").exists()
    assert not (target.repo / ".git" / "deployer" / "inflight.json").exists()
    run = max(p for p in target.runs.iterdir() if (p / "state.json").is_file())
    assert json.loads((run / "state.json").read_text())["phase"] == "failed_restored"
    # The log ends with its last whole event: no torn line.
    assert (run / "events.jsonl").read_bytes().endswith(b"\n")


# -- a runs dir that is really full: a small tmpfs, filled while the run waits at a gate ----------------------

@pytest.fixture
def small_runs(target: Project) -> Iterator[Path]:
    """The project's runs dir on a tmpfs of its own (room for the headroom check, not much more)."""
    target.runs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(target.runs)], check=True)
    try:
        yield target.runs
    finally:
        subprocess.run(["umount", "-l", str(target.runs)], check=False)


def fill(directory: Path) -> Path:
    """Write until the file system says ENOSPC: nothing more fits, as on a full disk."""
    filler = directory / "filler"
    chunk = b"\0" * 65536
    with filler.open("wb", buffering=0) as out, contextlib.suppress(OSError):
        for _ in range(1024):  # 64 MiB at most: more than the mount holds
            out.write(chunk)
    return filler


def gated(project: Project, name: str) -> tuple[str, Path, Path]:
    """A shell snippet that says it was reached, then waits (bounded) for the test to let it go on."""
    entered, go = project.root / f"{name}-entered", project.root / f"{name}-go"
    return (f"touch '{entered}'\ni=0\nwhile [ ! -e '{go}' ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done",
            entered, go)


def fill_at_gate(project: Project, entered: Path, go: Path) -> subprocess.CompletedProcess[str]:
    """Run the apply, fill the runs dir once the run waits at the gate, let it go on; its outcome."""
    def fill_then_go(_: object) -> None:
        fill(project.runs)
        go.touch()
    ended = act_when(project, ("apply", "fix.yaml", "--host", "box"), entered.exists, fill_then_go, "the gate",
                     cleanup=go.touch)
    (project.runs / "filler").unlink()
    return ended


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_runs_dir_that_fills_after_the_intent_record_restores_the_target_and_leaves_no_intent_record(
        target: Project, small_runs: Path) -> None:
    snippet, entered, go = gated(target, "compile")
    target.write_inventory(python=target_python(target, snippet))
    # A new file: its count cannot be told ahead, so the commit waits for the checks here (a commit sent with
    # the changes, behind checks the target decides, would land though the runs dir filled meanwhile: the
    # commit-that-lands test below).
    target.write("fix/new_mod.py", "NEW = True\n")
    target.playbook(files=[{"src": "fix/a.py", "dest": "pkg/a.py"},
                           {"src": "fix/new_mod.py", "dest": "pkg/new_mod.py", "create": True}],
                    steps=["local_compile", "upload", "remote_compile", {"diff_bounds": {"files": 2}},
                           {"commit": {"message": "pkg: answer is 42"}}])
    base, before = target.head(), work_tree(target.repo)
    result = fill_at_gate(target, entered, go)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert target.head() == base and work_tree(target.repo) == before
    # The target is consistent again: the intent record (there for recovery only) and the lock are gone.
    assert not (target.repo / ".git" / "deployer" / "inflight.json").exists(), result.stderr
    assert not (target.repo / ".git" / "deployer.run.lock").exists(), result.stderr
    # The room kept for the run's end takes its record and its log's end: nothing is left for recover.
    [run] = [p for p in target.runs.iterdir() if (p / "state.json").is_file()]
    assert json.loads((run / "state.json").read_text())["phase"] == "failed_restored"
    verified = target.deployer("runs", "verify", run.name)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    applied = target.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_runs_dir_that_fills_during_a_refused_commit_restores_ends_its_record_and_recover_leaves_a_moved_target(
        target: Project, small_runs: Path) -> None:
    snippet, entered, go = gated(target, "commit")
    target.hook("pre-commit", f"#!/bin/sh\n{snippet}\nexit 1\n")  # the runs dir is full when it refuses
    target.playbook(steps=["upload", {"commit": {"message": "pkg: answer is 42", "hooks": True}}])
    base, before = target.head(), work_tree(target.repo)
    result = fill_at_gate(target, entered, go)
    assert result.returncode == 1, result.stdout + result.stderr
    assert target.head() == base and work_tree(target.repo) == before
    assert not (target.repo / ".git" / "deployer" / "inflight.json").exists(), result.stderr
    assert not (target.repo / ".git" / "deployer.run.lock").exists(), result.stderr
    [run] = [p for p in target.runs.iterdir() if (p / "state.json").is_file()]
    # The room kept for the run's end takes its record's end too.
    assert json.loads((run / "state.json").read_text())["phase"] == "failed_restored"
    # The target moves on (the next apply is not stopped); recover finds nothing of the run left and leaves the
    # new commit alone: the run's commit never happened.
    target.hook("pre-commit", "#!/bin/sh\nexit 0\n")
    applied = target.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    moved, tree = target.head(), work_tree(target.repo)
    recovered = target.deployer("recover", run.name)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert target.head() == moved and work_tree(target.repo) == tree
    assert json.loads((run / "state.json").read_text())["phase"] == "failed_restored"
    verified = target.deployer("runs", "verify", run.name)
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_runs_dir_that_fills_while_the_commit_and_release_are_recorded_still_ends_the_log_and_rollback_works(
        target: Project, small_runs: Path) -> None:
    snippet, entered, go = gated(target, "commit")
    target.hook("pre-commit", f"#!/bin/sh\n{snippet}\n")
    target.playbook(steps=["upload", {"commit": {"message": "pkg: answer is 42", "hooks": True}}])
    base = target.head()
    result = fill_at_gate(target, entered, go)
    # The commit and the release sent right behind it, with the end note that says the run succeeded, landed;
    # the events of the answer found no room, but the end had room kept for it from the run's start.
    assert result.returncode == 0, result.stdout + result.stderr
    assert "some of this run's events are missing" in result.stderr, result.stderr
    [run] = [p for p in target.runs.iterdir() if (p / "state.json").is_file()]
    commit = target.head()
    assert git(target.repo, "rev-parse", "HEAD~1").strip() == base
    assert f"Deployer-Run: {run.name}" in git(target.repo, "log", "-1", "--format=%B")
    assert not (target.repo / ".git" / "deployer" / "inflight.json").exists(), result.stderr
    assert not (target.repo / ".git" / "deployer.run.lock").exists(), result.stderr
    state = json.loads((run / "state.json").read_text())
    assert (state["phase"], state["git_after"]) == ("succeeded", commit), state
    end = target.events(run.name)[-1]
    assert (end["type"], end["status"], end["git"]["after"]) == ("run_end", "successful", commit), end
    assert end["events_lost"] == "No space left on device", end
    # No recover needed: the log verifies, on the target too, and the run rolls back.
    for where in ((), ("--target",)):
        checked = target.deployer("runs", "verify", run.name, *where)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    rolled = target.deployer("rollback", run.name)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert git(target.repo, "rev-parse", "HEAD~1").strip() == commit and target.file("pkg/a.py") == ORIGINAL_A

@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_run_whose_end_cannot_be_written_exits_6_naming_recover_which_records_its_commit(target: Project) -> None:
    target.playbook(steps=["upload", {"commit": {"message": "pkg: answer is 42"}}])
    base = target.head()
    # Everything up to the run's end fits (with room for lines a little longer this time), the end does not.
    limit = log_size_through(target, "lock_released") + 64
    git(target.repo, "reset", "-q", "--hard", base)
    result = limited(target, limit, "apply", "fix.yaml", "--host", "box")
    run = max(p for p in target.runs.iterdir() if (p / "state.json").is_file())
    assert result.returncode == 6, result.stdout + result.stderr
    assert "The run's end could not be written" in result.stderr, result.stderr
    assert f"deployer recover {run.name}" in result.stderr, result.stderr
    assert "run_end" not in [e["type"] for e in target.events(run.name)]
    commit = target.head()
    assert git(target.repo, "rev-parse", "HEAD~1").strip() == base
    recovered = target.deployer("recover", run.name)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    end = [e for e in target.events(run.name) if e["type"] == "run_end"][-1]
    assert (end["status"], end["exit_code"], end["git"]["after"]) == ("successful", 0, commit), end
    verified = target.deployer("runs", "verify", run.name, "--target")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    rolled = target.deployer("rollback", run.name)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert git(target.repo, "rev-parse", "HEAD~1").strip() == commit and target.file("pkg/a.py") == ORIGINAL_A
