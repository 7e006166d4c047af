"""A paused rollout goes on with exactly the fix its first batch got, by one resume or abort at a time; a signal
(during a timed pause, or inside a batch) leaves a run that resume and abort take; both find a fleet run by a
beginning of its id among fleet runs, and `runs list --state paused` lists it (issue 37 item 3, as a new user broke
it): three `transport: local` hosts, each its own repo, the deployer CLI run as a person runs it."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, deployer, deployer_env, git, target_python
from test_fleet import BOUNDED, as_json
from test_rollout_steps_reached import HOSTS as NAMES
from test_rollout_steps_reached import local_fleet

__all__ = ["local_fleet"]  # the fixture, used by name

PAUSE_AFTER_FIRST = {"batches": [1], "steps": ["batch", {"pause": {}}]}
OTHER_FIX = "def answer():\n    return 43\n"


def a_py(project: Project, host: str) -> str:
    return (project.root / host / "repo" / "pkg" / "a.py").read_text()


def fleet_json(project: Project, fleet_id: str) -> dict[str, Any]:
    data = json.loads((project.runs / fleet_id / "fleet.json").read_text())
    assert isinstance(data, dict)
    return data


def paused_after_first(project: Project) -> str:
    project.playbook(steps=BOUNDED, rollout=PAUSE_AFTER_FIRST)
    result = project.deployer("apply", "fix.yaml", "--host", ",".join(NAMES), "--json")
    report = as_json(result)
    assert result.returncode == 8 and report["status"] == "paused", report
    return str(report["fleet_id"])


def resume(project: Project, *args: str) -> Any:
    """`rollout resume` from another directory with only the runs dir in its environment (no inventory)."""
    other = project.root / "elsewhere"
    other.mkdir(exist_ok=True)
    return deployer("rollout", *args, cwd=other, env=deployer_env(DEPLOYER_RUNS_DIR=str(project.runs)), timeout=120)


def until(condition: Any, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


def test_resume_refuses_when_a_file_the_playbook_ships_changed_since_the_first_batch(local_fleet: Project) -> None:
    fleet_id = paused_after_first(local_fleet)
    local_fleet.write("fix/a.py", OTHER_FIX)  # the playbook's own bytes are the same
    refused = resume(local_fleet, "resume", fleet_id, "--json")
    error = as_json(refused)["error"]
    assert refused.returncode == 2, error
    assert str((local_fleet.root / "fix/a.py").resolve()) in error and "put it back, or abort" in error, error
    assert a_py(local_fleet, "h2") == ORIGINAL_A and a_py(local_fleet, "h3") == ORIGINAL_A  # nothing went on
    assert fleet_json(local_fleet, fleet_id)["status"] == "paused"
    local_fleet.write("fix/a.py", FIXED_A)  # put back: it goes on, every host on the one fix
    done = resume(local_fleet, "resume", fleet_id, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(a_py(local_fleet, h) == FIXED_A for h in NAMES)
    # Finished: nothing to abort, and abort says what rolls a finished fleet run back.
    finished = resume(local_fleet, "abort", fleet_id, "--json")
    error = as_json(finished)["error"]
    assert finished.returncode == 2 and f"not paused (it is successful); to roll back what it did: deployer " \
        f"rollback {fleet_id}" in error, error


def test_resume_and_abort_take_a_beginning_of_the_id_among_fleet_runs_only(local_fleet: Project) -> None:
    fleet_id = paused_after_first(local_fleet)
    second = fleet_id[:16]  # e.g. 20261203T143907.: the fleet's own first sub-run often begins with it too
    sub_run = fleet_json(local_fleet, fleet_id)["hosts"]["h1"]["run_id"]
    shutil.copytree(local_fleet.runs / sub_run, local_fleet.runs / f"{second}999Z-ffffff")
    aborted = resume(local_fleet, "abort", second, "--json")
    assert aborted.returncode == 0 and as_json(aborted)["status"] == "aborted", aborted.stdout + aborted.stderr
    assert a_py(local_fleet, "h1") == ORIGINAL_A


def gated(project: Project) -> Path:
    """Every host's remote_compile waits until the returned path exists (in its repo, .git/gate-waiting says it
    waits)."""
    gate = project.root / "gate"
    held = target_python(project, f"touch .git/gate-waiting; while [ ! -e {gate} ]; do sleep 0.05; done")
    inventory = yaml.safe_load(project.inventory.read_text())
    for host in inventory["hosts"].values():
        host["python"] = held
    project.inventory.write_text(yaml.safe_dump(inventory))
    return gate


def stopped_while_compiling(proc: subprocess.Popen[str], gate: Path, host: Path,
                            also: Callable[[], bool] = lambda: True) -> tuple[str, str]:
    """SIGINT to proc once host's compile waits at the gate (and `also` holds); the gate opened once the stop is
    said: a first signal stops at the next safe point, so the command running then finishes first (a compile held
    for ever would hold the stop with it). Its stdout and stderr."""
    outs: list[str] = []
    errors: list[str] = []  # read as they come: the signal's line first
    readers = [threading.Thread(target=lambda: outs.extend(proc.stdout or []), daemon=True),
               threading.Thread(target=lambda: errors.extend(proc.stderr or []), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        until(lambda: (host / "repo" / ".git" / "gate-waiting").exists() and also())
        proc.send_signal(signal.SIGINT)
        until(lambda: any("SIGINT" in line for line in errors))
        gate.touch()
        proc.wait(timeout=60)
    finally:
        gate.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for reader in readers:
        reader.join(timeout=10)
    return "".join(outs), "".join(errors)


def deploy_commits(project: Project, host: str) -> int:
    return int(git(project.root / host / "repo", "rev-list", "--count", "--grep=^Deployer-Run: ", "HEAD").strip())


@contextlib.contextmanager
def resuming(project: Project, fleet_id: str) -> Iterator[subprocess.Popen[str]]:
    """`rollout resume` of the paused fleet run, held inside its next batch (h2 running: its remote_compile waits
    for a gate) while the block runs; then let go, and it must finish the run successfully."""
    gate = gated(project)
    first = project.popen("rollout", "resume", fleet_id, "--json")
    try:
        until(lambda: fleet_json(project, fleet_id)["hosts"]["h2"]["status"] == "running")
        yield first
        gate.touch()
        out, err = first.communicate(timeout=120)
    finally:
        gate.touch()
        if first.poll() is None:
            first.kill()
    report = json.loads(out)
    assert first.returncode == 0 and report["status"] == "successful", (report, err)


def test_a_second_resume_of_the_same_fleet_run_is_refused_at_once_and_the_first_finishes_it(
        local_fleet: Project) -> None:
    fleet_id = paused_after_first(local_fleet)
    with resuming(local_fleet, fleet_id) as first:
        second = resume(local_fleet, "resume", fleet_id, "--json")
        error = as_json(second)["error"]
        assert second.returncode == 3, error
        assert f"rollout resume (pid {first.pid}) is running on it" in error, error
        plain = resume(local_fleet, "resume", fleet_id)  # as a person reads it: refused, no fleet outcome, no recover
        assert plain.returncode == 3 and "is running on it" in plain.stderr, plain.stdout + plain.stderr
        assert "failed (exit" not in plain.stdout + plain.stderr and "recover" not in plain.stdout + plain.stderr
        assert fleet_json(local_fleet, fleet_id)["hosts"]["h2"]["status"] == "running"  # left as the first has it
    saved = fleet_json(local_fleet, fleet_id)
    assert saved["status"] == "successful" and all(saved["hosts"][h]["run_id"] for h in NAMES), saved
    assert all(a_py(local_fleet, h) == FIXED_A for h in NAMES)
    # A claim left by a process that ended is no claim: the next one takes it (here: nothing left to resume).
    again = resume(local_fleet, "resume", fleet_id, "--json")
    assert again.returncode == 2 and "is not paused (it is successful)" in as_json(again)["error"]


def test_a_signal_during_a_timed_pause_leaves_the_run_paused_exit_130_and_resume_finishes_it(
        local_fleet: Project) -> None:
    local_fleet.playbook(steps=BOUNDED, rollout={"batches": [1], "steps": ["batch", {"pause": {"duration": "5m"}}]})
    proc = local_fleet.popen("apply", "fix.yaml", "--host", ",".join(NAMES), "--json")
    try:
        def pausing() -> bool:
            fleets = [p for p in local_fleet.runs.glob("*/fleet.json")] if local_fleet.runs.is_dir() else []
            return bool(fleets) and bool(json.loads(fleets[0].read_text()).get("pauses"))
        until(pausing)
        fleet_id = json.loads(next(local_fleet.runs.glob("*/fleet.json")).read_text())["fleet_id"]
        early = resume(local_fleet, "resume", fleet_id, "--json")  # the apply still waits: it holds the run
        assert early.returncode == 3 and f"deployer apply (pid {proc.pid}) is running on it" in \
            as_json(early)["error"], early.stdout
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    report = json.loads(out)
    assert proc.returncode == 130 and report["status"] == "paused" and report["fleet_id"] == fleet_id, (report, err)
    [pause] = fleet_json(local_fleet, fleet_id)["pauses"]
    assert pause["ended"] is None and pause["before_batch"] == 1, pause
    assert pause["reason"].startswith("interrupted during a timed pause"), pause
    assert f"deployer rollout resume {fleet_id}" in report["error"]
    assert a_py(local_fleet, "h2") == ORIGINAL_A
    done = resume(local_fleet, "resume", fleet_id, "--json")
    assert done.returncode == 0 and as_json(done)["status"] == "successful", done.stdout + done.stderr
    assert all(a_py(local_fleet, h) == FIXED_A for h in NAMES)
    assert fleet_json(local_fleet, fleet_id)["pauses"][0]["ended_by"] == "resume"
    assert deploy_commits(local_fleet, "h1") == 1  # h1 not done again


def test_runs_list_state_paused_lists_the_paused_fleet_runs(local_fleet: Project) -> None:
    fleet_id = paused_after_first(local_fleet)
    listed = local_fleet.deployer("runs", "list", "--state", "paused", "--json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert [fleet["fleet_id"] for fleet in as_json(listed)["fleets"]] == [fleet_id], listed.stdout
    other = local_fleet.deployer("runs", "list", "--state", "aborted", "--json")
    assert other.returncode == 0 and as_json(other)["fleets"] == [], other.stdout + other.stderr


def test_a_resume_interrupted_inside_a_batch_says_what_next_and_is_resumed_doing_the_canceled_hosts_again(
        local_fleet: Project) -> None:
    fleet_id = paused_after_first(local_fleet)
    gate = gated(local_fleet)
    proc = local_fleet.popen("rollout", "resume", fleet_id, "--json")
    out, err = stopped_while_compiling(proc, gate, local_fleet.root / "h2", lambda: (
        fleet_json(local_fleet, fleet_id)["hosts"]["h2"]["run_id"] is None
        and fleet_json(local_fleet, fleet_id)["hosts"]["h2"]["status"] == "running"))
    report = json.loads(out)
    assert proc.returncode == 130 and report["status"] == "canceled", (report, err)
    assert f"go on with: deployer rollout resume {fleet_id}" in report["error"], report["error"]
    assert f"deployer rollout abort {fleet_id}" in report["error"]
    assert a_py(local_fleet, "h2") == ORIGINAL_A  # canceled before its commit: put back
    gate.touch()
    done = resume(local_fleet, "resume", fleet_id, "--json")
    finished = as_json(done)
    assert done.returncode == 0 and finished["status"] == "successful", finished
    assert all(a_py(local_fleet, h) == FIXED_A and deploy_commits(local_fleet, h) == 1 for h in NAMES)
    assert finished["hosts"]["h1"]["run_id"] == fleet_json(local_fleet, fleet_id)["hosts"]["h1"]["run_id"]


def test_an_apply_interrupted_inside_its_first_batch_is_aborted_like_a_paused_one(local_fleet: Project) -> None:
    gate = gated(local_fleet)
    local_fleet.playbook(steps=BOUNDED, rollout=PAUSE_AFTER_FIRST)
    proc = local_fleet.popen("apply", "fix.yaml", "--host", ",".join(NAMES), "--json")
    out, err = stopped_while_compiling(proc, gate, local_fleet.root / "h1")
    report = json.loads(out)
    assert proc.returncode == 130 and report["status"] == "canceled", (report, err)
    fleet_id = report["fleet_id"]
    aborted = resume(local_fleet, "abort", fleet_id, "--json")
    document = as_json(aborted)
    assert aborted.returncode == 0 and document["status"] == "aborted" and document["rollback"] is None, document
    assert "nothing had committed" in document["message"]
    assert all(a_py(local_fleet, h) == ORIGINAL_A for h in NAMES)
