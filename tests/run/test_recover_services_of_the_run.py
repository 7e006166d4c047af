"""After a failure, recover knows what this machine's own runs did to the services: the servers they started,
however the run was cut, and the services the run already brought up on its commit. Real services, real signals
to the apply (local and over a real sshd)."""

from __future__ import annotations

import contextlib
import json
import signal
from pathlib import Path
from typing import Any

from fixtures_repo import ORIGINAL_A, Project, act_when, age_lock, git
from fixtures_services import GAUGE, Stack, alive, wait_dead
from polling import wait_for

pytest_plugins = ["fixtures_repo", "fixtures_ssh", "fixtures_services"]

COMMIT: list[Any] = ["upload", {"commit": {"message": "pkg: answer is 42"}}]


def state_of(run: Path) -> dict[str, Any]:
    return dict(json.loads((run / "state.json").read_text()))


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
    age_lock(target.repo)
    [run] = new_runs()

    done = target.deployer("recover", run.name, "--rollback")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "started outside deployer" not in done.stdout + done.stderr
    assert wait_dead(orphan), "recover left the server the cut rollback started running"
    restarted = stack.pids()["prefill"]
    assert restarted != orphan and alive(restarted)
    assert state_of(run)["phase"] == "rolled_back"
    assert git(target.repo, "rev-parse", "HEAD~2").strip() == head and target.file("pkg/a.py") == ORIGINAL_A
