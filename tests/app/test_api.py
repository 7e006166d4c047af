"""deployer.app as a user's own automation uses it (a CI job, a notebook): typed options in, an outcome out, no
click, no terminal. A local target (a real git repo, the agent as a real process) takes the fix, and the outcome
says what the command line's --json would: the run's id, whether it changed the target, its exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager
from typing import Any

import pytest
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, hold_lock
from fixtures_services import Stack

from deployer import app
from deployer.errors import ConfigError, DeployerError

LOCAL = pytest.mark.parametrize("target", ["local"], indirect=True)


def where(target: Project) -> dict[str, Any]:
    """The inventory and runs dir a caller names itself (no environment, no cwd)."""
    return {"inventory": target.inventory, "runs_dir": target.runs}


@LOCAL
def test_an_apply_returns_its_run_changed_and_exit_0_and_a_second_one_is_unchanged(
        target: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(target.root / "cache"))
    playbook = target.playbook()
    events: list[dict[str, Any]] = []
    outcome = app.apply(app.ApplyOptions(playbook=playbook, host="box", **where(target)), listener=events.append)
    assert isinstance(outcome, app.RunOutcome)
    assert (outcome.exit_code, outcome.changed, outcome.error) == (0, True, None)
    assert outcome.run_id == target.newest_run()
    assert outcome.document()["state"] == "succeeded" and outcome.document()["run_id"] == outcome.run_id
    assert target.file("pkg/a.py") == FIXED_A
    assert {e["type"] for e in events} >= {"run_start", "run_end"}  # the listener heard the run as it went

    again = app.apply(app.ApplyOptions(playbook=playbook, host="box", **where(target)))
    assert isinstance(again, app.RunOutcome) and again.run_id != outcome.run_id
    assert (again.exit_code, again.changed, again.document()["state"]) == (0, False, "unchanged")


@LOCAL
def test_a_rollback_of_an_applied_run_puts_the_file_back_and_says_it_changed_the_target(
        target: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(target.root / "cache"))
    applied = app.apply(app.ApplyOptions(playbook=target.playbook(), host="box", **where(target)))
    assert applied.exit_code == 0 and isinstance(applied, app.RunOutcome)
    undone = app.rollback(app.RollbackOptions(run_id=applied.run_id, **where(target)))
    assert isinstance(undone, app.RunOutcome)
    assert (undone.exit_code, undone.changed) == (0, True)
    assert undone.document()["state"] == "rolled_back"
    assert target.file("pkg/a.py") == ORIGINAL_A


@LOCAL
def test_a_plan_returns_each_steps_actions_as_data_and_changes_nothing(target: Project) -> None:
    outcome = app.plan(app.PlanOptions(playbook=target.playbook(), host="box", **where(target)))
    assert isinstance(outcome, app.PlanOutcome) and outcome.exit_code == 0 and outcome.error is None
    (one,) = outcome.plans
    steps = dict(one.report.steps)
    assert list(steps) == ["local_compile", "upload", "remote_compile", "diff_bounds", "commit"]
    # the upload stages the file beside its dest: one put, named for its dest
    assert [(a.describe()["kind"], a.describe()["key"]) for a in steps["upload"]] == [("put", "stage:pkg/a.py")]
    assert [f.dest for f in one.report.files] == ["pkg/a.py"]
    assert outcome.document()["host"] == "box" and outcome.document()["exit_code"] == 0
    assert target.file("pkg/a.py") == ORIGINAL_A and not target.runs.exists()


@LOCAL
def test_a_plan_over_its_bounds_is_a_failed_outcome_not_an_exception(target: Project) -> None:
    playbook = target.playbook(steps=["local_compile", "upload", {"diff_bounds": {"files": 1, "insertions": 1}},
                                      {"commit": {"message": "too big"}}])
    outcome = app.plan(app.PlanOptions(playbook=playbook, host="box", **where(target)))
    assert outcome.exit_code == 1
    assert outcome.error is not None and "bounds" in outcome.error


@LOCAL
def test_a_check_reads_the_host_and_a_held_lock_is_a_failed_row_with_exit_3(target: Project) -> None:
    playbook = target.playbook()
    ready = app.check(app.CheckOptions(host="box", playbook=playbook, **where(target)))
    assert ready.exit_code == 0, ready.document()
    rows = {c.name: c.status for c in ready.reports[0].checks}
    assert rows["lock"] == "ok" and "fail" not in rows.values()
    assert ready.document()["host"] == "box"  # one host: its own report, as `check --json` prints it
    hold_lock(target)
    held = app.check(app.CheckOptions(host="box", **where(target)))
    assert held.exit_code == 3
    assert [c.name for c in held.reports[0].checks if c.status == "fail"] == ["lock"]
    assert target.file("pkg/a.py") == ORIGINAL_A


@LOCAL
def test_a_restart_is_a_run_of_its_own_and_a_services_log_comes_back_as_data(target: Project, stack: Stack) -> None:
    stack.start_services()
    restarted = app.restart(app.RestartOptions(host="box", services=("prefill",), **where(target)))
    assert isinstance(restarted, app.RunOutcome) and restarted.exit_code == 0, restarted.document()
    assert restarted.run_id == target.newest_run() and target.events()[0]["kind"] == "restart"
    read = app.read_logs(app.LogOptions(host="box", service="prefill", inventory=target.inventory))
    (log,) = read.logs
    assert (log.host, log.service, log.missing) == ("box", "prefill", False)
    assert "Serving HTTP" in log.text, log.text  # http.server's own start line, of this start
    assert read.document()["logs"][0]["service"] == "prefill" and read.exit_code == 0


@LOCAL
def test_a_refusal_before_any_run_raises_its_typed_error_with_its_exit_code(target: Project) -> None:
    playbook = target.playbook()
    with pytest.raises(ConfigError) as refused:
        app.apply(app.ApplyOptions(playbook=playbook, host="nosuchhost", **where(target)))
    assert refused.value.exit_code == 2 and "nosuchhost" in str(refused.value)
    with pytest.raises(DeployerError) as unknown:
        app.rollback(app.RollbackOptions(run_id="nosuchrun", **where(target)))
    assert unknown.value.exit_code == 2
    assert not target.runs.exists() or list(target.runs.iterdir()) == []  # nothing was recorded
    assert target.file("pkg/a.py") == ORIGINAL_A


@LOCAL
def test_a_run_refused_on_the_target_is_a_returned_outcome_recorded_under_its_run_id(
        target: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(target.root / "cache"))
    hold_lock(target)
    held = app.lock_status(app.LockOptions(host="box", **where(target)))
    assert held.exit_code == 3 and held.document()["locked"] is True
    refused = app.apply(app.ApplyOptions(playbook=target.playbook(), host="box", **where(target)))
    assert isinstance(refused, app.RunOutcome)
    assert (refused.exit_code, refused.changed, refused.document()["state"]) == (3, False, "refused")
    assert refused.run_id == target.newest_run()
    assert target.file("pkg/a.py") == ORIGINAL_A


@LOCAL
def test_the_history_lists_a_run_and_verifies_its_log(target: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(target.root / "cache"))
    applied = app.apply(app.ApplyOptions(playbook=target.playbook(), host="box", **where(target)))
    listed = app.history(app.HistoryOptions(runs_dir=target.runs, host="box"))
    assert [run.run_id for run in listed.runs] == [applied.run_id]
    assert listed.document()["runs"][0]["state"] == "succeeded"
    assert app.recorded("last", target.runs).run is not None
    verified = app.verify(app.VerifyOptions(run_id=applied.run_id, on_target=True, **where(target)))
    assert (verified.exit_code, verified.problems) == (0, [])
    assert verified.vouched is not None and verified.vouched["box"]  # what the target's history vouched for
    events = target.runs / applied.run_id / "events.jsonl"
    events.write_text(events.read_text().replace('"box"', '"b0x"', 1))
    tampered = app.verify(app.VerifyOptions(run_id=applied.run_id, **where(target)))
    assert tampered.exit_code == 5 and tampered.problems


@LOCAL
def test_a_watch_is_handed_the_run_as_it_starts_and_can_cancel_it(target: Project,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(target.root / "cache"))
    watched: list[app.Watched] = []

    @contextmanager
    def cancel_at_once(run: app.Watched) -> Any:
        watched.append(run)
        run.cancel.cancel("stopped by the caller")
        yield

    outcome = app.apply(app.ApplyOptions(playbook=target.playbook(), host="box", **where(target)),
                        watch=cancel_at_once)
    assert [(w.kind, w.hosts) for w in watched] == [("host", ["box"])]
    assert outcome.exit_code == 130 and outcome.changed is False
    assert target.file("pkg/a.py") == ORIGINAL_A


@LOCAL
def test_the_api_runs_without_click_or_rich_loaded(target: Project) -> None:
    target.playbook()
    code = ("import json, sys\nfrom deployer import app\n"
            f"o = app.apply(app.ApplyOptions(playbook='fix.yaml', host='box', inventory={str(target.inventory)!r},"
            f" runs_dir={str(target.runs)!r}))\n"
            "print(json.dumps([o.exit_code, o.changed, sorted(m for m in ('click', 'rich') if m in sys.modules)]))")
    env = {**target.env(), "XDG_CACHE_HOME": str(target.root / "cache")}
    done = subprocess.run([sys.executable, "-c", code], cwd=target.root, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [0, True, []]


def test_every_name_the_api_exports_resolves() -> None:
    for name in app.__all__:
        assert getattr(app, name) is not None
    import deployer.app.restarts  # noqa: F401 -- a use case's module loaded first never hides its function
    assert callable(app.restart)
    with pytest.raises(AttributeError):
        _ = app.no_such_use_case
