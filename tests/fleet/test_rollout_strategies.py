"""The rollout-strategy seam: a strategy says which hosts go in which batch and whether the next batch starts; the
runner (with a real fleet.json) does what it says. The integration tests in test_fleet.py drive it through apply."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from deployer.config.models import Rollout
from deployer.errors import ConfigError, DeployerError
from deployer.fleet.record import FleetRecord, new_state
from deployer.fleet.runner import FleetCancel, FleetRunner
from deployer.fleet.strategies import (
    Batches,
    Rolling,
    Serving,
    Strategy,
    TakingTurns,
    Together,
    batch_plans,
    mixed_pairing,
    rolling_batches,
    strategy_for,
)
from deployer.run.engine import RunResult
from deployer.steps.playbook import parse_playbook

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


def pd_units(count: int) -> dict[str, Serving]:
    """count units behind router r, each one prefill and one decode worker (the demo's PD unit)."""
    return {f"u{n}": Serving("r", {"prefill": 1, "decode": 1}) for n in range(count)}


def split_units(prefills: int, decodes: int) -> dict[str, Serving]:
    """Units of one role each behind router r: prefill units p0.., decode units d0.."""
    return {**{f"p{n}": Serving("r", {"prefill": 1}) for n in range(prefills)},
            **{f"d{n}": Serving("r", {"decode": 1}) for n in range(decodes)}}


def out_by_role(batch: list[str], serving: dict[str, Serving]) -> Counter[str]:
    return Counter(role for name in batch for role, count in serving[name].roles.items() for _ in range(count))


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 7, 8, 16, 33])
@pytest.mark.parametrize("size", [1, 2, 3, 5, "1%", "25%", "50%", "100%"])
def test_rolling_batches_hold_at_most_max_unavailable_units_in_order_and_never_every_worker_of_a_role(
        count: int, size: int | str) -> None:
    serving = pd_units(count)
    order = list(serving)
    limit = max(1, size if isinstance(size, int) else -(-count * int(size[:-1]) // 100))
    batches = rolling_batches(order, serving, limit)
    assert [name for batch in batches for name in batch] == order  # each unit once, in selection order
    assert all(1 <= len(batch) <= limit for batch in batches)
    if count > 1:  # every batch leaves a prefill and a decode serving behind the router
        assert all(len(batch) < count for batch in batches)
    assert len(batches) == (1 if count == 1 else max(-(-count // limit), 2 if limit >= count else 1))


@pytest.mark.parametrize("prefills, decodes, limit", [(4, 4, 2), (4, 4, 4), (4, 4, 8), (2, 6, 4), (1, 3, 2),
                                                      (3, 9, 4), (8, 8, 5), (2, 2, 3)])
def test_rolling_batches_keep_the_prefill_decode_ratio_and_a_worker_of_each_role_serving(
        prefills: int, decodes: int, limit: int) -> None:
    serving = split_units(prefills, decodes)
    order = list(serving)  # every prefill first: the batches must still mix the roles
    batches = rolling_batches(order, serving, limit)
    assert sorted(name for batch in batches for name in batch) == sorted(order)
    total = {"prefill": prefills, "decode": decodes}
    for batch in batches:
        out = out_by_role(batch, serving)
        assert len(batch) <= limit
        # A batch takes a role's last worker only when its first unit alone does (the floor: one unit a batch).
        alone = out_by_role(batch[:1], serving)
        assert all(out[role] < total[role] or alone[role] == total[role] for role in total), batch
        # the roles' shares out of the router differ by no more than one unit's share of the smaller role
        shares = [out[role] / total[role] for role in total]
        assert max(shares) - min(shares) <= 1 / min(total.values()) + 1e-9, (batch, out)


def test_a_unit_alone_behind_its_role_still_gets_a_batch_of_its_own() -> None:
    serving = split_units(1, 3)  # one prefill unit: taking it out is downtime, which refuse_downtime judges
    assert rolling_batches(list(serving), serving, 4) == [["p0", "d0", "d1"], ["d2"]]
    assert rolling_batches(["d0", "p0", "d1", "d2"], serving, 4) == [["d0", "d1"], ["p0", "d2"]]


def test_units_behind_different_routers_and_hosts_behind_none_fill_a_batch_freely() -> None:
    serving = {"a1": Serving("a", {"regular": 1}), "a2": Serving("a", {"regular": 1}),
               "b1": Serving("b", {"regular": 1}), "b2": Serving("b", {"regular": 1})}
    # a1 and a2 are never out together (router a's last regular worker); a lone host x has no router
    assert rolling_batches(["a1", "a2", "b1", "b2", "x"], serving, 3) == [["a1", "b1", "x"], ["a2", "b2"]]


def test_rolling_max_unavailable_counts_units_and_keeps_each_unit_s_hosts_in_one_batch() -> None:
    hosts = [f"h{n}" for n in range(16)]
    units = {f"u{n}": [f"h{2 * n}", f"h{2 * n + 1}"] for n in range(8)}
    serving = pd_units(8)
    # 25% of 8 units: 2 units, 4 hosts, per batch
    strategy = strategy_for(Rollout(strategy="rolling", max_unavailable="25%"), serving)
    assert isinstance(strategy, Rolling)
    assert strategy.batches(hosts, units) == [hosts[n:n + 4] for n in range(0, 16, 4)]
    # 1 (the default) is one unit at a time, as before max_unavailable; 1% of 8 units is the floor, 1
    one = [hosts[n:n + 2] for n in range(0, 16, 2)]
    assert strategy_for(Rollout(strategy="rolling"), serving).batches(hosts, units) == one
    assert strategy_for(Rollout(strategy="rolling", max_unavailable="1%"), serving).batches(hosts, units) == one
    # 100%: all but the last, which keeps the router serving
    assert strategy_for(Rollout(strategy="rolling", max_unavailable="100%"), serving).batches(hosts, units) == [
        hosts[:14], hosts[14:]]


def test_plan_s_batches_say_what_each_router_keeps_serving_by_role_and_that_builds_may_pair_across() -> None:
    serving = split_units(2, 2)
    units = {name: [f"{name}-host"] for name in serving}
    batches = [["p0-host", "d0-host"], ["p1-host", "d1-host", "lone"]]
    plans = batch_plans(batches, units, serving)
    assert [plan.units for plan in plans] == [["p0", "d0"], ["p1", "d1", "lone"]]
    assert plans[0].left == {"r": {"prefill": (1, 2), "decode": (1, 2)}}
    assert plans[1].describe() == "p1, d1, lone — router r keeps prefill 1/2, decode 1/2"
    assert plans[1].document()["serving"] == {"r": {"prefill": {"serving": 1, "of": 2},
                                                    "decode": {"serving": 1, "of": 2}}}
    [note] = mixed_pairing(plans, serving)
    assert note.startswith("router r cannot tell a patched worker from an unpatched one")
    assert "patched prefill with an unpatched decode" in note
    # one batch (or a router of prefills alone) pairs no two builds
    assert mixed_pairing(batch_plans([[h for b in batches for h in b]], units, serving), serving) == []
    regular = {name: Serving("r", {"regular": 1}) for name in serving}
    assert mixed_pairing(batch_plans(batches, units, regular), regular) == []


@pytest.mark.parametrize("rollout, where, problem", [
    ("{strategy: rolling, max_unavailable: 0}", "3:47", "rollout.max_unavailable: must be at least 1 unit"),
    ("{strategy: rolling, max_unavailable: '0%'}", "3:47", "above 0%"),
    ("{strategy: rolling, max_unavailable: half}", "3:47", "'half': must be a unit count or a percentage"),
    ("{max_unavailable: 2}", "3:10", "rollout: max_unavailable is for strategy: rolling"),
])
def test_a_bad_max_unavailable_is_refused_at_load_with_its_position(tmp_path: Path, rollout: str, where: str,
                                                                    problem: str) -> None:
    path = tmp_path / "fix.yaml"
    path.write_text(f"name: x\nsteps: [upload]\nrollout: {rollout}\n")
    with pytest.raises(ConfigError) as caught:
        parse_playbook(path)
    assert str(caught.value).startswith(f"{path}:{where}: ") and problem in str(caught.value), str(caught.value)
