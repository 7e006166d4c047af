"""Pause, approve, resume (issue 37 item 3): a fleet run over real sshd (four hosts on two sshd instances) that
pauses after its first batch stops there with exit 8 and its state in fleet.json; `deployer rollout resume`
finishes it from another directory, `rollout abort` rolls back what it did; an inconclusive analysis (read from a
real HTTP server's Prometheus text) pauses when the rollout says so; `--lock-wait` waits for a held deploy lock.
The runner's timed pause is tested on a real fleet.json with stand-in tasks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, deployer, deployer_env, git
from fixtures_services import served
from pydantic import ValidationError
from test_fleet import BOUNDED, HOSTS, UNIT_STEPS, as_json, fleet, pd_unit, repo, second_sshd, serving
from test_notify import Hook, hook, notify

from deployer.config.rollout import Rollout
from deployer.fleet.record import FleetRecord, new_state
from deployer.fleet.runner import FleetCancel, FleetRunner, finish
from deployer.fleet.strategies import Batches
from deployer.run.engine import RunResult

__all__ = ["fleet", "hook", "pd_unit", "second_sshd"]  # the fixtures, used by name
PAUSED = 8
PAUSE_AFTER_CANARY = {"batches": [1, "100%"], "steps": ["batch", {"pause": {}}]}


def record(project: Project, fleet_id: str) -> dict[str, Any]:
    data = json.loads((project.runs / fleet_id / "fleet.json").read_text())
    assert isinstance(data, dict)
    return data


def deploy_commits(project: Project, host: str) -> int:
    return int(git(repo(project, host), "rev-list", "--count", "--grep=^Deployer-Run: ", "HEAD").strip())


def elsewhere(project: Project, *args: str) -> Any:
    """deployer run from another directory, with only the runs dir in its environment (no inventory): as a person
    coming back later, in another shell."""
    other = project.root / "elsewhere"
    other.mkdir(exist_ok=True)
    return deployer(*args, cwd=other, env=deployer_env(DEPLOYER_RUNS_DIR=str(project.runs)), timeout=180)


def hold(project: Project, host: str) -> Path:
    """host's deploy lock held by a live-looking run of someone else (fresh heartbeat)."""
    lock = repo(project, host) / ".git" / "deployer.run.lock"
    lock.mkdir()
    (lock / "info.json").write_text(json.dumps({"run_id": "20260101T000000.000Z-abcdef", "operator": "alice@ops",
                                                "pid": 4242, "ttl_s": 600}))
    (lock / "heartbeat").write_text("")
    return lock


def release_when_waited(proc: Any, lock: Path, seconds: float = 60) -> str:
    """Reads the run's stderr until it says it waits for the lock, then releases the lock; what it read."""
    seen: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if "waiting up to" in line:
            shutil.rmtree(lock)
            return "".join(seen)
    raise AssertionError(f"never said it waits for the lock:\n{''.join(seen)}")


def test_a_pause_after_the_first_batch_exits_8_and_resume_from_another_directory_finishes_it(fleet: Project) -> None:
    fleet.playbook(steps=BOUNDED, rollout=PAUSE_AFTER_CANARY)
    result = fleet.deployer("apply", "fix.yaml", "--host", "all", "--json")
    report = as_json(result)
    assert result.returncode == PAUSED, report
    assert report["status"] == "paused" and report["exit_code"] == PAUSED
    assert f"deployer rollout resume {report['fleet_id']}" in report["error"]
    fleet_id = report["fleet_id"]
    [pause] = record(fleet, fleet_id)["pauses"]
    assert pause["before_batch"] == 1 and pause["ended"] is None and "after batch 1 (h1)" in pause["reason"]
    assert "paused before batch 2: the rollout pauses after batch 1 (h1)" in report["error"]
    # only the first batch was patched
    assert (repo(fleet, "h1") / "pkg/a.py").read_text() == FIXED_A
    for host in HOSTS[1:]:
        assert (repo(fleet, host) / "pkg/a.py").read_text() == ORIGINAL_A
        assert report["hosts"][host]["status"] == "untouched"
    assert not any((repo(fleet, h) / ".git" / "deployer.run.lock").exists() for h in HOSTS)  # nothing held
    # Later, anywhere: runs show says why it paused, since when, what is next and the two commands that end it.
    shown = elsewhere(fleet, "runs", "show", fleet_id)
    assert shown.returncode == 0, shown.stderr
    assert (f"paused before batch 2 (h2, h3, h4) since {pause['since']}: the rollout pauses after batch 1 (h1)"
            in shown.stdout), shown.stdout
    assert f"go on with: deployer rollout resume {fleet_id}\n" in shown.stdout
    assert f"or roll back every host that committed: deployer rollout abort {fleet_id}\n" in shown.stdout
    listed = elsewhere(fleet, "runs", "list").stdout
    assert (f"{fleet_id} paused before batch 2 (h2, h3, h4) since {pause['since']}: " in listed
            and f"deployer rollout resume {fleet_id} | deployer rollout abort {fleet_id}" in listed), listed
    data = as_json(elsewhere(fleet, "runs", "show", fleet_id, "--json"))
    assert data["pauses"] == [pause] and data["held"] == [] and data["batches"][1] == ["h2", "h3", "h4"]

    # The playbook changed meanwhile: resuming would ship another fix, so it is refused.
    original = (fleet.root / "fix.yaml").read_text()
    (fleet.root / "fix.yaml").write_text(original + "\n# edited\n")
    changed = elsewhere(fleet, "rollout", "resume", fleet_id, "--json")
    assert changed.returncode == 2 and "changed since fleet run" in as_json(changed)["error"]
    (fleet.root / "fix.yaml").write_text(original)

    # Resumed from another directory (its inventory from the record), by a beginning of its id, waiting for a
    # lock that another run holds on h2 until it is released.
    lock = hold(fleet, "h2")
    other = fleet.root / "elsewhere"
    proc = subprocess.Popen(
        [sys.executable, "-m", "deployer", "rollout", "resume", fleet_id[:-2], "--lock-wait", "60", "--json"],
        cwd=other, env=deployer_env(DEPLOYER_RUNS_DIR=str(fleet.runs)), text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    said = release_when_waited(proc, lock)
    assert "held by run 20260101T000000.000Z-abcdef of alice@ops" in said
    out, err = proc.communicate(timeout=180)
    resumed = json.loads(out)
    assert proc.returncode == 0 and resumed["status"] == "successful", (resumed, err)
    assert resumed["fleet_id"] == fleet_id
    for host in HOSTS:
        assert (repo(fleet, host) / "pkg/a.py").read_text() == FIXED_A
        assert deploy_commits(fleet, host) == 1  # h1 was not applied again
    assert resumed["hosts"]["h1"]["run_id"] == report["hosts"]["h1"]["run_id"]
    [pause] = record(fleet, fleet_id)["pauses"]
    assert pause["ended_by"] == "resume"
    again = elsewhere(fleet, "rollout", "resume", fleet_id, "--json")
    assert again.returncode == 2 and "is not paused (it is successful)" in as_json(again)["error"]


def test_plan_shows_each_pause_between_the_batches_it_separates(fleet: Project) -> None:
    fleet.playbook(steps=BOUNDED, rollout={"batches": [1], "steps": ["batch", {"pause": {}}, "batch",
                                                                     {"pause": {"duration": "2m"}}]})
    planned = fleet.deployer("plan", "fix.yaml", "--host", "h1,h2,h3")
    assert planned.returncode == 0, planned.stderr
    lines = [line for line in planned.stdout.splitlines() if line.startswith(("batch ", "pause"))]
    assert lines == ["batch 1: h1", "pause until resumed (deployer rollout resume FLEET_ID)", "batch 2: h2",
                     "pause 120s", "batch 3: h3"]
    document = as_json(fleet.deployer("plan", "fix.yaml", "--host", "h1,h2,h3", "--json"))
    assert document["rollout"]["pauses"] == [{"before_batch": 1, "duration_s": None},
                                             {"before_batch": 2, "duration_s": 120.0}]


def test_abort_of_a_paused_rollout_rolls_back_the_hosts_it_patched_and_never_touches_the_rest(fleet: Project) -> None:
    fleet.playbook(steps=BOUNDED, rollout={"batches": [2, "100%"], "steps": ["batch", {"pause": {}}]})
    trees = {h: git(repo(fleet, h), "rev-parse", "HEAD^{tree}").strip() for h in HOSTS}
    heads = {h: git(repo(fleet, h), "rev-parse", "HEAD").strip() for h in HOSTS}
    paused = as_json(fleet.deployer("apply", "fix.yaml", "--host", "all", "--json"))
    assert paused["status"] == "paused" and paused["batches"] == [["h1", "h2"], ["h3", "h4"]]
    fleet_id = paused["fleet_id"]

    aborted = elsewhere(fleet, "rollout", "abort", fleet_id, "--json")
    report = as_json(aborted)
    assert aborted.returncode == 0 and report["status"] == "aborted", report
    assert set(report["rollback"]["hosts"]) == {"h1", "h2"} and report["rollback"]["status"] == "successful"
    for host in ("h1", "h2"):  # a revert commit over the fix: the old tree again
        assert git(repo(fleet, host), "rev-parse", "HEAD^{tree}").strip() == trees[host]
    for host in ("h3", "h4"):
        assert git(repo(fleet, host), "rev-parse", "HEAD").strip() == heads[host]
    saved = record(fleet, paused["fleet_id"])
    assert saved["status"] == "aborted" and saved["pauses"][0]["ended_by"] == "abort"
    assert saved["rolled_back_by"] == [report["rollback"]["fleet_id"]]
    assert elsewhere(fleet, "rollout", "resume", fleet_id).returncode == 2  # aborted: nothing to go on with
    shown = elsewhere(fleet, "runs", "show", fleet_id).stdout
    rollback_id = report["rollback"]["fleet_id"]
    assert f"aborted while paused before batch 2: rolled back by fleet run {rollback_id} (successful)" in shown, shown
    assert "before batch 2 (h3, h4) from " in shown and "resume to go on, abort to roll back; aborted at " in shown
    assert "deployer rollout resume" not in shown  # nothing left to resume


def test_resume_refuses_when_a_host_of_an_earlier_batch_no_longer_holds_the_fix(fleet: Project) -> None:
    fleet.playbook(steps=BOUNDED, rollout=PAUSE_AFTER_CANARY)
    paused = as_json(fleet.deployer("apply", "fix.yaml", "--host", "h1,h2", "--json"))
    assert paused["status"] == "paused"
    (repo(fleet, "h1") / "pkg/a.py").write_text(ORIGINAL_A)  # someone put the old code back by hand
    git(repo(fleet, "h1"), "commit", "-qam", "back to the old a.py")
    refused = elsewhere(fleet, "rollout", "resume", paused["fleet_id"], "--json")
    error = as_json(refused)["error"]
    assert refused.returncode == 2 and "h1: pkg/a.py no longer as its run" in error, error
    assert (repo(fleet, "h2") / "pkg/a.py").read_text() == ORIGINAL_A  # nothing went on
    assert record(fleet, paused["fleet_id"])["status"] == "paused"


TTFT = "sglang:time_to_first_token_seconds"
STILL = "".join(f'{TTFT}_bucket{{le="{le}"}} 3\n' for le in ("0.1", "0.5", "+Inf")) + f"{TTFT}_sum 0.3\n" \
    f"{TTFT}_count 3\n"


@pytest.fixture
def metrics() -> Iterator[str]:
    """A real HTTP server whose /metrics is Prometheus text that never changes: no request served in any window,
    so every analysis of it is too few observations (inconclusive)."""
    with served(lambda path: f"# TYPE {TTFT} histogram\n{STILL}".encode()) as server:
        yield f"http://127.0.0.1:{server.port}/metrics"


def test_an_inconclusive_analysis_pauses_the_rollout_when_asked_and_resume_approves_the_held_hosts(
        fleet: Project, metrics: str) -> None:
    analysis = {"analysis": {"url": metrics, "baseline": {"metrics": metrics}, "interval_s": 0.2, "windows": 2,
                             "checks": [{"kind": "histogram", "name": "p99 TTFT", "metric": TTFT,
                                         "min_samples": 5}]}}
    fleet.playbook(steps=[*BOUNDED, analysis], rollout={"batches": [1, "100%"], "on_inconclusive": "pause"},
                   on_failure="rollback_fleet")
    result = fleet.deployer("apply", "fix.yaml", "--host", "h1,h2,h3", "--json")
    report = as_json(result)
    assert result.returncode == PAUSED, report
    fleet_id = report["fleet_id"]
    [pause] = record(fleet, fleet_id)["pauses"]
    assert pause["before_batch"] == 1 and "inconclusive on h1" in pause["reason"]
    # held, not rolled back (though on_failure says rollback_fleet), and no further batch started
    assert report["hosts"]["h1"]["exit_code"] == 7 and (repo(fleet, "h1") / "pkg/a.py").read_text() == FIXED_A
    assert report["untouched"] == ["h2", "h3"]
    assert report["hosts"]["h1"]["shown"] == "held"  # as the table says it, beside its run's failed_committed

    first = elsewhere(fleet, "rollout", "resume", fleet_id, "--json")
    again = as_json(first)
    # h1 approved; h2 and h3 are inconclusive too: held after the last batch, for a person again
    assert first.returncode == PAUSED and again["hosts"]["h1"]["approved"], again
    assert "inconclusive on h2, h3" in again["error"] and "after its last batch" in again["error"]
    assert again["held"] == ["h2", "h3"]
    assert [again["hosts"][h]["shown"] for h in ("h1", "h2", "h3")] == ["approved", "held", "held"], again
    shown = elsewhere(fleet, "runs", "show", fleet_id).stdout
    assert "paused after its last batch since " in shown and "held for approval: h2, h3 (resume approves them)" in shown
    assert "paused before batch 2 (h2, h3) from " in shown and "; resumed at " in shown, shown
    last = as_json(elsewhere(fleet, "rollout", "resume", fleet_id, "--json"))
    assert last["status"] == "successful" and last["exit_code"] == 0, last
    assert all((repo(fleet, h) / "pkg/a.py").read_text() == FIXED_A for h in ("h1", "h2", "h3"))


def held_unit(pd_unit: Project, metrics: str) -> dict[str, Any]:
    """A fleet apply of unit pd-1 then h2 whose analysis (on the still metrics) is inconclusive: paused after the
    unit's batch, under on_inconclusive: pause (and on_failure: rollback_fleet, which a hold must not trigger)."""
    analysis = {"analysis": {"url": metrics, "baseline": {"metrics": metrics}, "interval_s": 0.2, "windows": 2,
                             "checks": [{"kind": "histogram", "name": "p99 TTFT", "metric": TTFT,
                                         "min_samples": 5}]}}
    pd_unit.playbook(steps=[*UNIT_STEPS, analysis], rollout={"batches": [1, "100%"], "on_inconclusive": "pause"},
                     on_failure="rollback_fleet")
    serving(pd_unit)
    result = pd_unit.deployer("apply", "fix.yaml", "--host", "pd-1,h2", "--json")
    report = as_json(result)
    assert result.returncode == PAUSED, report
    return dict(report)


def test_an_inconclusive_unit_is_held_whole_under_on_inconclusive_pause_and_resume_approves_all_of_it(
        pd_unit: Project, metrics: str) -> None:
    """Unit pd-1 (prefill h1, decode h3) restarts as one and is judged on its metrics host: the inconclusive
    analysis holds both hosts (neither done, neither rolled back, though on_failure says rollback_fleet)."""
    report = held_unit(pd_unit, metrics)
    assert report["batches"] == [["h1", "h3"], ["h2"]] and report["untouched"] == ["h2"], report
    assert sorted(report["held"]) == ["h1", "h3"], report
    for host in ("h1", "h3"):  # the unit's commit kept on both, none rolled back, none counted done
        run = report["hosts"][host]
        assert run["status"] != "successful" and run["rollback_status"] is None, run
        assert (repo(pd_unit, host) / "pkg/a.py").read_text() == FIXED_A
        assert deploy_commits(pd_unit, host) == 1
    [pause] = report["pauses"]
    assert pause["before_batch"] == 1 and "inconclusive on h1, h3" in pause["reason"], pause

    resumed = as_json(elsewhere(pd_unit, "rollout", "resume", report["fleet_id"], "--json"))
    # h2 is inconclusive too (the same still metrics): held after the last batch; the unit is approved whole
    assert resumed["hosts"]["h1"]["approved"] and resumed["hosts"]["h3"]["approved"], resumed
    assert resumed["held"] == ["h2"] and all(deploy_commits(pd_unit, h) == 1 for h in ("h1", "h3"))
    done = as_json(elsewhere(pd_unit, "rollout", "resume", report["fleet_id"], "--json"))
    assert done["status"] == "successful" and done["exit_code"] == 0, done
    assert all((repo(pd_unit, h) / "pkg/a.py").read_text() == FIXED_A for h in ("h1", "h2", "h3"))


def test_abort_of_an_inconclusive_unit_rolls_back_the_whole_unit_as_one(pd_unit: Project, metrics: str) -> None:
    report = held_unit(pd_unit, metrics)
    # No traffic judges the reverted build either: its analysis against the sibling is inconclusive again, which
    # holds nothing in a rollback (the revert is what the person chose): said, not judged, never passed.
    aborted = elsewhere(pd_unit, "rollout", "abort", report["fleet_id"], "--json")
    done = as_json(aborted)
    assert aborted.returncode == 0 and done["status"] == "aborted", done
    assert done["rollback"]["units"] == {"pd-1": ["h1", "h3"]} and done["rollback"]["status"] == "successful"
    rollback_run = done["rollback"]["hosts"]["h1"]["run_id"]
    ends = [e for e in pd_unit.events(rollback_run) if e["type"] == "step_end" and
            e.get("step") == "rollback:analysis"]
    assert ends and ends[-1]["status"] == "ok" and ends[-1]["summary"].startswith("not judged: "), ends
    for host in ("h1", "h3"):
        assert (repo(pd_unit, host) / "pkg/a.py").read_text() == ORIGINAL_A
    assert (repo(pd_unit, "h2") / "pkg/a.py").read_text() == ORIGINAL_A and deploy_commits(pd_unit, "h2") == 0


def test_without_on_inconclusive_pause_an_inconclusive_host_fails_the_batch_as_before(fleet: Project,
                                                                                        metrics: str) -> None:
    analysis = {"analysis": {"url": metrics, "baseline": {"metrics": metrics}, "interval_s": 0.2, "windows": 1,
                             "checks": [{"kind": "histogram", "name": "p99 TTFT", "metric": TTFT,
                                         "min_samples": 5}]}}
    fleet.playbook(steps=[*BOUNDED, analysis], rollout={"batches": [1, "100%"]})
    result = fleet.deployer("apply", "fix.yaml", "--host", "h1,h2", "--json")
    report = as_json(result)
    assert result.returncode == 7 and report["status"] == "failed" and report["untouched"] == ["h2"], report


def test_lock_wait_times_out_with_a_clear_error_when_the_lock_stays_held(fleet: Project) -> None:
    fleet.playbook(steps=BOUNDED)
    hold(fleet, "h1")
    began = time.monotonic()
    result = fleet.deployer("apply", "fix.yaml", "--host", "h1,h2", "--lock-wait", "1.5", "--json")
    report = as_json(result)
    assert result.returncode == 3, report
    assert "still held after waiting 1.5s for it (--lock-wait)" in report["hosts"]["h1"]["error"]
    assert "held by run 20260101T000000.000Z-abcdef of alice@ops" in report["hosts"]["h1"]["error"]
    assert time.monotonic() - began >= 1.5
    assert report["hosts"]["h2"]["status"] == "successful"


def test_lock_wait_on_a_single_host_apply_goes_on_once_the_lock_is_released(fleet: Project) -> None:
    fleet.playbook(steps=BOUNDED)
    lock = hold(fleet, "h1")
    proc = fleet.popen("apply", "fix.yaml", "--host", "h1", "--lock-wait", "60", "--json")
    release_when_waited(proc, lock)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert (repo(fleet, "h1") / "pkg/a.py").read_text() == FIXED_A


def test_a_webhook_hears_the_pause_then_the_resume_and_the_resumed_batches(fleet: Project, hook: Hook) -> None:
    notify(fleet, webhooks=[{"url": hook.url}])
    fleet.playbook(steps=BOUNDED, rollout=PAUSE_AFTER_CANARY)
    paused = as_json(fleet.deployer("apply", "fix.yaml", "--host", "h1,h2,h3", "--json"))
    types = [d["type"] for d in hook.documents]
    assert types == ["rollout.start", "batch.start", "host.end", "batch.end", "rollout.paused", "rollout.end"]
    pause = hook.documents[4]
    assert pause["fleet"] == paused["fleet_id"] and pause["batch"] == 1 and pause["data"]["done"] == ["h1"]
    assert hook.documents[-1]["status"] == "paused" and hook.documents[-1]["exit_code"] == PAUSED
    del hook.posts[:]
    resumed = elsewhere(fleet, "rollout", "resume", paused["fleet_id"], "--json")
    assert resumed.returncode == 0, resumed.stderr
    docs = hook.documents
    assert [d["type"] for d in docs] == ["rollout.resumed", "batch.start", "host.end", "host.end", "batch.end",
                                         "rollout.end"]
    assert docs[4]["batch"] == 1 and docs[4]["data"]["hosts"] == {"h2": "successful", "h3": "successful"}
    assert docs[-1]["status"] == "successful" and all(d["fleet"] == paused["fleet_id"] for d in docs)


# -- the runner and the config, on a real fleet.json with stand-in tasks ----------------------------------------

NAMES = ["a", "b", "c"]


def ok(host: str, fleet_id: str) -> RunResult:
    return RunResult(f"run-{host}", Path(host), "successful", 0, None, "x", "y", {}, "succeeded")


def test_a_timed_pause_waits_then_goes_on_and_says_both(tmp_path: Path) -> None:
    strategy = Batches(Rollout(batches=[1], steps=["batch", {"pause": {"duration": "0.3s"}}]))
    state = new_state("apply", "fix", "tester", NAMES, strategy.batches(NAMES, {}), 1)
    events: list[dict[str, Any]] = []
    began = time.monotonic()
    FleetRunner(FleetRecord.create(tmp_path / "runs", state), strategy, 1, FleetCancel(), [events.append]).run(ok)
    assert time.monotonic() - began >= 0.3
    kinds = [(e["type"], e.get("batch")) for e in events if e["type"] in ("fleet_paused", "fleet_resumed",
                                                                           "batch_start")]
    assert kinds == [("batch_start", 0), ("fleet_paused", 1), ("fleet_resumed", 1), ("batch_start", 1),
                     ("batch_start", 2)]
    assert state.pause is None and all(run.status == "successful" for run in state.hosts.values())


def test_a_signal_during_a_timed_pause_stops_the_run_there(tmp_path: Path) -> None:
    strategy = Batches(Rollout(batches=[1], steps=["batch", {"pause": {"duration": "1h"}}]))
    state = new_state("apply", "fix", "tester", NAMES, strategy.batches(NAMES, {}), 1)
    cancel = FleetCancel()
    threading.Timer(0.3, cancel.cancel).start()
    began = time.monotonic()
    FleetRunner(FleetRecord.create(tmp_path / "runs", state), strategy, 1, cancel, []).run(ok)
    assert time.monotonic() - began < 60
    assert state.stopped_after_batch == 0 and state.untouched() == ["b", "c"]


def test_pause_steps_go_between_batches_and_durations_read_as_argo_writes_them(tmp_path: Path) -> None:
    rollout = Rollout(steps=["batch", {"pause": {}}, "batch", {"pause": {"duration": "10m"}}])
    assert {n: p.duration for n, p in rollout.pauses().items()} == {1: None, 2: 600.0}
    for steps in ([{"pause": {}}], ["batch", {"pause": {}}, {"pause": {"duration": 5}}]):
        with pytest.raises(ValidationError, match="a pause goes after a batch"):
            Rollout(steps=steps)
    with pytest.raises(ValidationError):
        Rollout(steps=["batch", {"pause": {"duration": "soon"}}])
    fleet_file = tmp_path / "playbook.yaml"
    fleet_file.write_text(yaml.safe_dump({"rollout": PAUSE_AFTER_CANARY}))
    assert Rollout(**yaml.safe_load(fleet_file.read_text())["rollout"]).pauses()[1].duration is None


def test_a_timed_pause_that_ran_its_time_is_recorded_as_ended_by_the_timer(tmp_path: Path) -> None:
    strategy = Batches(Rollout(batches=[1], steps=["batch", {"pause": {"duration": "0.2s"}}]))
    state = new_state("apply", "fix", "tester", NAMES, strategy.batches(NAMES, {}), 1)
    record = FleetRecord.create(tmp_path / "runs", state)
    FleetRunner(record, strategy, 1, FleetCancel(), []).run(ok)
    [pause] = json.loads((record.dir / "fleet.json").read_text())["pauses"]
    assert pause["before_batch"] == 1 and pause["ended_by"] == "timer" and pause["ended"] >= pause["since"], pause
    assert state.pause is None


def test_a_signal_between_batches_leaves_the_run_paused_before_the_next_one_with_exit_130(tmp_path: Path) -> None:
    strategy = Batches(Rollout(batches=[1]))
    state = new_state("apply", "fix", "tester", NAMES, strategy.batches(NAMES, {}), 1)
    cancel = FleetCancel()

    def signalled_as_it_ends(host: str, fleet_id: str) -> RunResult:  # the run ended well; the signal came after
        cancel.cancel()
        return ok(host, fleet_id)

    record = FleetRecord.create(tmp_path / "runs", state)
    FleetRunner(record, strategy, 1, cancel, []).run(signalled_as_it_ends)
    finish(record, cancel)
    assert state.untouched() == ["b", "c"] and state.status == "paused" and state.exit_code == 130, state
    assert state.pause is not None and state.pause.before_batch == 1
    assert state.pause.reason == "interrupted between batches"
    assert "go on with: deployer rollout resume" in str(state.error)
