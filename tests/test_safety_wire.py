"""The wire between deployer and its target: the lock, bounded output, masked tails, timeouts, restarts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_repo import FIXED_A, ORIGINAL_A, Project

TTL_S = 5


def wait_for(predicate: object, seconds: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + seconds
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def run_events(project: Project, run_id: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in (project.runs / run_id / "events.jsonl").read_text().splitlines()]


def remote_bin(project: Project, request: pytest.FixtureRequest) -> Path:
    """A directory first on the PATH of commands deployer runs on the target, for gates."""
    if project.host["transport"] == "ssh":
        return Path(request.getfixturevalue("sshd").workdir) / "fakebin"
    gates = project.root / "gatebin"
    gates.mkdir(exist_ok=True)
    project.extra_env["PATH"] = f"{gates}{os.pathsep}{os.environ['PATH']}"
    return gates


@contextlib.contextmanager
def gate(project: Project, request: pytest.FixtureRequest, program: str, match: str) -> Iterator[Path]:
    """Replace `program` on the target by one that, while `armed` exists, parks (writing its pid) when
    its arguments contain `match`; otherwise it runs the real program. Yields the gate directory."""
    bindir = remote_bin(project, request)
    gatedir = project.root / f"gate-{program}"
    gatedir.mkdir()
    (gatedir / "armed").touch()
    real = f"/bin/{program}" if os.path.exists(f"/bin/{program}") else f"/usr/bin/{program}"
    fake = bindir / program
    fake.write_text(f"""#!/bin/sh
case "$*" in *{match}*) if [ -e {gatedir}/armed ]; then
  echo $$ > {gatedir}/pid.tmp && /bin/mv {gatedir}/pid.tmp {gatedir}/pid; exec sleep 600; fi;; esac
exec {real} "$@"
""")
    fake.chmod(0o755)
    try:
        yield gatedir
    finally:
        fake.unlink()
        pid_file = gatedir / "pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


# -- the lock -------------------------------------------------------------------------------------------

def test_a_lock_whose_info_is_not_written_yet_is_being_taken_never_stale(target: Project) -> None:
    target.write_inventory(lock_ttl_s=TTL_S)
    target.playbook()
    # What an older deployer leaves for a moment between its mkdir and writing info.json.
    (target.repo / ".git" / "deployer.lock").mkdir()
    status = target.deployer("lock", "status", "--host", "box")
    assert status.returncode == 3 and "being taken" in status.stdout
    assert "STALE" not in status.stdout and "--force" not in status.stdout
    second = target.deployer("apply", "fix.yaml", "--host", "box")
    assert second.returncode == 3 and "being taken" in second.stderr
    assert "STALE" not in second.stderr and "--force" not in second.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A


def test_staleness_counts_from_the_locks_own_mtime_plus_its_ttl(target: Project) -> None:
    target.write_inventory(lock_ttl_s=TTL_S)
    lock = target.repo / ".git" / "deployer.lock"
    lock.mkdir()
    # A complete lock without a heartbeat file yet: young by its own mtime, so alive.
    (lock / "info.json").write_text(json.dumps({"run_id": "R1", "operator": "op", "pid": 1, "ttl_s": TTL_S}))
    fresh = target.deployer("lock", "status", "--host", "box")
    assert fresh.returncode == 3 and "held by run R1" in fresh.stdout and "STALE" not in fresh.stdout
    old = time.time() - 3 * TTL_S
    os.utime(lock, (old, old))
    aged = target.deployer("lock", "status", "--host", "box")
    assert aged.returncode == 3 and "STALE" in aged.stdout
    (lock / "info.json").unlink()
    os.utime(lock, (old, old))
    abandoned = target.deployer("lock", "status", "--host", "box")
    assert "being taken" in abandoned.stdout and "STALE" in abandoned.stdout


def test_a_run_killed_while_taking_the_lock_leaves_no_lock_and_a_stray_the_next_run_removes(
        target: Project, request: pytest.FixtureRequest) -> None:
    target.playbook()
    git_dir = target.repo / ".git"
    with gate(target, request, "ln", "deployer.lock.") as gatedir:
        first = target.popen("apply", "fix.yaml", "--host", "box")
        try:
            wait_for(lambda: (gatedir / "pid").exists(), what="the run to reach the link that publishes its lock")
        finally:
            first.kill()  # SIGKILL: the deployer dies between writing its lock and publishing it
            first.communicate(timeout=30)
        # And the target side with it: the lock script parked at its last command, not just that command.
        os.killpg(os.getpgid(int((gatedir / "pid").read_text())), signal.SIGKILL)
        (gatedir / "armed").unlink()
    assert not os.path.lexists(git_dir / "deployer.lock")
    [stray] = [p for p in git_dir.iterdir() if p.name.startswith("deployer.lock.")]
    assert json.loads((stray / "info.json").read_text())["run_id"] == stray.name.removeprefix("deployer.lock.")
    status = target.deployer("lock", "status", "--host", "box")
    assert status.returncode == 0 and "unlocked" in status.stdout
    assert str(stray) in status.stdout and "the next run that takes the lock removes it" in status.stdout
    applied = target.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stderr
    assert target.file("pkg/a.py") == FIXED_A
    assert not [p for p in git_dir.iterdir() if p.name.startswith("deployer.lock")]
    run_id = sorted(target.runs.iterdir())[-1].name
    [acquired] = [e for e in run_events(target, run_id) if e["type"] == "lock_acquired"]
    assert acquired["removed_strays"] == [str(stray)]
