"""With remote_compile, the live tree never holds bytes the target's python has not compiled: the upload stages
each file beside its dest, remote_compile compiles exactly those staged bytes, and only then renames them into
place. Over a real target (local and the real sshd), with the target's python a wrapper that, each time it is
asked to compile, first copies what the live dest and the file it was given hold at that moment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from fixtures_repo import FIXED_A, ORIGINAL_A, Project, age_lock, git, target_python, work_tree
from polling import wait_for

from deployer.steps.compile import INSTALL_SCRIPT, RENAME_FAILED

pytest_plugins = ["fixtures_repo", "fixtures_ssh"]

STEPS = ["local_compile", "upload", "remote_compile",
         {"diff_bounds": {"files": 1, "insertions": [1, 10], "deletions": [0, 2]}},
         {"commit": {"message": "pkg: answer is 42"}}]


def watching_python(project: Project, then: str = "") -> tuple[Path, Path]:
    """The target's python: asked to compile and install (remote_compile's script, the file in $6 after their
    count), it first copies the live pkg/a.py and that file aside, then does `then` (refuse, block) before
    compiling. Returns the two copies."""
    live, compiled = project.root / "live_at_compile", project.root / "compiled"
    python = target_python(project, f'case "$4" in *"compile("*) cat "{project.repo}/pkg/a.py" > "{live}"; '
                                    f'cat "$6" > "{compiled}"; {then};; esac')
    project.write_inventory(python=python)
    return live, compiled


def temps_in(repo: Path) -> list[str]:
    return sorted(p.name for p in repo.rglob(".*deployer-*.tmp"))


def test_a_fix_the_targets_python_refuses_never_appears_in_the_live_tree(target: Project) -> None:
    live, compiled = watching_python(target, then="echo 'not under this python' >&2; exit 3")
    before, head = work_tree(target.repo), target.head()
    target.playbook(steps=STEPS)
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stdout + result.stderr
    # While the target's python compiled the fix, the live file still held the old bytes, and what it
    # compiled was exactly the fix: the staged copy beside it.
    assert live.read_text() == ORIGINAL_A and compiled.read_text() == FIXED_A
    assert "cannot compile the shipped files; none of them was installed" in result.stderr
    assert work_tree(target.repo) == before and target.head() == head and temps_in(target.repo) == []


def test_a_fix_goes_live_only_after_its_staged_bytes_compiled_there_in_stage_compile_install_order(
        target: Project) -> None:
    os.chown(target.repo / "pkg/a.py", 12345, 12346)
    (target.repo / "pkg/a.py").chmod(0o640)
    live, compiled = watching_python(target)
    target.playbook(steps=STEPS)
    planned = target.deployer("plan", "fix.yaml", "--host", "box", "--json")
    assert planned.returncode == 0, planned.stderr
    plan = [a["key"] for s in json.loads(planned.stdout)["steps"] for a in s["actions"]
            if s["name"] in ("upload", "remote_compile")]
    assert plan == ["stage:pkg/a.py", "compile"]  # compile and install: one python on the target
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stdout + result.stderr
    assert live.read_text() == ORIGINAL_A and compiled.read_text() == FIXED_A
    assert (target.repo / "pkg/a.py").read_text() == FIXED_A and temps_in(target.repo) == []
    st = (target.repo / "pkg/a.py").stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (12345, 12346, 0o640)  # set on the temp, kept by the rename
    done = [e["action"] for e in target.events() if e["type"] in ("uploaded", "command") and e.get("action")
            and e["step"] in ("upload", "remote_compile")]
    assert done == plan
    assert git(target.repo, "show", "HEAD:pkg/a.py") == FIXED_A


def test_a_run_cut_between_stage_and_install_leaves_no_staged_file_after_recover(target: Project) -> None:
    marker = target.root / "compiling"
    # Blocks in the compile for good: the test kills the deployer (and then this) once the marker names our pid.
    watching_python(target, then=f'echo $$ > "{marker}"; while :; do sleep 0.05; done')
    before, head = work_tree(target.repo), target.head()
    target.playbook(steps=STEPS)
    proc = target.popen("apply", "fix.yaml", "--host", "box")
    try:
        wait_for(lambda: (marker.exists() and marker.read_text().strip() != "") or proc.poll() is not None,
                 "the compile")
        assert proc.poll() is None, proc.communicate()
        # Cut here: the fix is staged beside its dest, the live file still the old one.
        assert len(temps_in(target.repo)) == 1 and (target.repo / "pkg/a.py").read_text() == ORIGINAL_A
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        if marker.exists() and marker.read_text().strip():
            os.kill(int(marker.read_text().strip()), signal.SIGKILL)
    age_lock(target.repo)
    run = target.newest_run()
    recovered = target.deployer("recover", run)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert temps_in(target.repo) == []
    assert work_tree(target.repo) == before and target.head() == head
    state = json.loads((target.runs / run / "state.json").read_text())
    assert state["phase"] == "failed_restored"


def test_a_rename_that_fails_after_every_file_compiled_says_so_and_leaves_the_tree_as_it_was(
        target: Project) -> None:
    # The target's python gets the script's own arguments, but the staged temp it is to rename ($7) missing:
    # the compile of the staged fix ($6) passes, the rename fails for real.
    target.write_inventory(python=target_python(target, "", then=(
        f'exec {sys.executable} "$1" "$2" "$3" "$4" "$5" "$6" "$7.gone" "$8"')))
    before, head = work_tree(target.repo), target.head()
    target.playbook(steps=STEPS)
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "step 'remote_compile' failed: cannot rename the staged files into place" in result.stderr, result.stderr
    assert "cannot compile" not in result.stderr and "No such file or directory" in result.stderr
    assert work_tree(target.repo) == before and target.head() == head and temps_in(target.repo) == []


def test_the_install_script_compiles_every_file_before_it_renames_one(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text("x = 1\n")
    bad.write_text("def f(:\n")
    temp, dest = tmp_path / ".t.tmp", tmp_path / "t.py"
    temp.write_text("y = 2\n")
    argv = [sys.executable, "-I", "-S", "-c", INSTALL_SCRIPT]
    failed = subprocess.run([*argv, "2", str(good), str(bad), str(temp), str(dest)], capture_output=True, text=True)
    assert failed.returncode == 1 and "SyntaxError" in failed.stderr and temp.exists() and not dest.exists()
    done = subprocess.run([*argv, "1", str(good), str(temp), str(dest)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert dest.read_text() == "y = 2\n" and not temp.exists()
    gone = subprocess.run([*argv, "0", str(temp), str(dest)], capture_output=True, text=True)
    assert gone.returncode == RENAME_FAILED and str(temp) in gone.stderr
