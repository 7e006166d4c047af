"""A lock is live while its heartbeat is fresh, whatever else its info or its own mtime say.

The pid in a lock's info.json is the target's word: editing it must not let `recover` take over a run
that is still going. Staleness is the heartbeat's age against the TTL, not the age of the lock itself,
and what `lock status` shows of the info is checked before it is shown.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
import subprocess
import time
from pathlib import Path

from fixtures_repo import FIXED_A, ORIGINAL_A, Project, git, staged_bytes, target_python
from polling import wait_for

from deployer.run.lock import force_release, read_state
from deployer.transport.local import LocalTransport

pytest_plugins = ["fixtures_repo", "fixtures_ssh"]

RUN = "20250101T000000.000Z-abcdef"
TTL_S = 60


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    done = subprocess.Popen(["true"])
    done.wait(timeout=30)
    return done.pid


def backdate(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def hand_made_lock(project: Project, info: dict[str, object]) -> tuple[Path, Path]:
    """A complete lock as a run makes it: its own directory (info.json, heartbeat) and the link naming it."""
    git_dir = project.repo / ".git"
    own = git_dir / f"deployer.run.lock.{RUN}"
    own.mkdir()
    (own / "info.json").write_text(json.dumps(info))
    (own / "heartbeat").touch()
    (git_dir / "deployer.run.lock").symlink_to(own.name)
    return git_dir / "deployer.run.lock", own / "heartbeat"


def ours(**fields: object) -> dict[str, object]:
    return {"run_id": RUN, "operator": f"{getpass.getuser()}@{socket.gethostname()}", "pid": dead_pid(),
            "host": "box", "ttl_s": TTL_S, "started": "2025-01-01T00:00:00+00:00", **fields}


def status(project: Project) -> str:
    shown = project.deployer("lock", "status", "--host", "box")
    assert shown.returncode == 3, shown.stdout + shown.stderr
    return shown.stdout


def test_a_recover_refuses_to_take_over_a_live_run_whose_lock_names_a_dead_pid(target: Project) -> None:
    reached, release = target.root / "compile.reached", target.root / "compile.release"
    # remote_compile parks until released (bounded: 60 s), so run A is live, holding its lock, at a known point.
    python = target_python(target, f'echo $$ > "{reached}"; i=0; while [ ! -e "{release}" ] && [ $i -lt 1200 ]; '
                                   'do sleep 0.05; i=$((i+1)); done')
    target.write_inventory(python=python)
    target.playbook()
    before = target.head()
    proc = target.popen("apply", "fix.yaml", "--host", "box")
    try:
        wait_for(lambda: reached.exists() or proc.poll() is not None, "run A's remote_compile")
        assert proc.poll() is None, proc.communicate()
        info_path = target.repo / ".git" / "deployer.run.lock" / "info.json"
        info = json.loads(info_path.read_text())
        info["pid"] = dead_pid()  # same user@hostname as the recover below: only the heartbeat says A is live
        info_path.write_text(json.dumps(info))
        taken = target.deployer("recover", "--host", "box", "--runs-dir", str(target.root / "other-runs"))
        assert taken.returncode == 3, taken.stdout + taken.stderr
        assert "heartbeat is fresh" in taken.stderr
        # recover removed nothing under A's feet: the fix still staged beside the untouched file
        assert staged_bytes(target.repo, "pkg/a.py") == FIXED_A and target.file("pkg/a.py") == ORIGINAL_A
        release.touch()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out + err
    finally:
        release.touch()
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert target.file("pkg/a.py") == FIXED_A
    assert git(target.repo, "rev-parse", "HEAD~1").strip() == before


def intent_for(project: Project) -> None:
    """A genuine intent record for RUN: pkg/a.py uploaded, its pre-run bytes in git at HEAD."""
    st = (project.repo / "pkg/a.py").stat()
    record = project.repo / ".git" / "deployer" / "inflight.json"
    record.parent.mkdir(exist_ok=True)
    record.write_text(json.dumps({
        "run_id": RUN, "operator": "op@elsewhere", "host": "box", "started": "2025-01-01T00:00:00.000Z",
        "head_before": project.head(), "trailer": f"Deployer-Run: {RUN}",
        "files": [{"dest": "pkg/a.py", "path": str(project.repo / "pkg/a.py"), "existed": True, "tracked": True,
                   "sha256": hashlib.sha256(ORIGINAL_A.encode()).hexdigest(),
                   "new_sha256": hashlib.sha256(FIXED_A.encode()).hexdigest(), "mode": 0o644,
                   "uid": st.st_uid, "gid": st.st_gid}]}))
    (project.repo / "pkg/a.py").write_text(FIXED_A)


def test_a_recover_takes_over_a_lock_only_once_its_heartbeat_is_older_than_its_ttl(target: Project) -> None:
    target.write_inventory(lock_ttl_s=TTL_S)
    lock, heartbeat = hand_made_lock(target, ours())
    intent_for(target)
    # Everything but the heartbeat says the run is gone: our operator, a dead pid, a lock made long ago.
    backdate(lock, 10 * TTL_S)
    backdate(lock.parent / f"deployer.run.lock.{RUN}", 10 * TTL_S)
    backdate(heartbeat, TTL_S - 10)
    other = str(target.root / "other-runs")
    fresh = target.deployer("recover", "--host", "box", "--runs-dir", other)
    assert fresh.returncode == 3 and "heartbeat is fresh" in fresh.stderr, fresh.stdout + fresh.stderr
    assert target.file("pkg/a.py") == FIXED_A and lock.is_symlink()
    backdate(heartbeat, TTL_S + 10)
    stale = target.deployer("recover", "--host", "box", "--runs-dir", other)
    assert stale.returncode == 0, stale.stdout + stale.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A and not lock.exists()


def test_a_lock_with_a_fresh_heartbeat_is_not_stale_however_old_the_lock_itself_is(target: Project) -> None:
    target.write_inventory(lock_ttl_s=TTL_S)
    lock, heartbeat = hand_made_lock(target, ours())
    backdate(lock, 10 * TTL_S)
    backdate(lock.parent / f"deployer.run.lock.{RUN}", 10 * TTL_S)
    backdate(heartbeat, TTL_S - 10)
    shown = status(target)
    assert f"held by run {RUN}" in shown and "STALE" not in shown, shown


def test_a_lock_whose_heartbeat_is_older_than_its_ttl_is_stale_however_young_the_lock_is(target: Project) -> None:
    target.write_inventory(lock_ttl_s=TTL_S)
    _, heartbeat = hand_made_lock(target, ours())
    backdate(heartbeat, TTL_S + 10)
    shown = status(target)
    assert "STALE" in shown, shown
    # The advice names the host as the inventory does, never a placeholder.
    assert "deployer lock release --host box --force" in shown and "HOST" not in shown, shown


def test_a_lock_being_taken_and_stale_is_advised_with_the_real_host_name(target: Project) -> None:
    target.write_inventory(lock_ttl_s=TTL_S)
    lock = target.repo / ".git" / "deployer.run.lock"
    lock.mkdir()
    backdate(lock, TTL_S + 10)
    shown = status(target)
    assert "being taken" in shown and "deployer lock release --host box --force" in shown, shown


def test_lock_status_shows_no_control_characters_from_a_lock_info_and_says_it_is_not_deployers(
        target: Project) -> None:
    target.write_inventory(lock_ttl_s=TTL_S)
    hand_made_lock(target, ours(operator="\x1b]0;owned\x07\x1b[2Jroot@box"))
    shown = status(target)
    assert "\x1b" not in shown and "\x07" not in shown, shown
    assert "info.json is not deployer's" in shown and "'operator'" in shown and "\\x1b]0;owned" in shown, shown


def test_a_lock_info_of_the_wrong_types_is_held_and_never_taken_over(target: Project) -> None:
    target.write_inventory(lock_ttl_s=TTL_S)
    _, heartbeat = hand_made_lock(target, ours(pid="1; rm -rf /", ttl_s=0.001))
    intent_for(target)
    # A TTL this small would make a live lock look stale at once: the info is not believed.
    shown = status(target)
    assert "'pid'" in shown and "STALE" not in shown, shown
    refused = target.deployer("recover", "--host", "box", "--runs-dir", str(target.root / "other-runs"))
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert target.file("pkg/a.py") == FIXED_A and heartbeat.exists()


def test_a_forced_removal_removes_only_the_lock_that_was_read(tmp_path: Path) -> None:
    # Recover's take-over and `lock release --force` read the lock, then remove it: one another run took in between
    # is that run's, and stays.
    git_dir = tmp_path / ".git"
    git_dir.mkdir()
    link = git_dir / "deployer.run.lock"

    def take(run: str) -> None:
        (git_dir / f"deployer.run.lock.{run}").mkdir()
        (git_dir / f"deployer.run.lock.{run}" / "info.json").write_text(json.dumps({"run_id": run}))
        link.symlink_to(f"deployer.run.lock.{run}")

    with LocalTransport() as transport:
        take("a")
        read = read_state(transport, str(git_dir), TTL_S, "box")
        assert read is not None and read.link == "deployer.run.lock.a"
        link.unlink()  # run a released it, and run b took it: in the one round trip between the read and the removal
        take("b")
        assert not force_release(transport, str(git_dir), read)
        assert os.readlink(link) == "deployer.run.lock.b" and (git_dir / "deployer.run.lock.b").is_dir()
        assert force_release(transport, str(git_dir), read_state(transport, str(git_dir), TTL_S, "box"))
        assert not link.is_symlink() and not (git_dir / "deployer.run.lock.b").exists()
        (git_dir / "deployer.run.lock").mkdir()  # an older deployer's lock: a directory, no link to compare
        older = read_state(transport, str(git_dir), TTL_S, "box")
        assert older is not None and older.link is None
        assert force_release(transport, str(git_dir), older) and not link.exists()
