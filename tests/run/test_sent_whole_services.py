"""A playbook that restarts services goes whole (run/whole.py): co_restart's judgement before any change (each
service answers only through the process deployer recorded, its GPUs are listed) is made by the agent inside the
premise. Where the premise does not find so, nothing was changed, and the run judges here as it always did: the
same refusal, in the same words, with the same exit code, over a local target and over sshd."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, work_tree
from fixtures_services import Stack
from polling import within
from test_sent_whole import kinds, state_of

from deployer.demo.run import http_status

pytest_plugins = ["fixtures_repo", "fixtures_ssh", "fixtures_services"]

STEPS = ["local_compile", "upload", "remote_compile", {"commit": {"message": "pkg: answer is 42"}}, "co_restart"]
# The reads a judgement here makes of a service (CommandManager.observe): a chain sent whole makes none of them
# before its commit.
OBSERVE = {"record", "pidfile", "started", "stat", "health"}
# An nvidia-smi that lists GPU 0, idle (what the premise, preflight and the restart's GPU wait read).
NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu=index,*) echo "0, 0, 81920";;
  *--query-gpu=index*) echo 0;;
  *--query-compute-apps*) ;;
esac
"""


def reads_before_the_commit(project: Project) -> list[str]:
    """The actions done on the target before the commit step ran, by key."""
    found = []
    for event in project.events():
        if event["type"] == "step_start" and event.get("step") == "commit":
            break
        if event.get("action"):
            found.append(event["action"])
    return found


def observed_here(project: Project) -> list[str]:
    return [key for key in reads_before_the_commit(project) if key.partition(".")[2] in OBSERVE]


def test_a_playbook_that_restarts_its_services_goes_whole_and_the_premise_judged_them(stack: Stack) -> None:
    project = stack.project
    stack.start_services()
    pids = stack.pids()
    project.playbook(steps=STEPS)
    planned = project.deployer("plan", "fix.yaml", "--host", "box", "--json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["sent_whole"] == {"yes": True, "why_not": None}
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    assert project.file("pkg/a.py") == FIXED_A and set(stack.pids().values()).isdisjoint(pids.values())
    found = kinds(project)
    assert "sent_whole" in found and "sent_whole_declined" not in found
    assert found.index("sent_whole") < found.index("lock_acquired")
    # Not one read of a service before the commit: the agent judged them, inside the premise.
    assert observed_here(project) == []
    assert next(e for e in project.events() if e["type"] == "sent_whole")["judged_there"] == ["co_restart"]
    assert state_of(project)["sent_ahead"] == ["upload", "remote_compile", "commit"]


@contextmanager
def outsider(stack: Stack) -> Iterator[None]:
    """The prefill's server started by hand, not by deployer, answering its health URL; killed with its session
    (the demo server forks its scheduler, which a kill of the server alone would leave)."""
    server = subprocess.Popen(stack.service("prefill")["start"], start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert within(lambda: http_status(stack.service("prefill")["health"]) == 200, 30), "the outside server"
        yield
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def test_a_service_answering_through_no_process_of_deployers_declines_the_premise_and_is_refused_as_before(
        stack: Stack) -> None:
    project = stack.project
    with outsider(stack):
        project.playbook(steps=STEPS)
        tree, head = work_tree(project.repo), project.head()
        result = project.deployer("apply", "fix.yaml", "--host", "box")
        said = " ".join(result.stderr.split())
        assert result.returncode == 1, result.stderr
        assert ("answers 200, but no process deployer started (or adopted) runs prefill: add \"adopt: port\" to "
                "hosts.box.services.prefill in the inventory, or stop it once by hand (judged before the run "
                "touched the target: nothing on it was changed)") in said, result.stderr
        assert work_tree(project.repo) == tree and project.head() == head and project.file("pkg/a.py") == ORIGINAL_A
        assert not (project.repo / ".git/deployer/inflight.json").exists()
        declined = next(e for e in project.events() if e["type"] == "sent_whole_declined")
        assert "service prefill" in declined["reason"] and "answers 200" in declined["reason"]
        assert not [e for e in project.events() if e["type"] in ("step_start", "service_stopped")]
        assert state_of(project)["phase"] == "failed_restored"


def gpu_host(stack: Stack, *, nvidia_smi: bool) -> None:
    """prefill with `gpus: [0]`; the host's PATH finds the fake nvidia-smi only when asked."""
    project = stack.project
    fake = project.root / "fakebin"
    fake.mkdir(exist_ok=True)
    if nvidia_smi:
        (fake / "nvidia-smi").write_text(NVIDIA_SMI)
        (fake / "nvidia-smi").chmod(0o755)
    stack.configure(prefill=stack.service("prefill", gpus=[0], gpu_wait_s=5), decode=stack.service("decode"))
    host: dict[str, Any] = yaml.safe_load(project.inventory.read_text())["hosts"]["box"]
    project.write_inventory(**{**host, "env": {"PATH": f"{fake}:/usr/bin:/bin"}})


def test_a_gpu_service_on_a_host_without_nvidia_smi_is_refused_as_before_with_nothing_changed(stack: Stack) -> None:
    project = stack.project
    gpu_host(stack, nvidia_smi=False)
    project.playbook(steps=STEPS)
    tree, head = work_tree(project.repo), project.head()
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    said = " ".join(result.stderr.split())
    assert result.returncode == 1, result.stderr
    assert "service prefill has gpus: [0], but nvidia-smi --query-gpu=index --format=csv,noheader,nounits " \
           "failed (exit 127)" in said and "(nothing on the target was changed)" in said, result.stderr
    assert work_tree(project.repo) == tree and project.head() == head
    declined = next(e for e in project.events() if e["type"] == "sent_whole_declined")
    assert "service prefill: nvidia-smi does not list GPUs [0]" in declined["reason"]
    assert state_of(project)["phase"] == "failed_restored"


def test_a_gpu_service_whose_gpus_are_listed_goes_whole(stack: Stack) -> None:
    project = stack.project
    gpu_host(stack, nvidia_smi=True)
    project.playbook(steps=STEPS)
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    found = kinds(project)
    assert "sent_whole" in found and "sent_whole_declined" not in found
    assert not [key for key in reads_before_the_commit(project) if key.endswith(".gpus")]
    assert project.file("pkg/a.py") == FIXED_A


BASELINE_FIRST = ["local_compile", {"baseline": {"metric": "sglang:num_prefill_inflight_queue_reqs",
                                                 "interval_s": 0.2}},
                  "upload", {"commit": {"message": "m"}}, "co_restart"]


def test_the_demo_playbook_is_still_sent_in_two_round_trips_for_its_baseline_reads_the_target_first(
        stack: Stack) -> None:
    # The baseline's storm and scrape measure the old build: they run after the lock, before the upload.
    project = stack.project
    demo = Path(__file__).parents[2] / "deployer" / "demo" / "playbook" / "kvpoll-fix.yaml"
    steps = yaml.safe_load(demo.read_text())["steps"]
    assert [next(iter(s)) if isinstance(s, dict) else s for s in steps][:3] == ["local_compile", "baseline", "upload"]
    project.playbook(steps=BASELINE_FIRST)
    planned = project.deployer("plan", "fix.yaml", "--host", "box", "--json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["sent_whole"] == {
        "yes": False, "why_not": "baseline reads the target before the upload"}


def test_a_baseline_first_playbook_has_its_services_judged_in_one_round_trip_before_the_baseline(
        stack: Stack) -> None:
    project = stack.project
    stack.start_services()
    project.playbook(steps=BASELINE_FIRST)
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    # The agent judged both services at once: none of the reads that judge a service here, a few each.
    assert observed_here(project) == [] and project.file("pkg/a.py") == FIXED_A
    assert "sent_whole" not in kinds(project)


def test_a_baseline_first_playbook_still_refuses_a_stranger_on_a_services_port_before_its_baseline(
        stack: Stack) -> None:
    project = stack.project
    with outsider(stack):
        project.playbook(steps=BASELINE_FIRST)
        tree, head = work_tree(project.repo), project.head()
        result = project.deployer("apply", "fix.yaml", "--host", "box")
        assert result.returncode == 1, result.stderr
        assert "answers 200, but no process deployer started (or adopted) runs prefill" in \
            " ".join(result.stderr.split()), result.stderr
        assert work_tree(project.repo) == tree and project.head() == head
        assert not [e for e in project.events() if e["type"] == "step_start"]  # no baseline ran
        assert {"prefill.record", "prefill.health"} <= set(observed_here(project))  # read here, to say it
