"""A run's summary says what its log says: each figure with the build it was measured on (the one before the fix,
the fix's, the reverted one), the fix's drain apart from the one a rollback ran again, each storm under its step,
and a check the run never reached as not run (issue 33, item 10).

The services are real processes that load the target's code at start (tests/fixtures_services.py GAUGE_SERVER):
on the fix the gauge stays at 3, on the code before it the gauge reads 0."""

from __future__ import annotations

import pytest
from fixtures_repo import Project
from fixtures_services import GAUGE, Stack, code_following
from test_recover_restart import CHAIN, killed_in_its_restart

from deployer.run.revert_checks import recorded_baseline
from deployer.runlog import read_run

pytestmark = pytest.mark.parametrize("target", ["local"], indirect=True)

STORM = {"requests": 5, "concurrency": 1, "client_timeout_s": 5}


def fix_playbook(project: Project, **extra: object) -> None:
    project.playbook(steps=[{"baseline": {"metric": GAUGE, "interval_s": 0.1, "storm": STORM}}, "upload",
                            {"commit": {"message": "fix"}}, "co_restart", {"storm": STORM},
                            {"drain": {"metric": GAUGE, "to": 0, "interval_s": 0.2, "within_s": 1.5}}], **extra)


def summary(out: str) -> list[str]:
    """The report's fact lines (indented under `run ...:`)."""
    return [line.strip() for line in out.splitlines() if line.startswith("  ") and not line.startswith("    ")]


def test_a_drain_that_failed_on_the_fix_and_passed_after_the_rollback_is_summarised_as_two_figures_of_two_builds(
        stack: Stack) -> None:
    project = code_following(stack)
    before = project.head()
    fix_playbook(project, on_failure="rollback")
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 5, result.stdout + result.stderr
    revert = project.head()
    commit = next(e["commit"] for e in project.events() if e["type"] == "commit")
    lines = summary(result.stdout)
    assert f"baseline: {GAUGE} = 0 on the build before the fix ({before[:12]})" in lines, lines
    assert f"storm of baseline: sent 5, completed 5, aborted 0, errors 0 on the build before the fix " \
           f"({before[:12]})" in lines, lines
    assert f"storm: sent 5, completed 5, aborted 0, errors 0 on the fix's build ({commit[:12]})" in lines, lines
    # The fix's drain: its last real sample, on its build, failed; the rollback's: the reverted build, no load.
    assert f"drain: {GAUGE} = 3 on the fix's build ({commit[:12]}): failed" in lines, lines
    assert f"rollback:drain: {GAUGE} = 0 on the reverted build ({revert[:12]}), no load since its restart: " \
           "passed" in lines, lines
    assert not [line for line in lines if "?" in line or "-> 0" in line], lines


def test_a_rollback_summarises_its_drain_on_the_reverted_build_and_never_as_a_question_mark(
        stack: Stack) -> None:
    project = code_following(stack)
    fix_playbook(project)
    applied = project.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 5, applied.stdout + applied.stderr  # the fix's gauge stays at 3: kept, failed
    run_id = project.newest_run()
    assert f"drain: {GAUGE} = 3 on the fix's build ({project.head()[:12]}): failed" in summary(applied.stdout)
    rolled = project.deployer("rollback", run_id)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    lines = summary(rolled.stdout)
    assert f"rollback:drain: {GAUGE} = 0 on the reverted build ({project.head()[:12]}), no load since its " \
           "restart: passed" in lines, lines
    assert not [line for line in lines if "?" in line], lines


def test_a_drain_the_run_never_reached_is_summarised_as_not_run(stack: Stack) -> None:
    project = code_following(stack)
    project.playbook(steps=["upload", {"commit": {"message": "fix"}}, "co_restart",
                            {"drain": {"metric": "sglang:no_such_gauge", "to": 0, "interval_s": 0.2, "within_s": 1}},
                            {"drain": {"metric": GAUGE, "to": 0, "interval_s": 0.2, "within_s": 1.5}}])
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 5, result.stdout + result.stderr  # the first drain is inconclusive: failed_committed
    lines = summary(result.stdout)
    assert f"drain: sglang:no_such_gauge = ? (no reading) on the fix's build ({project.head()[:12]}), no load " \
           "since its restart: failed" in lines, lines
    assert "drain#2: not run" in lines, lines


def test_a_recover_that_finishes_a_cut_restart_names_the_fixs_build_and_says_its_drain_ran_without_load(
        stack: Stack) -> None:
    project = stack.project
    run = killed_in_its_restart(project, stack)
    stack.set_gauge(0.0)
    done = project.deployer("recover", run.name)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = summary(done.stdout)
    assert f"drain: {GAUGE} = 0 on the fix's build ({project.head()[:12]}), no load since its restart: passed" \
        in lines, lines
    assert not [line for line in lines if "?" in line], lines


def test_recover_of_a_run_cut_in_its_restart_drains_from_the_baseline_the_cut_run_recorded(stack: Stack) -> None:
    project = stack.project
    run = killed_in_its_restart(project, stack, [{"baseline": {"metric": GAUGE, "interval_s": 0.1}}, *CHAIN])
    assert recorded_baseline(read_run(project.runs, run.name)) == {GAUGE: 3.0}  # the gauge read 3 before the fix
    stack.set_gauge(0.0)
    done = project.deployer("recover", run.name)
    assert done.returncode == 0, done.stdout + done.stderr
    drained = next(line for line in done.stdout.splitlines() if line.startswith("[drain] ok "))
    assert f"sum({GAUGE}{{}}): 3 -> 0 (samples: " in drained, done.stdout


def test_runs_show_of_a_recovered_run_says_the_recover_and_its_outcome_in_run_state_words(stack: Stack) -> None:
    project = stack.project
    run = killed_in_its_restart(project, stack)
    stack.set_gauge(0.0)
    done = project.deployer("recover", run.name)
    assert done.returncode == 0, done.stdout + done.stderr
    shown = project.deployer("runs", "show", run.name)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    line = next(line for line in shown.stdout.splitlines() if line.startswith("recovered by run "))
    assert line == f"recovered by run {project.newest_run()} (succeeded): this run ended succeeded", line
