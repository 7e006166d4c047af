"""After a failure, recover knows what this machine's own runs did to the services: the servers they started,
however the run was cut, and the services the run already brought up on its commit. Real services, real signals
to the apply (local and over a real sshd)."""

from __future__ import annotations

import contextlib
import json
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_repo import ORIGINAL_A, Project, act_when, age_lock, git
from fixtures_services import GAUGE, Stack, alive, gauge_server, wait_dead
from polling import wait_for
from test_recover import gate, kill_marker, state_of

pytest_plugins = ["fixtures_repo", "fixtures_ssh", "fixtures_services"]

COMMIT: list[Any] = ["upload", {"commit": {"message": "pkg: answer is 42"}}]


def logged(runs: list[Path], *needles: str) -> bool:
    """Some run log among `runs` has a line holding every needle."""
    return any(all(n in line for n in needles) for p in runs if (p / "events.jsonl").is_file()
               for line in (p / "events.jsonl").read_text().splitlines())


def answers(stack: Stack, service: str) -> bool:
    with contextlib.suppress(OSError):
        return stack.fetch(f"http://127.0.0.1:{stack.ports[service]}/health") == "ok\n"
    return False


def test_a_server_the_rollback_started_before_a_second_ctrl_c_is_recovered_as_the_runs_own(
        target: Project, stack: Stack) -> None:
    stack.configure(prefill=stack.service("prefill"))
    stack.start_services()
    target.playbook(steps=[*COMMIT, {"co_restart": {}},
                           {"drain": {"metric": GAUGE, "to": 0, "within_s": 120, "interval_s": 0.1}}],
                    on_failure="rollback")
    head = target.head()
    before = set(target.runs.iterdir())
    health = stack.www / "health"

    def new_runs() -> list[Path]:
        return list(set(target.runs.iterdir()) - before)

    def ctrl_c_twice(proc: Any) -> None:
        # The first Ctrl-C stops the drain and rolls back; the rollback's start never gets healthy (no /health
        # yet), and the second Ctrl-C lands while it waits.
        health.unlink()
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: logged(new_runs(), '"step": "rollback:co_restart"', '"phase": "loading"'),
                 "the rollback's start waiting for health")
        proc.send_signal(signal.SIGINT)

    cut = act_when(target, ["apply", "fix.yaml", "--host", "box"],
                   lambda: logged(new_runs(), '"step": "drain"', '"type": "sample"'), ctrl_c_twice,
                   "the drain's first sample")
    assert cut.returncode == 6, cut.stdout + cut.stderr
    orphan = stack.pids()["prefill"]
    health.write_text("ok\n")  # the server the rollback started now answers, as it did in the incident
    wait_for(lambda: answers(stack, "prefill"), "the orphaned server answering")
    stack.set_gauge(0.0)  # the reverted build drains, so the checks of the rollback recover finishes pass
    age_lock(target.repo)
    [run] = new_runs()

    done = target.deployer("recover", run.name, "--rollback")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "started outside deployer" not in done.stdout + done.stderr
    # Its start never saw it healthy (no service_started): restarted as the run's own, never kept.
    assert wait_dead(orphan), "recover left the server the cut rollback started running"
    restarted = stack.pids()["prefill"]
    assert restarted != orphan and alive(restarted)
    assert state_of(run)["phase"] == "rolled_back"
    assert git(target.repo, "rev-parse", "HEAD~2").strip() == head and target.file("pkg/a.py") == ORIGINAL_A


# -- recover keeps what the cut run brought up on its commit, and says what its checks prove ----------------------

STORM: dict[str, Any] = {"storm": {"requests": 5, "concurrency": 1, "client_timeout_s": 5}}
DRAIN: dict[str, Any] = {"drain": {"metric": GAUGE, "to": 0, "within_s": 120, "interval_s": 0.1}}


def gauge_services(target: Project, stack: Stack, follows_code: bool = False, **decode: Any) -> None:
    """prefill and decode in the inventory as servers that take a storm and serve the gauge the test sets (or,
    following the code, stuck on the fix and drained on the build before it); the storm aimed at prefill; decode
    given `decode` too."""
    services = {name: {**stack.service(name), "env": {"PYTHONDONTWRITEBYTECODE": "1"},
                       "start": gauge_server(target.root, port, target.repo, stack.www, follows_code=follows_code)}
                for name, port in stack.ports.items()}
    services["decode"].update(decode)
    stack.configure(**services)
    host = yaml.safe_load(target.inventory.read_text())["hosts"]["box"]
    target.write_inventory(**{**host, "endpoint": f"http://127.0.0.1:{stack.ports['prefill']}"})


def killed_when(target: Project, reached: Callable[[list[Path]], bool], what: str, within_s: float = 120,
                **playbook: Any) -> Path:
    """An apply of the fix, its restart, storm and drain, SIGKILLed once `reached` (given the new run dirs)."""
    target.playbook(steps=[*COMMIT, {"co_restart": {}}, STORM, {"drain": {**DRAIN["drain"], "within_s": within_s}}],
                    **playbook)
    before = set(target.runs.iterdir())
    cut = act_when(target, ["apply", "fix.yaml", "--host", "box"],
                   lambda: reached(list(set(target.runs.iterdir()) - before)),
                   lambda proc: proc.send_signal(signal.SIGKILL), what)
    assert cut.returncode == -signal.SIGKILL
    age_lock(target.repo)
    [run] = list(set(target.runs.iterdir()) - before)
    return run


def without(run: Path, *kinds: str) -> None:
    """run's log as a kill right behind its services' health answers leaves it: without the events of kinds that
    come after the live view's `healthy` line (the window between them is short: made here, not waited for)."""
    log = run / "events.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    kept = [line for line in lines if json.loads(line)["type"] not in kinds]
    assert len(kept) < len(lines) and b'"phase": "healthy"' in b"".join(kept)
    log.write_bytes(b"".join(kept))


@pytest.mark.parametrize("starts", ["logged", "unlogged", "healthy-line-only"])
def test_recover_keeps_the_services_the_cut_run_brought_up_on_its_commit_and_its_drain_after_the_storm_proves_it(
        target: Project, stack: Stack, starts: str) -> None:
    gauge_services(target, stack)
    stack.start_services()
    run = killed_when(target, lambda runs: logged(runs, '"step": "drain"', '"type": "sample"'), "the drain")
    if starts == "unlogged":
        without(run, "service_started")
    elif starts == "healthy-line-only":
        without(run, "service_started", "service_healthy")
    up = stack.pids()
    stack.set_gauge(0.0)  # the fixed build drains once the storm's aborts are handled
    done = target.deployer("recover", run.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert stack.pids() == up and all(alive(pid) for pid in up.values()), "recover restarted a service already up"
    assert "kept prefill, decode (already serving its commit)" in done.stdout, done.stdout
    # Its drain read the kept servers, on the fix's build (it said "on the build before the fix": no restart here).
    assert re.search(r"drain: \S+ = 0 on the fix's build \([0-9a-f]{12}\): passed", done.stdout), done.stdout
    assert "unproven" not in done.stdout
    assert state_of(run)["phase"] == "succeeded"
    assert not [e for e in target.events(target.newest_run()) if e["type"] == "service_stopped"]


def test_recover_of_a_rollback_cut_in_its_drain_keeps_the_services_it_brought_up_on_the_revert(
        target: Project, stack: Stack) -> None:
    gauge_services(target, stack)
    stack.set_gauge(3.0)  # the build before the fix: the run's baseline
    stack.start_services()
    target.playbook(steps=[{"baseline": {"metric": GAUGE, "interval_s": 0.1, "within_s": 10}}, *COMMIT,
                           {"co_restart": {}}, DRAIN])
    before = set(target.runs.iterdir())
    applied = act_when(target, ["apply", "fix.yaml", "--host", "box"],
                       lambda: logged(list(set(target.runs.iterdir()) - before), '"step": "drain"', '"type": "sample"'),
                       lambda proc: stack.set_gauge(0.0), "the fix's drain")  # the fix drains
    assert applied.returncode == 0, applied.stdout + applied.stderr
    run_id = target.newest_run()
    stack.set_gauge(9.0)  # the reverted build above its baseline for now: the rollback's drain polls on
    before = set(target.runs.iterdir())
    cut = act_when(target, ["rollback", run_id],
                   lambda: logged(list(set(target.runs.iterdir()) - before), '"step": "rollback:drain"',
                                  '"type": "sample"'),
                   lambda proc: proc.send_signal(signal.SIGKILL), "the rollback's drain")
    assert cut.returncode == -signal.SIGKILL
    [rollback] = list(set(target.runs.iterdir()) - before)
    up = stack.pids()
    stack.set_gauge(3.0)
    done = target.deployer("recover", rollback.name)
    assert done.returncode == 0, done.stdout + done.stderr
    # It restarted both before: a second outage of servers already up on the revert.
    assert stack.pids() == up and all(alive(pid) for pid in up.values()), "recover restarted a service already up"
    assert "kept prefill, decode (already serving its revert)" in done.stdout, done.stdout
    assert re.search(r"rollback:drain: \S+ = 3 on the reverted build \([0-9a-f]{12}\)", done.stdout), done.stdout
    assert not [e for e in target.events(target.newest_run()) if e["type"] == "service_stopped"]
    assert state_of(rollback)["phase"] == "rolled_back" and target.file("pkg/a.py") == ORIGINAL_A
    facts = next(e for e in target.events(target.newest_run()) if e["type"] == "run_end")["facts"]
    assert facts["rollback_checks"] == {"co_restart": "passed", "drain": "passed"}, facts


def test_a_drain_recover_runs_after_restarting_a_service_is_unproven_and_the_cut_run_names_its_recover(
        target: Project, stack: Stack) -> None:
    gauge_services(target, stack)
    stack.start_services()
    script, marker = gate(target, "decode-start")
    gauge_services(target, stack, start=[str(script)])  # prefill starts on the commit; decode never comes up
    run = killed_when(target, lambda runs: marker.exists(), "decode's start, prefill up on the commit")
    kill_marker(marker)
    kept = stack.pids()["prefill"]
    gauge_services(target, stack)
    stack.set_gauge(0.0)
    done = target.deployer("recover", run.name)
    assert done.returncode == 0, done.stdout + done.stderr
    recover_id = target.newest_run()
    assert stack.pids()["prefill"] == kept and alive(kept)
    restart = next(e for e in target.events(recover_id) if e["type"] == "restart")
    assert list(restart["pids"]) == ["decode"]
    said = ("unproven: recover restarted decode, and no storm is sent again, so the drain read servers that never "
            "saw the run's load")
    assert said in done.stdout
    facts = next(e for e in target.events(recover_id) if e["type"] == "run_end")["facts"]
    assert facts["unproven"] == said.removeprefix("unproven: ")
    shown = target.deployer("runs", "show", run.name)
    assert f"recovered by run {recover_id}" in shown.stdout and said in shown.stdout, shown.stdout


def test_recover_whose_checks_fail_rolls_back_as_the_playbooks_on_failure_says(target: Project, stack: Stack) -> None:
    gauge_services(target, stack, follows_code=True)
    stack.start_services()
    head = target.head()
    # The fix does not drain the gauge (stuck at 3), so recover's drain fails too; the reverted build drains it.
    run = killed_when(target, lambda runs: logged(runs, '"step": "drain"', '"type": "sample"'), "the drain",
                      within_s=6, on_failure="rollback")
    done = target.deployer("recover", run.name)
    assert done.returncode == 5, done.stdout + done.stderr
    assert "on_failure: rollback" in done.stderr
    assert state_of(run)["phase"] == "rolled_back"
    assert git(target.repo, "rev-parse", "HEAD~2").strip() == head and target.file("pkg/a.py") == ORIGINAL_A


def test_the_server_a_launcher_left_in_the_session_deployer_started_is_deployers_own_when_the_record_names_the_launcher(
        target: Project, stack: Stack) -> None:
    served = stack.service("prefill")
    # `server &` and exit: the server stays in the session the launch led, whose leader is gone.
    stack.configure(prefill={**served, "start": ["sh", "-c", '"$@" &', "launcher", *served["start"]]})
    stack.start_services()
    state = target.repo / ".git" / "deployer"
    server = stack.pids()["prefill"]
    fields = Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()
    session, started = int(fields[3]), int(fields[19])
    assert session != server and not alive(session)
    # As a cut between the launch and the record of the server that serves the port leaves it: the record names
    # the launcher (a start time no later than its server's).
    (state / "prefill.proc").write_text(f"{session} {started}\n")
    (state / "prefill.pid").write_text(f"{session}\n")
    restarted = target.deployer("restart", "--host", "box", "prefill")
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert wait_dead(server) and stack.pids()["prefill"] != server
    stopped = next(e for e in target.events() if e["type"] == "service_stopped")
    assert stopped["pid"] == server and "adopted" not in stopped["seen"]
