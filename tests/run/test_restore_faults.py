"""Restore under real faults: a commit git refuses, a commit killed after git made it, every step's timeout_s.

The faults are real git and real processes: a reference-transaction hook (runs even under
`git commit --no-verify`), a clean filter that stalls `git diff`, a python that never returns.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from fixtures_repo import ORIGINAL_A, Project, git, target_python
from fixtures_services import Stack

# Holds HEAD's update back: git commit fails with the new commit object made and no ref moved.
ABORT_REF_UPDATE = """#!/bin/sh
[ "$1" = prepared ] && grep -q ' HEAD$\\| refs/heads/' && { echo 'hook: ref update refused' >&2; exit 1; }
exit 0
"""

# Lets the ref update through, then stalls once (armed by a file): the commit exists, but the
# `git commit` that made it is still running when the step's timeout_s kills it.
STALL_AFTER_COMMIT = """#!/bin/sh
armed="$(git rev-parse --git-dir)/stall-armed"
[ "$1" = committed ] && [ -e "$armed" ] || exit 0
rm -f "$armed"
sleep 60
"""

# A clean filter that stalls only on the shipped bytes, so `git diff` against the upload hangs
# while every other git call (status, preflight) stays fast.
STALL_ON_NEW_BYTES = """#!/bin/sh
tmp=$(mktemp)
cat > "$tmp"
grep -q 'return 42' "$tmp" && sleep 60
cat "$tmp"
rm -f "$tmp"
"""

UP_TO_COMMIT: list[Any] = ["local_compile", "upload", "remote_compile", {"diff_bounds": {"files": 1}}]


def assert_restored(project: Project, head: str, restored: tuple[str, ...] = ("pkg/a.py",)) -> None:
    """Pre-run bytes, pre-run HEAD, nothing staged, nothing modified; `restored`: the files the restore rewrote."""
    assert project.file("pkg/a.py") == ORIGINAL_A
    assert project.head() == head
    assert git(project.repo, "diff", "--cached", "--name-only") == ""
    assert git(project.repo, "status", "--porcelain", "--untracked-files=no") == ""
    events = project.events()
    end = next(e for e in events if e["type"] == "run_end")
    assert end["status"] == "failed" and end["facts"].get("restored", []) == list(restored)
    # The restore's own event and commands are logged under the step "restore".
    restore = next(e for e in events if e["type"] == "restore")
    assert (restore["step"], restore["restored"], restore["head"]) == ("restore", list(restored), head)
    assert any(e["type"] == "command" and e["step"] == "restore" for e in events)


def test_a_commit_git_refuses_restores_the_files_and_resets_the_index(target: Project) -> None:
    target.hook("reference-transaction", ABORT_REF_UPDATE)
    head = target.head()
    # hooks: true: deployer runs none of the repo's hooks otherwise, and this fault is one.
    target.playbook(steps=[*UP_TO_COMMIT, {"commit": {"message": "m", "hooks": True}}])
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stderr
    assert "git commit failed" in result.stderr and "hook: ref update refused" in result.stderr
    assert_restored(target, head)  # without `git reset`, pkg/a.py would stay staged with the new bytes


def kill_commit_after_git_made_it(project: Project) -> tuple[str, str]:
    """Apply with a commit step whose `git commit` is killed by timeout_s after moving the branch."""
    project.hook("reference-transaction", STALL_AFTER_COMMIT)
    (project.repo / ".git" / "stall-armed").touch()
    head = project.head()
    project.playbook(steps=[*UP_TO_COMMIT, {"commit": {"message": "m", "timeout_s": 2, "hooks": True}}])
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert "did not finish within 2s, killed" in result.stderr
    return head, result.stderr + f"\nexit {result.returncode}"


def test_a_commit_killed_after_git_made_it_is_undone(target: Project) -> None:
    head, output = kill_commit_after_git_made_it(target)
    # git had moved the branch to the run's commit before it was killed: the restore dropped it.
    undo = [e for e in target.events() if e["type"] == "command" and f"reset -q --soft {head}" in e["command"]]
    assert [e["exit_code"] for e in undo] == [0], "the run's own commit was never undone"
    assert target.head() == head and target.file("pkg/a.py") == ORIGINAL_A, output
    assert "Deployer-Run" not in git(target.repo, "log", "--format=%B")


def test_a_commit_killed_after_git_made_it_leaves_no_staged_bytes_or_says_so(target: Project) -> None:
    head, output = kill_commit_after_git_made_it(target)
    if "exit 6" not in output:  # exit 1 claims a full restore: then the index must be clean too
        assert_restored(target, head)


def slow_python(project: Project) -> str:
    return target_python(project, "sleep 60", then="exit 0")


def stall_git_diff(project: Project) -> None:
    script = project.write("stall-filter", STALL_ON_NEW_BYTES)
    script.chmod(0o755)
    git(project.repo, "config", "filter.stall.clean", str(script))
    (project.repo / ".git" / "info").mkdir(exist_ok=True)
    (project.repo / ".git" / "info" / "attributes").write_text("*.py filter=stall\n")


@pytest.mark.parametrize("kind", ["remote_compile", "diff_bounds"])
def test_a_step_past_its_timeout_is_killed_and_the_target_restored(target: Project, kind: str) -> None:
    steps: list[Any] = ["local_compile", "upload"]
    if kind == "remote_compile":
        target.write_inventory(python=slow_python(target))
        steps.append({"remote_compile": {"timeout_s": 1}})
    else:
        stall_git_diff(target)
        steps += ["remote_compile", {"diff_bounds": {"files": 1, "timeout_s": 1}}]
    head = target.head()
    target.playbook(steps=steps)
    result = target.deployer("apply", "fix.yaml", "--host", "box", timeout=60)
    assert result.returncode == 1, result.stderr
    assert kind in result.stderr
    assert "did not finish within 1s, killed" in result.stderr
    failed = [e for e in target.events() if e["type"] == "step_end" and e["status"] == "failed"]
    assert [e["step"] for e in failed] == [kind]
    if kind == "remote_compile":  # killed while compiling the staged file: the live one never changed
        assert_restored(target, head, restored=())
        [temp] = next(e for e in target.events() if e["type"] == "restore")["temps"]
        assert Path(temp).name.startswith(".a.py.deployer-staged-")
    else:
        assert_restored(target, head)


def test_a_co_restart_whose_stop_command_hangs_is_killed_at_its_timeout(stack: Stack) -> None:
    project = stack.project
    stack.configure(prefill=stack.service("prefill", stop=["sleep", "60"]), decode=stack.service("decode"))
    head = project.head()
    project.playbook(steps=["upload", {"diff_bounds": {"files": 1}}, {"commit": {"message": "m"}},
                            {"co_restart": {"timeout_s": 1}}])
    result = project.deployer("apply", "fix.yaml", "--host", "box", timeout=60)
    said = " ".join(result.stderr.split())
    # Past the commit: nothing is restored, and the message says so.
    assert result.returncode == 5, result.stderr
    assert "the stop command of prefill failed: did not finish within 1s, killed" in said
    assert "command: sleep 60" in said
    assert git(project.repo, "rev-parse", "HEAD~1").strip() == head and "stays on the target" in said


STALL_ON_OLD_BYTES = STALL_ON_NEW_BYTES.replace("return 42", "return 41")
PATCH_A = """--- a/pkg/a.py
+++ b/pkg/a.py
@@ -1,2 +1,2 @@
 def answer():
-    return 41
+    return 42
"""


def test_an_upload_by_patch_past_its_timeout_is_killed_and_changes_nothing(target: Project) -> None:
    # Stat info settled before the filter exists, so only reading pkg/a.py's bytes (git apply) runs it.
    past = os.stat(target.repo / "pkg/a.py").st_mtime - 60
    for path in target.repo.rglob("*.py"):
        os.utime(path, (past, past))
    git(target.repo, "update-index", "--really-refresh")
    script = target.write("stall-filter", STALL_ON_OLD_BYTES)
    script.chmod(0o755)
    git(target.repo, "config", "filter.stall.clean", str(script))
    (target.repo / ".git" / "info").mkdir(exist_ok=True)
    (target.repo / ".git" / "info" / "attributes").write_text("*.py filter=stall\n")
    target.write("fix/a.diff", PATCH_A)
    head = target.head()
    target.playbook(patch="fix/a.diff", steps=[{"upload": {"timeout_s": 1}}])
    result = target.deployer("apply", "fix.yaml", "--host", "box", timeout=60)
    assert result.returncode == 1, result.stderr
    assert "did not finish within 1s, killed" in result.stderr and "apply --check -" in result.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A and target.head() == head


def test_an_intent_record_the_target_cannot_hold_lets_no_change_through(target: Project) -> None:
    # Where the record goes (<git dir>/deployer/) cannot be a directory: a dangling symlink holds its name.
    (target.repo / ".git" / "deployer").symlink_to(target.repo / "nowhere")
    head = target.head()
    target.playbook(steps=[*UP_TO_COMMIT, {"commit": {"message": "m"}}])
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stderr
    assert "cannot record the run's intent on the target" in result.stderr
    # The uploads were sent with the record, in the same round trip; the agent skipped them.
    events = target.events()
    assert not [e for e in events if e["type"] == "uploaded"]
    assert target.file("pkg/a.py") == ORIGINAL_A and target.head() == head
    assert not list((target.repo / "pkg").glob(".*.tmp"))
    end = next(e for e in events if e["type"] == "run_end")
    assert end["status"] == "failed" and end["phase"] == "failed_restored"


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_a_commit_touching_more_than_the_shipped_files_is_undone_while_the_run_holds_its_lock(
        target: Project, tmp_path: Path) -> None:
    # A real fault: a pre-commit hook (hooks: true) stages another file, and git commits it too. The commit is
    # the run's last step, so its release goes right behind the commit's batch: the agent must skip it.
    target.hook("pre-commit", "#!/bin/sh\necho '# hook' >> pkg/b.py\ngit add pkg/b.py\n")
    calls, bindir = tmp_path / "git-calls", tmp_path / "bin"
    bindir.mkdir()
    lock = target.repo / ".git" / "deployer.run.lock"
    (bindir / "git").write_text(f'#!/bin/sh\nstate=free; [ -L "{lock}" ] && state=locked\n'
                                f'for a in "$@"; do [ "$a" = commit ] && state="$state commit"; done\n'
                                f'echo "$state" >> "{calls}"\nexec {shutil.which("git")} "$@"\n')
    (bindir / "git").chmod(0o755)
    target.extra_env["PATH"] = f"{bindir}:{os.environ['PATH']}"
    head = target.head()
    target.playbook(steps=[*UP_TO_COMMIT, {"commit": {"message": "m", "hooks": True}}])
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stderr
    assert "touched pkg/a.py, pkg/b.py instead of exactly pkg/a.py" in result.stderr
    assert target.head() == head and target.file("pkg/a.py") == ORIGINAL_A
    assert not lock.exists() and not (target.repo / ".git" / "deployer" / "inflight.json").exists()
    logged = calls.read_text().splitlines()
    committed = logged.index("locked commit")
    after = logged[committed:]
    assert len(after) > 3 and set(after) == {"locked", "locked commit"}, after  # the undo too
