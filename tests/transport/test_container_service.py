"""A service that is a container: its engine stops (`-t stop_grace_s`) and starts it, `inspect`'s State.Pid
and State.StartedAt prove the restart; against real podman containers (fixtures_containers), with the agent on
the host (locally, and over the real sshd)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fixtures_containers import Served
from fixtures_repo import FIXED_A, Project

RESTART = ["upload", {"commit": {"message": "pkg: answer is 42"}}, {"co_restart": {"services": ["prefill"]}}]


def with_service(target: Project, served: Served, **service: Any) -> None:
    target.write_inventory(services={"prefill": {
        "container": {"engine": "podman", "name": served.box.name}, "health": served.health, **service}})
    target.playbook(steps=RESTART)


def events_of(target: Project, kind: str) -> list[dict[str, Any]]:
    return [e for e in target.events() if e["type"] == kind]


def test_a_container_service_is_restarted_by_its_engine_and_proved_by_a_new_pid_and_start(
        target: Project, serving_container: Callable[..., Served]) -> None:
    served = serving_container(init=True)
    with_service(target, served, stop_grace_s=7)
    pid, started = served.state()
    applied = target.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    new_pid, new_started = served.state()
    assert new_started != started and new_pid != pid
    assert events_of(target, "restart")[0]["pids"] == {"prefill": {"old": pid, "new": new_pid}}
    stops = [e for e in events_of(target, "command") if e.get("action") == "prefill.stop"]
    assert [e["command"] for e in stops] == [f"podman stop -t 7 {served.box.name}"]
    assert events_of(target, "service_warning") == [], "an init forwards TERM: nothing to warn about"
    phases = [(e["phase"], e.get("pid")) for e in events_of(target, "service_phase")]
    assert phases[0] == ("stopping", pid) and phases[1] == ("starting", None) and phases[-1] == ("healthy", new_pid)
    assert {phase for phase, _ in phases[2:-1]} <= {"loading"}
    assert target.file("pkg/a.py") == FIXED_A


def test_a_bare_interpreter_as_pid_1_is_warned_about_and_killed_after_stop_grace_s(
        target: Project, serving_container: Callable[..., Served]) -> None:
    served = serving_container(init=False)
    with_service(target, served, stop_grace_s=1)
    checked = target.deployer("check", "--host", "box")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    warned = f"container {served.box.name}: PID 1 is 'python3' without an init: it ignores TERM"
    assert any(" warn " in line and warned in line for line in checked.stdout.splitlines()), checked.stdout
    pid, _ = served.state()
    applied = target.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert served.state()[0] != pid
    assert [w["warning"][:len(warned)] for w in events_of(target, "service_warning")] == [warned]
    stop = next(e for e in events_of(target, "command") if e.get("action") == "prefill.stop")
    # The engine's default grace is 10 s: the TERM python ignores is followed by KILL after our 1 s.
    assert "resorting to SIGKILL" in stop["stderr_tail"] and stop["duration_s"] < 8


def test_a_stopped_container_service_is_started_and_check_says_it_does_not_run(
        target: Project, serving_container: Callable[..., Served]) -> None:
    served = serving_container(init=True)
    with_service(target, served)
    served.box.stop()
    checked = target.deployer("check", "--host", "box")
    assert checked.returncode == 1 and "service prefill  FAIL    not running" in checked.stdout, checked.stdout
    applied = target.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    new_pid, _ = served.state()
    assert events_of(target, "restart")[0]["pids"] == {"prefill": {"old": None, "new": new_pid}}


def test_a_container_service_that_never_gets_healthy_fails_with_the_end_of_its_output_both_streams(
        target: Project, serving_container: Callable[..., Served]) -> None:
    served = serving_container(init=True)
    # http.server logs each request on its stderr, which `podman logs` hands back on its own stderr.
    with_service(target, served, health=served.health + "never-healthy", health_timeout_s=2)
    applied = target.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode != 0, applied.stdout + applied.stderr
    assert '"GET /never-healthy HTTP/1.1" 404' in applied.stderr, applied.stderr
