"""The rollout-strategy seam: a strategy says which hosts go in which batch and whether the next batch starts; the
runner (with a real fleet.json) does what it says. The integration tests in test_fleet.py drive it through apply."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from deployer.config.models import Rollout
from deployer.errors import DeployerError
from deployer.fleet.record import FleetRecord, new_state
from deployer.fleet.runner import FleetCancel, FleetRunner
from deployer.fleet.strategies import Batches, Strategy, TakingTurns, Together, strategy_for
from deployer.run.engine import RunResult

HOSTS = [f"h{n}" for n in range(5)]


def run_fleet(tmp_path: Path, strategy: Strategy, failing: set[str],
              cancel: FleetCancel | None = None) -> tuple[FleetRecord, list[str], list[dict[str, Any]]]:
    """The strategy's batches over HOSTS, each host's task failing if named; the hosts the runner started, in order."""
    state = new_state("apply", "fix", "tester", HOSTS, strategy.batches(HOSTS, {}), 1)
    record = FleetRecord.create(tmp_path / "runs", state)
    started: list[str] = []
    events: list[dict[str, Any]] = []

    def task(host: str, fleet_id: str) -> RunResult:
        started.append(host)
        if host in failing:
            raise DeployerError(f"{host} failed")
        return RunResult(f"run-{host}", tmp_path / host, "successful", 0, None, "a", "b", {}, "succeeded")

    FleetRunner(record, strategy, 1, cancel or FleetCancel(), [events.append]).run(task)
    return record, started, events


def test_the_batches_strategy_is_the_rollout_the_playbook_asks_for_with_each_unit_in_one_batch() -> None:
    rollout = Rollout(batches=[1, "50%"], max_failures=1)
    strategy = strategy_for(rollout)
    assert isinstance(strategy, Batches) and strategy.rollout is rollout
    assert strategy.batches(HOSTS, {}) == [["h0"], ["h1", "h2", "h3"], ["h4"]]
    # a unit's hosts go in the batch of its earliest host; a batch it empties is dropped
    assert strategy.batches(HOSTS, {"pd": ["h4", "h1"]}) == [["h0"], ["h1", "h2", "h3", "h4"]]
    assert strategy.batches(HOSTS, {"pd": ["h0", "h4"]}) == [["h0", "h4"], ["h1", "h2", "h3"]]


def test_a_failed_canary_stops_the_batches_and_no_later_host_is_started(tmp_path: Path) -> None:
    record, started, events = run_fleet(tmp_path, Batches(Rollout(batches=[1, 2])), failing={"h0"})
    assert started == ["h0"]
    assert record.state.stopped_after_batch == 0 and record.state.untouched() == HOSTS[1:]
    [stopped] = [e for e in events if e["type"] == "fleet_stopped"]
    assert stopped["batch"] == 1 and stopped["failed"] == 1 and stopped["untouched"] == HOSTS[1:]
    assert FleetRecord.load(tmp_path / "runs", record.state.fleet_id).state.stopped_after_batch == 0


def test_batches_go_on_until_more_hosts_than_max_failures_failed(tmp_path: Path) -> None:
    record, started, _ = run_fleet(tmp_path, Batches(Rollout(batches=[1, 2], max_failures=1)), failing={"h0", "h2"})
    assert started == ["h0", "h1", "h2"]  # one failure is allowed; the second stops the third batch
    assert record.state.stopped_after_batch == 1 and record.state.untouched() == ["h3", "h4"]
    assert record.state.hosts["h1"].status == "successful" and record.state.hosts["h2"].status == "failed"


def test_together_runs_every_host_in_one_batch_whatever_fails(tmp_path: Path) -> None:
    record, started, _ = run_fleet(tmp_path, Together(), failing={"h0", "h1"})
    assert record.state.batches == [HOSTS] and sorted(started) == HOSTS
    assert record.state.stopped_after_batch is None and record.state.untouched() == []


def test_a_cancel_cuts_the_pause_between_batches_short_and_no_further_batch_starts(tmp_path: Path) -> None:
    cancel = FleetCancel()
    strategy = Batches(Rollout(batches=[1], pause_s=600))
    state = new_state("apply", "fix", "tester", HOSTS, strategy.batches(HOSTS, {}), 1)
    cancel.cancel()
    began = time.monotonic()
    assert strategy.proceed(1, state, cancel)  # nothing failed: the strategy would go on, the cancel stops it
    assert time.monotonic() - began < 60
    record, started, _ = run_fleet(tmp_path, strategy, failing=set(), cancel=cancel)
    assert started == [] and record.state.stopped_after_batch == -1 and record.state.untouched() == HOSTS


def test_a_rollback_takes_turns_per_router_and_a_signal_after_its_first_turn_stops_no_later_one(tmp_path: Path) -> None:
    strategy = TakingTurns({"u1": "r", "u2": "r", "u3": "s", "u4": None})
    units = {"u1": ["h1"], "u2": ["h0"], "u3": ["h2"], "u4": ["h3"]}
    # Router r's units one after the other (in host order: u2 first); the rest beside each router's first unit.
    assert strategy.batches(HOSTS, units) == [["h0", "h2", "h3", "h4"], ["h1"]]
    cancel = FleetCancel()
    state = new_state("rollback", "fix", "tester", HOSTS, strategy.batches(HOSTS, units), 1)
    started: list[str] = []

    def task(host: str, fleet_id: str) -> RunResult:
        started.append(host)
        cancel.cancel()  # a signal during the first turn: the rollback still rolls the next unit back
        return RunResult(f"run-{host}", tmp_path / host, "successful", 0, None, "a", "b", {}, "succeeded")

    FleetRunner(FleetRecord.create(tmp_path / "runs", state), strategy, 1, cancel, []).run(task)
    assert started == ["h0", "h2", "h3", "h4", "h1"] and state.stopped_after_batch is None
    stopped = new_state("rollback", "fix", "tester", HOSTS, strategy.batches(HOSTS, units), 1)
    FleetRunner(FleetRecord.create(tmp_path / "again", stopped), strategy, 1, cancel, []).run(task)
    assert stopped.untouched() == HOSTS  # signalled before it began: nothing starts
