"""`runs list --all` and `runs show` name a run's state as the docs do, refusals as `refused`, and never
`None`."""

from __future__ import annotations

import json
import re

from fixtures_repo import Project, hold_lock
from fixtures_services import Stack


def listed_states(project: Project) -> dict[str, str]:
    shown = project.deployer("runs", "list", "--all")
    assert shown.returncode == 0, shown.stderr
    return {line.split()[0]: line.split()[1] for line in shown.stdout.splitlines()[1:] if line.strip()}


def test_runs_list_all_names_the_documented_states_and_refusals_as_refused(target: Project) -> None:
    applied = target.applied()
    assert target.deployer("rollback", applied).returncode == 0
    rollback = target.newest_run()
    again = target.deployer("rollback", applied)
    assert again.returncode == 2 and "already rolled back" in again.stderr, again.stderr
    refused_rollback = target.newest_run()
    (target.root / "fix" / "a.py").write_text("def answer(:\n")  # uploaded, then remote_compile fails
    target.playbook(steps=["upload", "remote_compile"], files=[{"src": "fix/a.py", "dest": "pkg/a.py"}])
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 1
    restored = target.newest_run()
    hold_lock(target)
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 3
    locked_out = target.newest_run()

    states = listed_states(target)
    assert states == {applied: "succeeded", rollback: "rolled_back", refused_rollback: "refused",
                      restored: "failed_restored", locked_out: "refused"}
    listed = json.loads(target.deployer("runs", "list", "--all", "--json").stdout)["runs"]
    assert {r["run_id"]: r["state"] for r in listed} == states


def test_runs_show_names_the_state_and_prints_no_python_none(target: Project) -> None:
    hold_lock(target)
    target.playbook()
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 3
    run_id = target.newest_run()
    shown = target.deployer("runs", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert f"run {run_id}  state refused  host box" in shown.stdout
    assert "None" not in shown.stdout and "git: before -  after -" in shown.stdout


def test_the_end_of_an_apply_names_the_runs_state_and_json_keeps_its_status(target: Project) -> None:
    target.playbook()
    done = target.deployer("apply", "fix.yaml", "--host", "box")
    assert done.returncode == 0, done.stderr
    assert f"run {target.newest_run()}: succeeded (exit 0)" in done.stdout, done.stdout
    hold_lock(target)
    refused = target.deployer("apply", "fix.yaml", "--host", "box")
    assert refused.returncode == 3 and f"run {target.newest_run()}: refused (exit 3)" in refused.stdout
    report = json.loads(target.deployer("apply", "fix.yaml", "--host", "box", "--json").stdout)
    assert (report["state"], report["status"], report["exit_code"]) == ("refused", "failed", 3)


def test_runs_show_lines_up_its_columns_for_step_names_longer_than_sixteen_characters(stack: Stack) -> None:
    project = stack.project
    stack.start_services()
    project.playbook(steps=["local_compile", "upload", {"commit": {"message": "m"}}, "co_restart",
                            {"drain": {"metric": "no_such_gauge", "to": 0, "interval_s": 0.1, "within_s": 0.3}}],
                     on_failure="rollback")
    assert project.deployer("apply", "fix.yaml", "--host", "box").returncode != 0  # the drain is inconclusive
    shown = project.deployer("runs", "show", project.newest_run())
    assert shown.returncode == 0, shown.stderr
    rows = [line for line in shown.stdout.splitlines() if re.match(r"  \S+ +(ok|failed|skipped) ", line)]
    assert any(row.split()[0] == "rollback:co_restart" for row in rows), shown.stdout
    assert len({row.index(row.split()[1], len(row.split()[0]) + 2) for row in rows}) == 1, shown.stdout
