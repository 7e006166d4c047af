"""A service is a process tree, and its stop is proven: every process of its session is signalled, what
outlives stop_grace_s is KILLed, and the stop is done only when none of them lives and its port is free.

Over real processes, local and over sshd: the demo server forks a scheduler child that, like SGLang's, ignores
TERM, holds the server's listening socket and outlives a killed server (here in a process group of its own)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fixtures_repo import Project, git
from ports import demo_ports, free_port
from proctree_helpers import in_sessions, kill_sessions, recorded_pid, restart_playbook

from deployer.demo.run import DemoStack

pytest_plugins = ["fixtures_repo", "fixtures_ssh"]


def run_events(project: Project) -> list[dict[str, Any]]:
    run = project.runs / project.newest_run()
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


@pytest.fixture
def started() -> Iterator[set[int]]:
    """Session ids the test saw started: every process of them is KILLed at the end, whatever happened."""
    sids: set[int] = set()
    yield sids
    kill_sessions(sids)


def demo_prefill(target: Project) -> DemoStack:
    """The demo's prefill server as the target's only service, with a scheduler child that leaves the server's
    group and a server that ignores TERM longer than the stop's grace (so the stop must KILL)."""
    stack = DemoStack(target.root / "demo", demo_ports()[0], runs=("prefill",))
    stack.create()
    shape = stack.host().model_dump(mode="json", exclude_defaults=True)
    shape["services"]["prefill"].update(stop_grace_s=1, env={"SGLANG_DEMO_SCHEDULER_OWN_GROUP": "1",
                                                             "SGLANG_DEMO_STOP_HANG_S": "30"})
    connection = {k: v for k, v in target.host.items() if k not in ("repo", "python")}
    target.repo = stack.repo
    target.write_inventory(**{**shape, **connection})
    return stack


def apply(target: Project, started: set[int], name: str) -> Any:
    result = target.deployer("apply", "fix.yaml", "--host", "box", timeout=180)
    pid = recorded_pid(target.repo, name)
    if pid is not None:
        started.add(pid)
    return result


def test_a_restart_kills_a_scheduler_that_left_the_group_ignores_term_and_holds_the_port(
        target: Project, started: set[int]) -> None:
    stack = demo_prefill(target)
    restart_playbook(target, "python/sglang/__init__.py", "# touched by the test\n")
    first = apply(target, started, "prefill")
    assert first.returncode == 0, first.stdout + first.stderr
    old = recorded_pid(target.repo, "prefill")
    assert old is not None
    tree = in_sessions({old})
    assert len(tree) >= 2, f"the demo server forked no scheduler: {tree}"

    target.write("fix/touched.py", "# touched again\n")
    second = apply(target, started, "prefill")
    # Before: the stop waited for the leader only; the orphaned scheduler kept the port and the new server died
    # with "Address already in use".
    assert second.returncode == 0, second.stdout + second.stderr
    assert in_sessions({old}) == [], "a process of the old tree outlived the stop"
    new = recorded_pid(target.repo, "prefill")
    assert new not in (None, old)
    assert stack.url("prefill", "") and git(target.repo, "log", "--format=%s", "-1").strip() == "touch"
    events = run_events(target)
    killed = [e for e in events if e["type"] == "signal" and e.get("action") == "prefill.kill"]
    assert killed, "the run log records no KILL of the old tree"
    assert set(killed[0]["signalled"]) == {str(pid) for pid in tree}
    [listing] = [e for e in events if e["type"] == "procs" and e.get("action") == "prefill.stopping"]
    alive = [p for p in listing["procs"] if p["state"] != "Z"]
    assert {p["pid"] for p in alive} == set(tree)  # what was KILLed, with its command line
    assert all("sglang.launch_server" in p["cmdline"] for p in alive), listing
    assert [e["phase"] for e in events if e["type"] == "service_phase"][:1] == ["stopping"]


def test_a_child_in_the_same_group_that_ignores_term_is_killed_before_the_restart_starts(
        target: Project, started: set[int]) -> None:
    port = free_port()
    # The child ignores TERM (an ignored signal stays ignored across exec) and holds no port: only the tree
    # listing shows it.
    script = (f'(trap "" TERM; exec sleep 600) & exec {sys.executable} -m http.server {port} --bind 127.0.0.1 '
              f'--directory {target.root}')
    (target.root / "health").write_text("ok\n")
    target.write_inventory(services={"web": {"start": ["sh", "-c", script], "health": f"http://127.0.0.1:{port}/health",
                                             "stop_grace_s": 1, "health_timeout_s": 20}})
    restart_playbook(target, "pkg/b.py", "VALUE = 2\n")
    first = apply(target, started, "web")
    assert first.returncode == 0, first.stdout + first.stderr
    old = recorded_pid(target.repo, "web")
    assert old is not None and len(in_sessions({old})) == 2
    target.write("fix/touched.py", "VALUE = 3\n")
    began = time.monotonic()
    second = apply(target, started, "web")
    assert second.returncode == 0, second.stdout + second.stderr
    # Before: TERM to the group ended the server, the stop was "done", and the sleep lived on.
    assert in_sessions({old}) == [], "the child that ignored TERM outlived the stop"
    assert time.monotonic() - began < 60
    events = run_events(target)
    [listing] = [e for e in events if e["type"] == "procs" and e.get("action") == "web.stopping"]
    assert [p["cmdline"] for p in listing["procs"] if p["state"] != "Z"] == ["sleep 600"], listing
    assert any(e["type"] == "signal" and e.get("action") == "web.kill" for e in events)
    # The leader went on TERM; the wait for the rest of its tree is a phase of its own.
    assert [e["phase"] for e in events if e["type"] == "service_phase"][:2] == ["stopping", "waiting_tree"]
