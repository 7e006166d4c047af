"""A run killed before it took the target's lock leaves nothing there to stop the next apply, which therefore
names it: a `notice:` with the `deployer recover` that ends its log (read from this machine's runs dir only)."""

from __future__ import annotations

import signal

from fixtures_repo import Project, act_when

pytest_plugins = ["fixtures_repo", "fixtures_ssh"]


def killed_before_the_lock(project: Project) -> str:
    """An apply killed while the target's python is still starting its agent (which it opens while the run
    begins its log: both must have happened, since a run with no log line yet names no host): no lock,
    nothing changed."""
    entered = project.root / "python-entered"
    # Still starting until its stdin closes (the killed run's pipe, or its ssh session): then gone, as an agent.
    wrapper = project.write("venv/bin/python", f"#!/bin/sh\ntouch '{entered}'\nexec cat >/dev/null\n")
    wrapper.chmod(0o755)
    project.write_inventory(python=str(wrapper))
    act_when(project, ("apply", "fix.yaml", "--host", "box"),
             lambda: entered.exists() and any('"run_start"' in log.read_text()
                                              for log in project.runs.glob("*/events.jsonl")),
             lambda proc: proc.send_signal(signal.SIGKILL), "the agent's start")
    project.write_inventory()
    return project.newest_run()


def test_the_next_apply_names_a_killed_run_of_this_host_with_its_recover_command(target: Project) -> None:
    target.playbook()
    killed = killed_before_the_lock(target)
    assert not (target.repo / ".git" / "deployer.run.lock").exists()
    applied = target.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert f"notice: run {killed} on box never ended" in applied.stderr, applied.stderr
    assert f"deployer recover {killed}" in applied.stderr
    # Once recover has ended it, the next apply says nothing of it.
    recovered = target.deployer("recover", killed)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    again = target.deployer("apply", "fix.yaml", "--host", "box", "--allow-dirty")
    assert killed not in again.stderr, again.stderr


def test_check_names_a_killed_run_of_this_host_too(target: Project) -> None:
    """Nothing on the target says a run was cut there (here: before its lock; a cut restart whose lock was released
    by hand alike): `check` names it with its recover command, as the next apply does."""
    target.playbook()
    killed = killed_before_the_lock(target)
    checked = target.deployer("check", "fix.yaml", "--host", "box")
    assert f"notice: run {killed} on box never ended" in checked.stderr, checked.stdout + checked.stderr
    assert f"deployer recover {killed}" in checked.stderr
