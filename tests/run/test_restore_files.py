"""restore_files called directly on a real repo (local and over the real sshd): what the undo before a commit leaves.

The CLI tests reach the restore through a failing step; these build the target state a cut or failed run leaves
(new bytes staged, a new file and directory, a stale index.lock, temp files of a cut upload, a moved HEAD) and
check every piece the restore is responsible for, and what it must leave alone.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fixtures_repo import FIXED_A, ORIGINAL_A, ORIGINAL_B, Project, git

from deployer.errors import RollbackFailed
from deployer.run.restore import restore_files
from deployer.runstate import FileRecord, RunRecord, RunState, git_blob_id
from deployer.steps.context import Context
from deployer.steps.git import trailers

TRAILER = trailers(Deployer_Run="t")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def changed_a(target: Project, *, tracked: bool = True, recorded: str = ORIGINAL_A) -> FileRecord:
    """pkg/a.py as a run leaves it: the new bytes written and staged; the record names its pre-run state."""
    path = target.repo / "pkg" / "a.py"
    stat = path.stat()
    path.write_text(FIXED_A)
    os.chmod(path, 0o600)
    git(target.repo, "add", "pkg/a.py")
    return FileRecord(dest="pkg/a.py", path=str(path), existed=True, tracked=tracked, sha256=sha(recorded),
                      new_sha256=sha(FIXED_A), new_blob=git_blob_id(FIXED_A.encode()), mode=0o644,
                      uid=4321 if os.geteuid() == 0 else stat.st_uid, gid=4321 if os.geteuid() == 0 else stat.st_gid)


def new_c(target: Project) -> FileRecord:
    """pkg/new/c.py, which the run created with its directory."""
    (target.repo / "pkg" / "new").mkdir()
    (target.repo / "pkg" / "new" / "c.py").write_text("C = 1\n")
    return FileRecord(dest="pkg/new/c.py", path=str(target.repo / "pkg" / "new" / "c.py"), existed=False,
                      tracked=False, sha256=None, new_sha256=sha("C = 1\n"),
                      new_dirs=[str(target.repo / "pkg" / "new")])


def events_of(context: Context) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    context.bus.listeners.append(seen.append)
    return seen


def test_restore_gives_back_bytes_owner_and_mode_and_clears_what_the_run_left(
        target: Project, context: Context) -> None:
    context.git_dir = str(target.repo / ".git")
    before = target.head()
    git(target.repo, "add", "README")  # the operator's own staging...
    (target.repo / "README").write_text("operator's edit\n")
    git(target.repo, "add", "README")  # ...is not the run's, and stays
    files = [changed_a(target), new_c(target)]
    (target.repo / ".git" / "index.lock").write_text("")  # a git command of the run was killed
    state = target.repo / ".git" / "deployer"
    state.mkdir()
    temps = [target.repo / "pkg" / ".a.py.deployer-x1.tmp", target.repo / "pkg" / ".deployer-x2.tmp",
             state / ".deployer-x3.tmp"]
    # Not temps of a cut upload: another name, a directory, one level too deep, a dir no dest is in.
    kept = [target.repo / "pkg" / "a.py.tmp", target.repo / "pkg" / ".d.deployer-x4.tmp" / "f",
            target.repo / "pkg" / "sub" / ".deployer-x5.tmp", target.repo / ".deployer-x6.tmp"]
    for path in [*temps, *kept]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("partial")
    seen = events_of(context)

    done = restore_files(context, files, before, TRAILER, None)

    assert (done.restored, done.removed, done.undid_commit) == (["pkg/a.py"], ["pkg/new/c.py"], None)
    assert done.temps == sorted(str(p) for p in temps)
    assert not any(p.exists() for p in temps) and all(p.exists() for p in kept)
    a = (target.repo / "pkg" / "a.py").stat()
    assert (target.file("pkg/a.py"), a.st_mode & 0o7777, a.st_uid, a.st_gid) == (ORIGINAL_A, 0o644, files[0].uid,
                                                                                  files[0].gid)
    assert not (target.repo / "pkg" / "new").exists() and target.file("pkg/b.py") == ORIGINAL_B
    assert not (target.repo / ".git" / "index.lock").exists()
    assert [e["path"] for e in seen if e["type"] == "index_lock_removed"] == [str(target.repo / ".git" / "index.lock")]
    assert git(target.repo, "diff", "--cached", "--name-only") == "README\n" and target.head() == before
    # The directory and owner clean-ups ran without an error (their exit codes are logged, not checked).
    cleanups = [e for e in seen if e["type"] == "command" and re.search(r"\b(rmdir|chown) ", e["command"])]
    assert [e["exit_code"] for e in cleanups] == [0, 0], cleanups
    # The pre-run bytes came from git's objects; the command that read them logged no file content.
    shown = [e for e in seen if e["type"] == "command" and "cat-file" in e["command"]]
    assert len(shown) == 1 and shown[0]["stdout_tail"] == ""

    # Idempotent: a second restore finds everything as it should be and touches nothing.
    again = restore_files(context, files, before, TRAILER, None)
    assert (again.restored, again.removed, again.temps) == ([], [], [])
    assert len([e for e in seen if e["type"] == "index_lock_removed"]) == 1


def test_a_new_directory_that_now_holds_someone_elses_file_is_left_without_an_error(
        target: Project, context: Context) -> None:
    context.git_dir = str(target.repo / ".git")
    rec = new_c(target)
    (target.repo / "pkg" / "new" / "theirs.txt").write_text("not the run's\n")
    seen = events_of(context)
    assert restore_files(context, [rec], target.head(), TRAILER, None).removed == ["pkg/new/c.py"]
    assert [p.name for p in (target.repo / "pkg" / "new").iterdir()] == ["theirs.txt"]
    assert [e["exit_code"] for e in seen if e["type"] == "command" and "rmdir " in e["command"]] == [0]


def test_restore_drops_the_runs_own_commit(target: Project, context: Context) -> None:
    context.git_dir = str(target.repo / ".git")
    before = target.head()
    files = [changed_a(target)]
    git(target.repo, "commit", "-q", "-m", f"fix\n\n{TRAILER}")
    made = target.head()
    done = restore_files(context, files, before, TRAILER, None)
    assert (done.undid_commit, target.head(), target.file("pkg/a.py")) == (made, before, ORIGINAL_A)
    assert git(target.repo, "status", "--porcelain", "--untracked-files=no") == ""


@pytest.mark.parametrize("moved", ["someone else's commit", "the run's commit on someone else's"])
def test_restore_leaves_a_head_it_did_not_move(target: Project, context: Context, moved: str) -> None:
    context.git_dir = str(target.repo / ".git")
    before = target.head()
    if moved == "someone else's commit":
        files = [changed_a(target)]
        git(target.repo, "commit", "-q", "-m", f"not ours\n\nDeployer-Run: other\n{TRAILER}x")
    else:
        git(target.repo, "commit", "-q", "--allow-empty", "-m", "someone else's")
        files = [changed_a(target)]
        git(target.repo, "commit", "-q", "-m", f"fix\n\n{TRAILER}")
    head = target.head()
    with pytest.raises(RollbackFailed, match=f"HEAD moved from {before} to {head} during the run, and not by this "
                                             "run's commit; left as it is"):
        restore_files(context, files, before, TRAILER, None)
    assert target.head() == head and target.file("pkg/a.py") == FIXED_A


def test_an_index_lock_a_live_git_holds_is_left_and_the_restore_stops(target: Project, context: Context) -> None:
    context.git_dir = str(target.repo / ".git")
    before = target.head()
    files = [changed_a(target)]
    lock = target.repo / ".git" / "index.lock"
    lock.write_text("")
    # A real git process working in the repo (it waits on its stdin) while the lock exists.
    live = subprocess.Popen(["git", "cat-file", "--batch"], cwd=target.repo / "pkg", stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL)
    try:
        with pytest.raises(RollbackFailed, match=re.escape(f"{lock} is held by a git process still running in "
                                                           f"{target.repo}; wait for it, then finish with: "
                                                           "deployer recover t")):
            restore_files(context, files, before, TRAILER, None)
        assert lock.exists() and target.file("pkg/a.py") == FIXED_A
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait(timeout=30)
    lock.unlink()
    assert restore_files(context, files, before, TRAILER, None).restored == ["pkg/a.py"]


@pytest.mark.parametrize("case", ["untracked", "git's bytes differ from the record"])
def test_pre_run_bytes_found_nowhere_leave_the_file_as_it_is(target: Project, context: Context, case: str) -> None:
    context.git_dir = str(target.repo / ".git")
    before = target.head()
    rec = changed_a(target, tracked=case != "untracked", recorded="something else\n")
    said = f"the pre-run bytes of pkg/a.py (sha256 {rec.sha256[:12]}) are neither in the run dir nor in git's objects"
    with pytest.raises(RollbackFailed, match=re.escape(f"{said} at {before[:12]}; the file was left as it is")):
        restore_files(context, [rec], before, TRAILER, None)
    assert target.file("pkg/a.py") == FIXED_A


def test_pre_run_bytes_kept_in_the_run_dir_restore_a_file_git_does_not_track(
        target: Project, context: Context, tmp_path: Path) -> None:
    context.git_dir = str(target.repo / ".git")
    before = target.head()
    rec = changed_a(target, tracked=False, recorded="untracked before\n")
    record = RunRecord(tmp_path / "run", RunState(run_id="t", host="box", operator="me", repo=str(target.repo)))
    (tmp_path / "run").mkdir()
    rec.before = record.keep_before(0, b"untracked before\n")
    assert restore_files(context, [rec], before, TRAILER, record).restored == ["pkg/a.py"]
    assert target.file("pkg/a.py") == "untracked before\n"


def test_a_dest_whose_name_starts_with_a_dash_is_unstaged_and_restored(target: Project, context: Context) -> None:
    context.git_dir = str(target.repo / ".git")
    dash = target.repo / "-n.py"
    dash.write_text("N = 1\n")
    git(target.repo, "add", "--", "-n.py")
    git(target.repo, "commit", "-q", "-m", "a name git could take for an option")
    before = target.head()
    dash.write_text("N = 2\n")
    git(target.repo, "add", "--", "-n.py")
    rec = FileRecord(dest="-n.py", path=str(dash), existed=True, tracked=True, sha256=sha("N = 1\n"),
                     new_sha256=sha("N = 2\n"), new_blob=git_blob_id(b"N = 2\n"), mode=0o644)
    assert restore_files(context, [rec], before, TRAILER, None).restored == ["-n.py"]
    assert dash.read_text() == "N = 1\n" and git(target.repo, "diff", "--cached", "--name-only") == ""


def test_pre_run_bytes_larger_than_a_command_capture_come_back_whole_from_gits_objects(
        target: Project, context: Context) -> None:
    context.git_dir = str(target.repo / ".git")
    big = target.repo / "model.bin"
    data = os.urandom(9 << 20)  # past the 8 MiB a command's output keeps by default
    big.write_bytes(data)
    git(target.repo, "add", "model.bin")
    git(target.repo, "commit", "-q", "-m", "weights")
    before = target.head()
    big.write_bytes(b"new")
    rec = FileRecord(dest="model.bin", path=str(big), existed=True, tracked=True,
                     sha256=hashlib.sha256(data).hexdigest(), new_sha256=sha("new"), mode=0o644)
    assert restore_files(context, [rec], before, TRAILER, None).restored == ["model.bin"]
    assert big.read_bytes() == data


# Stands in for a tool whose failure this suite cannot cause for real (we run as root, on tmpfs: no read-only
# mount, no full disk): the call with an argument matching the pattern fails; every other call runs the tool.
FAILING_TOOL = """#!/bin/sh
for arg; do case $arg in {pattern}) echo "{tool}: refused by the test" >&2; exit 1;; esac; done
exec {real} "$@"
"""


@pytest.mark.parametrize("target", ["local"], indirect=True)  # the stand-in goes on the local agent's PATH
@pytest.mark.parametrize(("tool", "pattern", "what"), [
    ("git", "rev-parse", "cannot read HEAD"),
    ("git", "reset", "cannot unstage the run's files"),
    ("git", "--soft", "cannot undo the run's commit"),
    ("rm", "*.tmp", "cannot remove the upload's temp files"),
])
def test_a_restore_command_that_fails_stops_the_restore_naming_it_and_how_to_finish(
        target: Project, context: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        tool: str, pattern: str, what: str) -> None:
    context.git_dir = str(target.repo / ".git")
    before = target.head()
    files = [changed_a(target), new_c(target)]
    (target.repo / "pkg" / ".a.py.deployer-x1.tmp").write_text("partial")
    if pattern == "--soft":
        git(target.repo, "commit", "-q", "-m", f"fix\n\n{TRAILER}")
    real = shutil.which(tool)
    stand_in = tmp_path / "bin" / tool
    stand_in.parent.mkdir()
    stand_in.write_text(FAILING_TOOL.format(tool=tool, pattern=pattern, real=real))
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stand_in.parent}{os.pathsep}{os.environ['PATH']}")  # the agent starts now
    with pytest.raises(RollbackFailed) as caught:
        restore_files(context, files, before, TRAILER, None)
    said = str(caught.value)
    assert said.startswith(f"restoring the target failed: step '?' failed: {what}\n  command: "), said
    assert f"{tool}: refused by the test" in said
    assert said.endswith(f". The files pkg/a.py, pkg/new/c.py may hold the new bytes, and HEAD may be this run's "
                         f"commit ({TRAILER}) on top of {before[:12]}. `deployer recover t` reads the target and "
                         "finishes it"), said
