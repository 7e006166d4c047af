"""A rollback proves the revert, not the fix: on the reverted build (which still has the bug) the fix's gauge is
judged against the run's baseline, and a check that fails there still ends the rollback, rolled_back, exit 5.

Real services (a gauge server that loads the target's code at start) over local and a real sshd."""

from __future__ import annotations

import json
import re
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_repo import Project, git
from fixtures_services import GAUGE, Stack, gauge_server, metrics_text
from polling import wait_for

pytestmark = pytest.mark.long  # tests/conftest.py: scheduled first


def old_build_stuck(stack: Stack, *, old: float = 3.0, refuse: Path | None = None) -> None:
    """Services whose gauge reads `old` on the code before the fix (as SGLang's KVPoll wedge does under
    traffic) and 0 on the fixed code, whatever load they see; while `refuse` exists, the old build cannot start."""
    project = stack.project
    services = {}
    for name, port in stack.ports.items():
        argv = gauge_server(project.root, port, project.repo, stack.www)
        argv[-2:] = [str(stack.www / "drained.prom"), str(stack.www / "old.prom")]  # fixed: 0; before it: `old`
        if refuse is not None:
            argv = ["sh", "-c", f'[ -e {refuse} ] && grep -q "return 41" {project.repo}/pkg/a.py && '
                    'echo "old build: cannot load the model" >&2 && exit 3; exec "$@"', "sh", *argv]
        services[name] = {**stack.service(name), "start": argv, "env": {"PYTHONDONTWRITEBYTECODE": "1"},
                          "health_timeout_s": 10}
    (stack.www / "old.prom").write_text(metrics_text(old))
    stack.configure(**services)
    host = yaml.safe_load(project.inventory.read_text())["hosts"]["box"]
    project.write_inventory(**{**host, "endpoint": f"http://127.0.0.1:{stack.ports['prefill']}"})


def fix_playbook(project: Project, *, baseline: bool = True, within_s: float = 20, **extra: Any) -> None:
    steps: list[Any] = [{"baseline": {"metric": GAUGE, "interval_s": 0.1, "within_s": 10}}] if baseline else []
    project.playbook(steps=[*steps, "upload", {"commit": {"message": "fix"}}, "co_restart",
                            {"drain": {"metric": GAUGE, "to": 0, "interval_s": 0.1, "within_s": within_s}}],
                     **extra)


def applied(project: Project) -> str:
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    return sorted(project.runs.iterdir())[-1].name


def applied_then_worse(stack: Stack, *, within_s: float) -> str:
    """The fix applied (its drain within within_s) on services whose old build is stuck at 3; then that old
    build wedges worse than before the fix (9): the run's id."""
    old_build_stuck(stack)
    stack.start_services()
    fix_playbook(stack.project, within_s=within_s)
    run_id = applied(stack.project)
    (stack.www / "old.prom").write_text(metrics_text(9.0))
    return run_id


def last_run(project: Project) -> str:
    return sorted(project.runs.iterdir())[-1].name


def state(project: Project, run_id: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((project.runs / run_id / "state.json").read_text())
    return loaded


def run_end(project: Project, run_id: str) -> dict[str, Any]:
    return next(e for e in project.events(run_id) if e["type"] == "run_end")


def test_a_rollback_judges_the_old_builds_gauge_against_the_runs_baseline_not_the_fixs_bound(stack: Stack) -> None:
    project = stack.project
    old_build_stuck(stack)
    stack.start_services()
    before = project.head()
    fix_playbook(project, within_s=5)
    run_id = applied(project)
    result = project.deployer("rollback", run_id, "--json")
    assert result.returncode == 0, result.stderr
    rollback_id = last_run(project)
    # Its chart marks the polls against the bound it held the old build to, not the fix's.
    shown = project.deployer("runs", "show", rollback_id).stdout
    assert "✓ = <= 3 (no worse than 3, its baseline before the fix)" in shown and "✓ = <= 0" not in shown
    assert rollback_id != run_id and git(project.repo, "rev-parse", "HEAD^{tree}").strip() == \
        git(project.repo, "rev-parse", f"{before}^{{tree}}").strip()
    # The old build's gauge is back at 3: no worse than the 3 the run saw before its fix, so the revert is proven.
    facts = run_end(project, rollback_id)["facts"]
    assert facts["rollback_checks"] == {"co_restart": "passed", "drain": "passed"}
    assert facts["rollback_drain"] == {GAUGE: {"baseline": 3.0, "final": 3.0}}
    assert "drain" not in facts  # the fix's own drain figure is not claimed for the old build
    drained = next(e for e in project.events(rollback_id) if e["type"] == "step_end" and e["step"] == "rollback:drain")
    assert drained["status"] == "ok" and "reverted build" in drained["summary"] and "3 -> 3" in drained["summary"]
    assert state(project, rollback_id)["phase"] == "rolled_back"
    assert json.loads(result.stdout)["exit_code"] == 0


def test_a_rollback_whose_old_build_is_worse_than_its_baseline_still_ends_rolled_back_naming_the_check(
        stack: Stack) -> None:
    project = stack.project
    run_id = applied_then_worse(stack, within_s=1.5)
    result = project.deployer("rollback", run_id)
    assert result.returncode == 5, result.stderr
    rollback_id = last_run(project)
    message = " ".join(result.stderr.split())
    assert "The revert stands" in message and "failed its check drain" in message
    assert "Every service answers its health check now" in message, message
    assert "checks of the reverted build: co_restart passed; drain failed" in result.stdout
    # Its commit is the revert: `commit R (was F)`, never `; reverted by R` of itself.
    assert re.search(rf"^commit {project.head()} \(was [0-9a-f]{{40}}\)$", result.stdout, re.M), result.stdout
    assert "Run the rollback again" not in message
    assert state(project, rollback_id)["phase"] == "rolled_back"
    assert state(project, rollback_id)["checks_failed"] == ["drain"]
    assert run_end(project, rollback_id)["facts"]["rollback_checks"] == {"co_restart": "passed", "drain": "failed"}
    assert "Roll back" in git(project.repo, "log", "-1", "--format=%s")
    # Done is done: a second rollback of the same run is refused, and changes nothing.
    head = project.head()
    again = project.deployer("rollback", run_id)
    assert again.returncode == 2 and f"already rolled back by run {rollback_id}" in again.stderr
    assert project.head() == head


def test_on_failure_rollback_proves_the_revert_and_ends_rolled_back_when_the_old_build_fails_a_check(
        stack: Stack) -> None:
    project = stack.project
    old_build_stuck(stack)
    stack.start_services()
    before = project.head()
    # The fix drains; a canary-like second check the old build also fails is enough: the drain within 1.5 s
    # fails on the fix's build when the gauge file says so.
    (stack.www / "drained.prom").write_text(metrics_text(2.0))  # the fix does not drain here
    fix_playbook(project, within_s=1.5, on_failure="rollback")
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 5, result.stderr
    run_id = last_run(project)
    # The old build reads 3 again: no worse than its baseline 3, so the revert is proven and said so.
    facts = run_end(project, run_id)["facts"]
    assert facts["rollback_checks"] == {"co_restart": "passed", "drain": "passed"}
    assert facts["drain"][GAUGE]["final"] == 2.0 and facts["rollback_drain"][GAUGE]["final"] == 3.0
    assert state(project, run_id)["phase"] == "rolled_back" and not state(project, run_id).get("checks_failed")
    assert re.search(rf"commit [0-9a-f]{{40}} \(was {before}\); reverted by {project.head()}", result.stdout), \
        result.stdout
    assert git(project.repo, "rev-parse", "HEAD^{tree}").strip() == \
        git(project.repo, "rev-parse", f"{before}^{{tree}}").strip()
    # Now the old build cannot start at all: the in-run rollback still ends, its revert standing, the check named.
    refuse = stack.www / "old-build-refuses"
    old_build_stuck(stack, refuse=refuse)
    (stack.www / "drained.prom").write_text(metrics_text(2.0))
    refuse.write_text("")
    second = project.deployer("apply", "fix.yaml", "--host", "box")
    assert second.returncode == 5, second.stderr
    second_id = last_run(project)
    assert state(project, second_id)["phase"] == "rolled_back"
    assert state(project, second_id)["checks_failed"] == ["co_restart", "drain"]
    assert run_end(project, second_id)["facts"]["rollback_checks"] == {
        "co_restart": "failed", "drain": "not run: an earlier check failed"}
    message = " ".join(second.stderr.split())
    assert "The revert stands" in message and "cannot load the model" in message
    assert "Finish it with" not in message
    # What the failed start left, read from the target: the services down, and the command for exactly those.
    down = re.search(r"Down on box: (.*)\. Bring them back with: deployer restart --host box ([a-z ]+?)(?: `|$)",
                     message)
    assert down is not None, message
    assert down[2].split() == [name for name in stack.ports if f"{name} (" in down[1]], message
    assert "prefill" in down[2].split(), message


def test_a_drain_with_no_recorded_baseline_is_not_run_on_the_old_build_and_says_so(stack: Stack) -> None:
    project = stack.project
    old_build_stuck(stack)
    stack.start_services()
    fix_playbook(project, baseline=False, within_s=5)
    run_id = applied(project)
    preview = project.deployer("plan", "--rollback", run_id, "--json")
    assert preview.returncode == 0, preview.stderr
    planned = {step["name"]: step for step in json.loads(preview.stdout)["steps"]}
    assert planned["rollback:drain"]["actions"] == [] and "no baseline of" in planned["rollback:drain"]["not_run"]
    assert "not_run" not in planned["rollback:co_restart"]
    result = project.deployer("rollback", run_id)
    assert result.returncode == 0, result.stderr
    rollback_id = last_run(project)
    ended = {e["step"]: e for e in project.events(rollback_id) if e["type"] == "step_end"}
    assert ended["rollback:drain"]["status"] == "skipped"
    assert "no baseline of" in ended["rollback:drain"]["summary"]
    assert run_end(project, rollback_id)["facts"]["rollback_checks"]["drain"].startswith("not run: no baseline")


def test_one_rollback_may_skip_a_check_or_give_its_baseline(stack: Stack) -> None:
    project = stack.project
    first = applied_then_worse(stack, within_s=1.5)
    typo = project.deployer("rollback", first, "--skip-check", "drian")
    assert typo.returncode == 2 and "--skip-check drian: not a check of this playbook" in typo.stderr
    skipped = project.deployer("rollback", first, "--skip-check", "drain")
    assert skipped.returncode == 0, skipped.stderr
    facts = run_end(project, last_run(project))["facts"]
    assert facts["rollback_checks"] == {"co_restart": "passed", "drain": "not run: skipped for this rollback "
                                                                           "(--skip-check)"}
    second = applied(project)
    given = project.deployer("rollback", second, "--baseline", f"{GAUGE}=10")
    assert given.returncode == 0, given.stderr
    assert run_end(project, last_run(project))["facts"]["rollback_drain"][GAUGE] == {"baseline": 10.0, "final": 9.0}


def test_rollback_help_says_what_a_rollback_checks(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from deployer.cli import main

    shown = " ".join(CliRunner().invoke(main, ["rollback", "--help"]).output.split())
    assert "no worse than the run's baseline before the fix" in shown and "--skip-check" in shown
    assert "exit 5" in shown


def signalled_rollback(stack: Stack, *, twice: bool) -> tuple[int, str, str]:
    """A rollback of the applied fix, SIGINTed once its drain polls the reverted build (above its baseline); again
    once that signal's line is out (`twice`), else the reverted build drained back to its baseline: its exit code,
    stdout and stderr."""
    project = stack.project
    run_id = applied_then_worse(stack, within_s=30)  # above the baseline: the rollback's drain polls on
    proc = project.popen("rollback", run_id)
    outs: list[str] = []
    errors: list[str] = []  # read as it comes (the signal's line first); communicate() would take it too
    readers = [threading.Thread(target=lambda: outs.extend(proc.stdout or []), daemon=True),
               threading.Thread(target=lambda: errors.extend(proc.stderr or []), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        def draining() -> bool:
            newest = last_run(project)
            return newest != run_id and (project.runs / newest / "events.jsonl").is_file() and any(
                e["type"] == "sample" and e.get("step") == "rollback:drain" for e in project.events(newest))
        wait_for(draining, "the rollback's drain's first sample", seconds=60)
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: any("SIGINT" in line for line in errors), "the signal's line", seconds=30)
        if twice:
            proc.send_signal(signal.SIGINT)
        else:
            (stack.www / "old.prom").write_text(metrics_text(3.0))  # back to the baseline: the drain passes
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for reader in readers:
        reader.join(timeout=10)
    return proc.returncode, "".join(outs), "".join(errors)


def test_a_first_signal_during_a_rollback_says_the_rollback_goes_on_to_its_end_and_it_does(stack: Stack) -> None:
    project = stack.project
    code, out, err = signalled_rollback(stack, twice=False)
    said = " ".join(err.split())
    # Said as what happens (it was "stopping at the next safe point", and then the rollback went on all the same).
    assert "SIGINT: the rollback goes on to its end first, then stops (again to force a stop halfway)" in said, said
    assert "next safe point" not in said, said
    assert code == 0, out + err
    assert state(project, last_run(project))["phase"] == "rolled_back"
    assert project.file("pkg/a.py").startswith("def answer():\n    return 41")


def test_a_second_signal_stops_the_rollback_and_says_it_was_stopped_not_that_the_target_went_away(
        stack: Stack) -> None:
    project = stack.project
    code, out, err = signalled_rollback(stack, twice=True)
    said = " ".join(err.split())
    assert code == 6, out + err
    # It said "Once the target answers again, finish it with ...", of a target that never stopped answering.
    assert "It was stopped before its end; finish it with: deployer rollback " in said, said
    assert "answers again" not in said, said
    assert project.file("pkg/a.py").startswith("def answer():\n    return 41")  # the revert commit stands
    # Its polls are charted without the fix's `<= 0` (the drain held the reverted build to its baseline, 3).
    assert "✓ = <= 0" not in out, out


def test_a_rollback_again_after_one_that_was_stopped_keeps_the_servers_it_brought_up_on_the_revert(
        stack: Stack) -> None:
    project = stack.project
    code, out, err = signalled_rollback(stack, twice=True)
    assert code == 6, out + err
    stopped = last_run(project)
    applied_id, up = state(project, stopped)["rollback_of"], stack.pids()
    (stack.www / "old.prom").write_text(metrics_text(3.0))  # the reverted build back at its baseline
    again = project.deployer("rollback", applied_id)
    assert again.returncode == 0, again.stdout + again.stderr
    rolled = last_run(project)
    assert state(project, rolled)["phase"] == "rolled_back"
    # The stopped attempt's servers already served the revert: taken down again, they were a second outage.
    assert stack.pids() == up
    assert sorted(e["service"] for e in project.events(rolled) if e["type"] == "service_kept") == sorted(up)
    for service, pid in up.items():  # said as such: "co_restart passed" alone reads as a restart
        assert f"[rollback:co_restart] kept {service} (pid {pid}): started by run {stopped}, still that " \
            "process" in again.stdout, again.stdout
    assert run_end(project, rolled)["facts"]["rollback_checks"] == {"co_restart": "passed", "drain": "passed"}


def test_recover_rollback_of_a_run_cut_in_its_drain_proves_the_revert_and_ends_it_rolled_back_naming_the_check(
        stack: Stack) -> None:
    from test_recover import start_and_kill

    project = stack.project
    old_build_stuck(stack)
    (stack.www / "drained.prom").write_text(metrics_text(2.0))  # the fix does not drain: the drain polls on
    stack.start_services()
    fix_playbook(project, within_s=10)

    def draining() -> bool:  # the apply's own dir may exist a moment before its log in it
        newest = project.runs / last_run(project) / "events.jsonl"
        return newest.is_file() and any(e["type"] == "sample" and e.get("step") == "drain"
                                        for e in project.events(newest.parent.name))
    start_and_kill(project, draining, "the drain's first sample")
    cut = last_run(project)
    (stack.www / "old.prom").write_text(metrics_text(9.0))  # the old build wedges worse than before the fix
    result = project.deployer("recover", cut, "--rollback")
    assert result.returncode == 5, result.stdout + result.stderr
    assert "The revert stands" in " ".join(result.stderr.split())
    assert state(project, cut)["phase"] == "rolled_back" and state(project, cut)["checks_failed"] == ["drain"]
    assert project.file("pkg/a.py").startswith("def answer():\n    return 41")
    again = project.deployer("rollback", cut)
    assert again.returncode == 2 and "already rolled back" in again.stderr, again.stderr
