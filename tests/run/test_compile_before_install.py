"""With remote_compile, the live tree never holds bytes the target's python has not compiled: the upload stages
each file beside its dest, remote_compile compiles exactly those staged bytes, and only then renames them into
place. Over a real target (local and the real sshd), with the target's python a wrapper that, each time it is
asked to compile, first copies what the live dest and the file it was given hold at that moment."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from fixtures_repo import FIXED_A, ORIGINAL_A, Project, age_lock, git, target_python, work_tree
from polling import wait_for

pytest_plugins = ["fixtures_repo", "fixtures_ssh"]

STEPS = ["local_compile", "upload", "remote_compile",
         {"diff_bounds": {"files": 1, "insertions": [1, 10], "deletions": [0, 2]}},
         {"commit": {"message": "pkg: answer is 42"}}]


def watching_python(project: Project, then: str = "") -> tuple[Path, Path]:
    """The target's python: asked to compile (remote_compile's script, the file in $5), it first copies the live
    pkg/a.py and that file aside, then does `then` (refuse, block) before compiling; asked to install (the
    rename script), it leaves the file `installed`. Returns the two copies."""
    live, compiled = project.root / "live_at_compile", project.root / "compiled"
    python = target_python(project, f'case "$4" in *"compile("*) cat "{project.repo}/pkg/a.py" > "{live}"; '
                                    f'cat "$5" > "{compiled}"; {then};; '
                                    f'*"os.rename("*) touch "{project.root}/installed";; esac')
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
    assert not (target.root / "installed").exists(), "the install ran after a failed compile"


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
    assert plan == ["stage:pkg/a.py", "compile", "install"]
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stdout + result.stderr
    assert live.read_text() == ORIGINAL_A and compiled.read_text() == FIXED_A and (target.root / "installed").exists()
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
