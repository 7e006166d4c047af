"""`deployer restart --host H [SERVICE...]`: co_restart as a run of its own, over real services (local and over
a real sshd): a new pid that answers health, a run of kind restart in `runs list`, the host's lock taken like
any run's, and no file of the target changed."""

from __future__ import annotations

import json
import os
import signal
import sys

from fixtures_repo import Project, hold_lock, work_tree
from fixtures_services import GAUGE, Stack, wait_dead

pytest_plugins = ["fixtures_repo", "fixtures_ssh", "fixtures_services"]


def newest(project: Project) -> dict[str, object]:
    listed = project.deployer("runs", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    return dict(json.loads(listed.stdout)["runs"][-1])


def test_restart_of_one_service_gives_it_a_new_pid_that_answers_health_in_a_run_of_kind_restart(
        target: Project, stack: Stack) -> None:
    stack.start_services()
    before, tree, head = stack.pids(), work_tree(target.repo), target.head()
    done = target.deployer("restart", "--host", "box", "prefill")
    assert done.returncode == 0, done.stdout + done.stderr
    after = stack.pids()
    assert after["prefill"] != before["prefill"] and after["decode"] == before["decode"]
    assert wait_dead(before["prefill"])
    assert stack.fetch(f"http://127.0.0.1:{stack.ports['prefill']}/health") == "ok\n"
    run = newest(target)
    assert (run["kind"], run["status"], run["host"]) == ("restart", "successful", "box")
    restarts = [e for e in target.events(str(run["run_id"])) if e["type"] == "restart"]
    assert restarts[0]["pids"] == {"prefill": {"old": before["prefill"], "new": after["prefill"]}}
    assert (work_tree(target.repo), target.head()) == (tree, head)
    state = json.loads((target.runs / str(run["run_id"]) / "state.json").read_text())
    assert (state["kind"], state["phase"]) == ("restart", "succeeded")
    assert not (target.repo / ".git" / "deployer.run.lock").exists()
    verified = target.deployer("runs", "verify", str(run["run_id"]), "--target")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_restart_of_a_service_that_is_down_brings_it_up(target: Project, stack: Stack) -> None:
    stack.start_services()
    dead = stack.pids()["decode"]
    os.killpg(dead, signal.SIGKILL)
    assert wait_dead(dead)
    done = target.deployer("restart", "--host", "box", "decode")
    assert done.returncode == 0, done.stdout + done.stderr
    assert stack.pids()["decode"] != dead
    assert stack.fetch(f"http://127.0.0.1:{stack.ports['decode']}/health") == "ok\n"


def test_restart_while_another_run_holds_the_lock_exits_3_and_restarts_nothing(target: Project,
                                                                              stack: Stack) -> None:
    stack.start_services()
    before = stack.pids()
    hold_lock(target)
    refused = target.deployer("restart", "--host", "box", "prefill")
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "lock" in refused.stderr and stack.pids() == before


def test_a_restart_whose_service_cannot_start_exits_5_naming_it_with_the_command_to_try_again(
        target: Project, stack: Stack) -> None:
    stack.start_services()
    stack.configure(prefill=stack.service("prefill", start=[sys.executable, "-c", "raise SystemExit(3)"],
                                          health_timeout_s=3), decode=stack.service("decode"))
    failed = target.deployer("restart", "--host", "box", "prefill")
    assert failed.returncode == 5, failed.stdout + failed.stderr
    assert "Down on box: prefill (" in failed.stderr
    assert "Bring them back with: deployer restart --host box prefill" in failed.stderr
    # Settled as a run that changed nothing: the next run is not blocked by an intent record.
    assert not (target.repo / ".git" / "deployer" / "inflight.json").exists()
    assert newest(target)["kind"] == "restart"


def test_restart_with_a_playbook_runs_its_post_commit_checks_too(target: Project, stack: Stack) -> None:
    stack.start_services()
    stack.set_gauge(3.0)
    target.playbook(name="drain.yaml", steps=["upload", {"commit": {"message": "m"}}, {"co_restart": {}},
                                              {"drain": {"metric": GAUGE, "to": 0, "within_s": 2,
                                                         "interval_s": 0.1}}])
    undrained = target.deployer("restart", "--host", "box", "prefill", "-p", "drain.yaml")
    assert undrained.returncode == 5, undrained.stdout + undrained.stderr
    assert "drain" in undrained.stderr
    stack.set_gauge(0.0)
    drained = target.deployer("restart", "--host", "box", "prefill", "-p", "drain.yaml")
    assert drained.returncode == 0, drained.stdout + drained.stderr
    steps = [e["step"] for e in target.events() if e["type"] == "step_end"]
    assert steps == ["co_restart", "drain"]
