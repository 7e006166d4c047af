"""co_restart, baseline and drain against real processes and real HTTP scrapes, over every transport."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_repo import FIXED_A, LOOPBACK_TRANSPORTS, Project, git, tree_snapshot
from fixtures_services import GAUGE, Stack, alive, code_following, free_port, gauge_server, wait_dead

pytestmark = pytest.mark.long  # tests/conftest.py: scheduled first


def restart_only(project: Project, **extra: Any) -> None:
    project.playbook(steps=[{"co_restart": extra}])


@pytest.mark.parametrize("target", LOOPBACK_TRANSPORTS, indirect=True)
def test_co_restart_changes_every_pid_and_restarts_in_order(stack: Stack) -> None:
    project = stack.project
    restart_only(project)
    first = project.deployer("apply", "fix.yaml", "--host", "box")
    assert first.returncode == 0, first.stderr
    old = stack.pids()
    second = project.deployer("apply", "fix.yaml", "--host", "box")
    assert second.returncode == 0, second.stderr
    new = stack.pids()
    assert set(new) == {"prefill", "decode"}
    assert all(new[name] != old[name] for name in new)
    assert all(wait_dead(pid) for pid in old.values())
    order = [(e["type"], e["service"]) for e in project.events() if e["type"] in ("service_stopped", "service_started")]
    assert order == [("service_stopped", "decode"), ("service_stopped", "prefill"),
                     ("service_started", "prefill"), ("service_started", "decode")]
    restart = next(e for e in project.events() if e["type"] == "restart")
    assert restart["pids"]["prefill"] == {"old": old["prefill"], "new": new["prefill"]}


def test_a_service_that_never_becomes_healthy_fails_with_its_log_tail(stack: Stack) -> None:
    project = stack.project
    never = {"start": [sys.executable, "-c", "import time; print('boom: cannot load model', flush=True); "
                                             "time.sleep(60)"],
             "health": f"http://127.0.0.1:{free_port()}/health", "health_timeout_s": 2, "stop_grace_s": 1}
    stack.configure(prefill=never)
    restart_only(project)
    started = time.monotonic()
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1
    assert time.monotonic() - started < 30
    assert "service prefill" in result.stderr and "did not answer 200 within 2s" in result.stderr
    assert "boom: cannot load model" in result.stderr


def test_a_service_that_exits_at_start_fails_with_its_log_tail(stack: Stack) -> None:
    project = stack.project
    crash = {"start": [sys.executable, "-c", "import sys; sys.exit('fatal: CUDA out of memory')"],
             "health": f"http://127.0.0.1:{free_port()}/health", "health_timeout_s": 20}
    stack.configure(prefill=crash)
    restart_only(project)
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1
    assert "exited during start-up" in result.stderr and "CUDA out of memory" in result.stderr


def test_a_stop_that_ignores_term_is_killed_after_the_grace_period(stack: Stack) -> None:
    project = stack.project
    stubborn = stack.service("prefill", stop_grace_s=1.5)
    stubborn["start"] = ["sh", "-c", 'trap "" TERM; exec "$@"', "sh", *stubborn["start"]]
    stack.configure(prefill=stubborn)
    restart_only(project)
    assert project.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    old = stack.pids()["prefill"]
    started = time.monotonic()
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started >= 1.5
    assert wait_dead(old)
    stopped = next(e for e in project.events() if e["type"] == "service_stopped" and e["service"] == "prefill")
    assert stopped["how"] == "killed after 1.5s grace"


def drain_playbook(project: Project, **drain: Any) -> None:
    project.playbook(steps=[{"drain": {"metric": GAUGE, "to": 0, "interval_s": 0.2, "within_s": 10, **drain}}])


def logged_samples(project: Project) -> int:
    """Metric samples in the newest run's log so far; a line still being written is not counted."""
    runs = sorted(project.runs.iterdir()) if project.runs.exists() else []
    if not runs or not (runs[-1] / "events.jsonl").exists():
        return 0
    return sum('"type": "sample"' in line or '"type":"sample"' in line
               for line in (runs[-1] / "events.jsonl").read_text().splitlines())


def wait_for_sample(project: Project, proc: subprocess.Popen[str], seconds: float = 60) -> None:
    """Block until the running apply has logged its first metric sample (a condition, not a delay)."""
    deadline = time.monotonic() + seconds
    while logged_samples(project) == 0:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the drain never took its first sample"
        time.sleep(0.02)


@pytest.mark.parametrize("target", LOOPBACK_TRANSPORTS, indirect=True)
def test_drain_passes_when_the_gauge_drains_and_holds(stack: Stack) -> None:
    project = stack.project
    stack.start_services()
    drain_playbook(project, within_s=120)
    proc = project.popen("apply", "fix.yaml", "--host", "box")
    try:
        wait_for_sample(project, proc)  # the gauge reads 3 until the drain has seen it do so
        stack.set_gauge(0.0)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out + err
    values = [e["value"] for e in project.events() if e["type"] == "sample"]
    assert values[0] == 3.0 and values[-3:] == [0.0, 0.0, 0.0]


def test_drain_on_a_missing_metric_is_inconclusive(stack: Stack) -> None:
    project = stack.project
    stack.start_services()
    drain_playbook(project, metric="sglang:no_such_gauge", within_s=1.5)
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1
    assert "inconclusive" in result.stderr and "sglang:no_such_gauge" in result.stderr


@pytest.mark.parametrize("target", LOOPBACK_TRANSPORTS, indirect=True)
def test_drain_times_out_with_the_last_samples(stack: Stack) -> None:
    project = stack.project
    stack.start_services()
    drain_playbook(project, within_s=1.5, labels={"tp_rank": "0"})
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1
    # However many polls a busy machine fits in 1.5 s, the message lists the ones logged.
    values = [e["value"] for e in project.events() if e["type"] == "sample"]
    assert values and set(values) == {3.0}
    shown = ", ".join("3" for _ in values[-8:])
    assert f"did not reach <= 0 for 3 polls within 1.5s (last samples: {shown})" in result.stderr


def code_serving(stack: Stack) -> None:
    """Services that load the target's code at start and answer /health with pkg.a.answer() (a process not
    restarted after a revert still answers 42), serving the gauge the test sets."""
    stack.configure(**{name: {**stack.service(name), "start": gauge_server(stack.project.root, port,
                                                                           stack.project.repo, stack.www,
                                                                           follows_code=False),
                              # no __pycache__ in the target's work tree
                              "env": {"PYTHONDONTWRITEBYTECODE": "1"}}
                       for name, port in stack.ports.items()})


def answers(stack: Stack) -> dict[str, str]:
    return {name: stack.fetch(f"http://127.0.0.1:{port}/health") for name, port in stack.ports.items()}


@pytest.mark.parametrize("target", LOOPBACK_TRANSPORTS, indirect=True)
def test_drain_failure_after_commit_rolls_back_restarts_and_judges_the_old_build_by_its_baseline_without_a_storm(
        stack: Stack) -> None:
    # The fix leaves the gauge at 3; the reverted build drains it: only a drain after the revert passes.
    project = code_following(stack)
    assert answers(stack) == {"prefill": "41", "decode": "41"}
    pre_tree = git(project.repo, "rev-parse", "HEAD^{tree}").strip()
    project.playbook(steps=[{"baseline": {"metric": GAUGE, "interval_s": 0.1, "within_s": 10}},
                            "local_compile", "upload", "remote_compile", {"commit": {"message": "fix"}},
                            "co_restart", {"storm": {"requests": 5, "concurrency": 1, "client_timeout_s": 5}},
                            {"drain": {"metric": GAUGE, "to": 0, "interval_s": 0.2, "within_s": 1.5}}],
                     on_failure="rollback")
    before_pids = stack.pids()
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 5, result.stderr
    assert "Rolled back" in result.stderr and "last samples" in result.stderr
    assert git(project.repo, "rev-parse", "HEAD^{tree}").strip() == pre_tree
    log = git(project.repo, "log", "--format=%B", "-1")
    run_id = sorted(project.runs.iterdir())[-1].name
    assert f"Deployer-Rollback-Of: {run_id}" in log
    assert git(project.repo, "status", "--porcelain") == ""
    # As a manual `deployer rollback`: the restart and the drain after the revert, never the storm again.
    ended = [(e["step"], e["status"]) for e in project.events() if e["type"] == "step_end"]
    assert ("drain", "failed") in ended and ended[-2:] == [("rollback:co_restart", "ok"), ("rollback:drain", "ok")]
    assert "rollback:storm" not in [step for step, _ in ended]
    assert (stack.www / "posts").read_text().splitlines() == ["/generate"] * 5  # the forward storm alone
    # The rollback's own restart: the forward co_restart's new PIDs are the rollback's old ones,
    # and they were replaced again by processes that loaded the reverted code.
    facts = next(e for e in project.events() if e["type"] == "run_end")["facts"]
    forward, back = facts["pids"], facts["rollback_pids"]
    after_pids = stack.pids()
    for name in ("prefill", "decode"):
        assert forward[name]["old"] == before_pids[name]
        assert back[name]["old"] == forward[name]["new"] != back[name]["new"] == after_pids[name]
        assert alive(after_pids[name]) and wait_dead(forward[name]["new"])
    assert answers(stack) == {"prefill": "41", "decode": "41"}


@pytest.mark.parametrize("target", LOOPBACK_TRANSPORTS, indirect=True)
def test_a_storm_and_a_baseline_reach_the_targets_loopback_through_the_connection(stack: Stack) -> None:
    project = stack.project
    code_serving(stack)
    stack.start_services()
    port = stack.ports["prefill"]
    project.write_inventory(**{**yaml.safe_load(project.inventory.read_text())["hosts"]["box"],
                               "endpoint": f"http://127.0.0.1:{port}"})
    if project.netns is not None:  # the control: from here, the target's loopback is out of reach
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
    project.playbook(steps=[{"baseline": {"metric": GAUGE, "interval_s": 0.1, "within_s": 10,
                                          "storm": {"requests": 20, "concurrency": 4, "client_timeout_s": 5}}}])
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    storm = next(e for e in project.events() if e["type"] == "storm")
    assert (storm["sent"], storm["completed"], storm["errors"]) == (20, 20, 0), storm
    assert (stack.www / "posts").read_text().splitlines() == ["/generate"] * 20
    baseline = next(e for e in project.events() if e["type"] == "run_end")["facts"]["baseline"]
    assert baseline == {GAUGE: 3.0}


def test_a_failed_check_after_the_commit_without_rollback_keeps_the_commit_and_says_so(stack: Stack) -> None:
    project = stack.project
    stack.start_services()
    before = project.head()
    project.playbook(steps=["upload", {"commit": {"message": "fix"}}, "co_restart",
                            {"drain": {"metric": GAUGE, "to": 0, "interval_s": 0.2, "within_s": 1}}])
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 5, result.stderr
    run_id = sorted(project.runs.iterdir())[-1].name
    head = project.head()
    # The state left behind: the run's commit is HEAD, the new bytes are on disk, nothing is staged.
    assert head != before and git(project.repo, "rev-parse", "HEAD~1").strip() == before
    assert f"Deployer-Run: {run_id}" in git(project.repo, "log", "-1", "--format=%B")
    assert project.file("pkg/a.py") == FIXED_A and git(project.repo, "status", "--porcelain") == ""
    message = " ".join(result.stderr.split())
    assert f"The commit {head} stays on the target (on_failure: restore only undoes failures before the " \
           "commit)" in message
    assert f"To undo it: deployer rollback {run_id}" in message
    assert "Rolled back" not in result.stderr
    end = next(e for e in project.events() if e["type"] == "run_end")
    assert end["git"] == {"before": before, "after": head} and "restored" not in end["facts"]


def test_plan_of_the_verification_steps_changes_nothing(stack: Stack) -> None:
    project = stack.project
    project.playbook(steps=["upload", {"commit": {"message": "m"}}, "co_restart",
                            {"storm": {"url": "http://127.0.0.1:1/generate"}},
                            {"drain": {"metric": GAUGE, "to": 0}}])
    snapshot = tree_snapshot(project.repo)
    plan = project.deployer("plan", "fix.yaml", "--host", "box")
    assert plan.returncode == 0, plan.stderr
    assert "stop decode" in plan.stdout and "start prefill" in plan.stdout
    assert "200 streaming requests, 32 at a time, clients give up after 0.2s; none sent after 60s: " \
           "POST http://127.0.0.1:1/generate" in plan.stdout
    assert tree_snapshot(project.repo) == snapshot
    assert stack.pids() == {}


FAKE_SYSTEMCTL = r"""#!/bin/sh
# Stand-in for systemd, which cannot run in this container: it really starts and stops the
# unit's process (the command in $UNITS/<unit>.cmd), and logs every call.
echo "$*" >> "$UNITS/calls.log"
case "$1" in
  show) unit=$5; pid=$(cat "$UNITS/$unit.pid" 2>/dev/null || echo 0)
        kill -0 "$pid" 2>/dev/null && echo "$pid" || echo 0 ;;
  stop) kill "$(cat "$UNITS/$2.pid")" 2>/dev/null; rm -f "$UNITS/$2.pid" ;;
  start) setsid sh "$UNITS/$2.cmd" >/dev/null 2>&1 </dev/null & echo $! > "$UNITS/$2.pid" ;;
  is-active) kill -0 "$(cat "$UNITS/$3.pid" 2>/dev/null || echo 0)" 2>/dev/null ;;
esac
"""


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_systemd_services_restart_through_systemctl(stack: Stack, tmp_path: Path) -> None:
    project = stack.project
    units = tmp_path / "units"
    units.mkdir()
    fake = units / "bin" / "systemctl"
    fake.parent.mkdir()
    fake.write_text(FAKE_SYSTEMCTL)
    fake.chmod(0o755)
    decode = stack.service("decode")
    (units / "sglang-decode.service.cmd").write_text("exec " + " ".join(decode["start"]) + "\n")
    project.extra_env.update(PATH=f"{fake.parent}:{os.environ['PATH']}", UNITS=str(units))
    stack.configure(prefill=stack.service("prefill"),
                    decode={"systemd": "sglang-decode.service", "health": decode["health"]})
    restart_only(project)
    try:
        systemd_restarts(project, units)
    finally:  # the stand-in's processes are not in deployer's pid files: stop them here
        for pidfile in units.glob("*.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(int(pidfile.read_text()), signal.SIGKILL)


def systemd_restarts(project: Project, units: Path) -> None:
    assert project.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    old = int((units / "sglang-decode.service.pid").read_text())
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    new = int((units / "sglang-decode.service.pid").read_text())
    assert new != old and wait_dead(old)
    calls = [c.split()[0] for c in (units / "calls.log").read_text().splitlines()
             if c.split()[0] in ("stop", "start")]
    assert calls[-2:] == ["stop", "start"]
    restart = next(e for e in project.events() if e["type"] == "restart")
    assert restart["pids"]["decode"] == {"old": old, "new": new}


def test_a_recycled_pid_in_a_stale_pid_file_is_never_signalled(stack: Stack) -> None:
    project = stack.project
    stack.start_services()
    state = project.repo / ".git" / "deployer"
    os.killpg(int((state / "prefill.pid").read_text()), signal.SIGKILL)
    # The dead service's number now names an unrelated process (a recycled PID).
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        (state / "prefill.pid").write_text(f"{bystander.pid}\n")
        result = project.deployer("apply", "fix.yaml", "--host", "box")
        assert result.returncode == 0, result.stderr
        assert bystander.poll() is None, "deployer signalled a process that was not its service"
        restart = next(e for e in project.events() if e["type"] == "restart")
        assert restart["pids"]["prefill"]["old"] is None
    finally:
        bystander.kill()
        bystander.wait()


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    members.append(int(entry.name))
    return members


def test_a_stop_reaches_the_services_child_processes(stack: Stack) -> None:
    project = stack.project
    prefill = stack.service("prefill")
    # A worker child beside the server, like SGLang's scheduler processes.
    prefill["start"] = ["sh", "-c", 'sleep 777 & exec "$@"', "sh", *prefill["start"]]
    stack.configure(prefill=prefill)
    stack.start_services()
    leader = stack.pids()["prefill"]
    members = group_members(leader)
    assert len(members) == 2, members  # the server and its sleeping child
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    assert all(wait_dead(pid) for pid in members)


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_drain_whose_baseline_already_met_its_bound_is_warned_of_in_plan_apply_and_the_summary(
        stack: Stack) -> None:
    project = stack.project
    stack.set_gauge(0.0)  # the symptom never shows: "0 -> 0" would read as a proof
    stack.start_services()
    project.playbook(steps=[{"baseline": {"metric": GAUGE, "interval_s": 0.1, "within_s": 10}},
                            {"drain": {"metric": GAUGE, "to": 0, "interval_s": 0.1, "within_s": 10}}])
    plan = project.deployer("plan", "fix.yaml", "--host", "box")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert f"warning: {GAUGE} reads 0 now, and baseline reads it without a storm first, which already meets the " \
           "drain's <= 0: the drain cannot tell the fix from no fix" in plan.stdout
    as_json = json.loads(project.deployer("plan", "fix.yaml", "--host", "box", "--json").stdout)
    assert "already meets the drain's <= 0" in next(s for s in as_json["steps"] if s["name"] == "drain")["note"]
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"warning: the baseline of {GAUGE} was 0, which already meets the drain's <= 0: the drain cannot tell " \
           "the fix from no fix" in result.stderr
    assert "passed, proving nothing: its baseline 0 already met <= 0" in result.stdout
    assert next(e for e in project.events() if e["type"] == "run_end")["facts"]["baseline_met"] == {GAUGE: "<= 0"}
    # A baseline that shows the symptom: no warning anywhere.
    stack.set_gauge(3.0)
    assert "warning" not in project.deployer("plan", "fix.yaml", "--host", "box").stdout
    # A storm comes before the baseline: what it will read is not known yet, so the plan says it will be judged.
    project.playbook(steps=[{"baseline": {"metric": GAUGE, "storm": {"url": "http://127.0.0.1:1/generate"}}},
                            {"drain": {"metric": GAUGE, "to": 0}}])
    assert f"warning: baseline reads {GAUGE} after its storm: if it already meets <= 0 then, this drain proves " \
           "nothing, and apply says so" in project.deployer("plan", "fix.yaml", "--host", "box").stdout
