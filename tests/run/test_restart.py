"""`deployer restart --host H [SERVICE...]`: co_restart as a run of its own, over real services (local and over
a real sshd): a new pid that answers health, a run of kind restart in `runs list`, the host's lock taken like
any run's, and no file of the target changed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fixtures_repo import ORIGINAL_A, Project, act_when, hold_lock, init_repo, work_tree
from fixtures_services import GAUGE, Stack, wait_dead
from ports import free_port

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


def test_a_ctrl_c_in_a_restart_lets_it_finish_rather_than_leave_a_service_down(target: Project,
                                                                                stack: Stack) -> None:
    """SIGINT while decode's start waits at a gate (prefill already up again, decode stopped): stopped there, the
    restart would leave decode launched and never proven. It goes on to its end and succeeds."""
    from test_recover_restart import DECODE_STARTING, gated_decode, logged_since

    stack.start_services()
    gate = gated_decode(target, stack)
    before, runs = stack.pids(), set(target.runs.iterdir())

    def ctrl_c(proc: subprocess.Popen[str]) -> None:
        proc.send_signal(signal.SIGINT)
        gate.touch()

    done = act_when(target, ["restart", "--host", "box", "prefill", "decode"],
                    lambda: logged_since(target, runs, DECODE_STARTING), ctrl_c, "decode's start")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SIGINT: the restart goes on to its end first" in done.stderr, done.stderr
    after = stack.pids()
    assert all(after[name] != before[name] for name in before), (before, after)
    assert all(stack.fetch(f"http://127.0.0.1:{port}/health") == "ok\n" for port in stack.ports.values())


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


PAIR = ("node-b", "node-a")  # listed unsorted: the restart goes in sorted order


def recorded(project: Project, host: str) -> int | None:
    pidfile = project.root / host / "repo" / ".git" / "deployer" / "web.pid"
    return int(pidfile.read_text()) if pidfile.exists() else None


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Project]:
    """Two local hosts, each with one http.server service, in a group `pair` that is no unit."""
    www = tmp_path / "www"
    www.mkdir()
    (www / "health").write_text("ok\n")
    hosts = {}
    for name in PAIR:
        init_repo(tmp_path / name / "repo", {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A})
        port = free_port()
        server = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(www)]
        hosts[name] = {"transport": "local", "repo": str(tmp_path / name / "repo"), "python": sys.executable,
                       "services": {"web": {"start": server, "health": f"http://127.0.0.1:{port}/health",
                                            "health_timeout_s": 20, "stop_grace_s": 2}}}
    project = Project(root=tmp_path, repo=tmp_path / "node-a" / "repo", host=hosts["node-a"], host_name="node-a")
    project.inventory.write_text(yaml.safe_dump({"hosts": hosts, "groups": {"pair": list(PAIR)}}, sort_keys=False))
    yield project
    for name in PAIR:
        pid = recorded(project, name)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def test_restart_of_a_group_restarts_each_host_in_turn_each_its_own_run(pair: Project) -> None:
    first = pair.deployer("restart", "--host", "pair")
    # Before: refused with exit 2 ("restart one host (or one unit) at a time").
    assert first.returncode == 0, first.stdout + first.stderr
    before = {name: recorded(pair, name) for name in PAIR}
    assert None not in before.values()
    again = pair.deployer("restart", "--host", "pair", "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    document = json.loads(again.stdout)  # one document for the group, as --json promises
    assert sorted(document["hosts"]) == sorted(PAIR) and document["exit_code"] == 0
    after = {name: recorded(pair, name) for name in PAIR}
    assert all(after[name] not in (None, before[name]) for name in PAIR)
    assert all(wait_dead(pid) for pid in before.values() if pid is not None)
    runs = json.loads(pair.deployer("runs", "list", "--json").stdout)["runs"]
    assert [(r["kind"], r["host"], r["status"]) for r in runs[-2:]] == [
        ("restart", "node-a", "successful"), ("restart", "node-b", "successful")]


def test_restart_of_a_group_stops_at_the_first_host_that_fails_with_its_exit_code(pair: Project) -> None:
    inventory = yaml.safe_load(pair.inventory.read_text())
    inventory["hosts"]["node-a"]["services"]["web"].update(start=[sys.executable, "-c", "raise SystemExit(3)"],
                                                            health_timeout_s=3)
    pair.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    failed = pair.deployer("restart", "--host", "pair")
    assert failed.returncode == 5, failed.stdout + failed.stderr
    assert "Down on node-a: web (" in failed.stderr
    # node-b, after it in sorted order, was never run: no run, nothing started.
    runs = json.loads(pair.deployer("runs", "list", "--json").stdout)["runs"]
    assert [r["host"] for r in runs] == ["node-a"]
    assert recorded(pair, "node-b") is None
