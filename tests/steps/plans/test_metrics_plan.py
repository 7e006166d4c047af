"""The plans of the metric steps: baseline (a storm first when asked, then a scrape until it settles) and drain
(a scrape until the bound holds), each a repeated GET of the metrics URL with its budget."""

from __future__ import annotations

import pytest
from planning import context, does, host, step

from deployer.errors import StepFailed
from deployer.steps.action import Action

METRICS = "http://127.0.0.1:9000/metrics"
SERVING = host(metrics=METRICS, endpoint="http://127.0.0.1:8000/")
GENERATE = ('{"sampling_params": {"max_new_tokens": 8}, "stream": true, '
            '"text": "Explain prefill/decode disaggregation in one sentence."}')


def scrape(what: str, url: str = METRICS) -> Action:
    return Action.http("scrape", what, url, repeats=True)


def test_baseline_reads_the_hosts_metrics_until_three_polls_agree_within_20s() -> None:
    plan = step("baseline", {"metric": "queue_depth"}).plan(context(SERVING))
    assert does(plan) == does([scrape("read sum(queue_depth{}) every 1s until 3 polls agree (at most 20s)")])


def test_baseline_with_a_storm_sends_it_first_then_reads_by_its_labels_aggregate_and_budget() -> None:
    plan = step("baseline", {"metric": "kv_pending", "labels": {"role": "decode"}, "aggregate": "max",
                             "interval_s": 0.5, "stable_polls": 5, "within_s": 30,
                             "storm": {"requests": 50, "abort_all_every": 10}}).plan(context(SERVING))
    assert does(plan) == does([
        Action.http("storm", "50 streaming requests, 32 at a time, clients give up after 0.2s; none sent after 60s",
                    "http://127.0.0.1:8000/generate", method="POST", body=GENERATE, repeats=True),
        Action.http("abort_all", "abort_all after every 10th request", "http://127.0.0.1:8000/abort_request",
                    method="POST", repeats=True),
        scrape('read max(kv_pending{role="decode"}) every 0.5s until 5 polls agree (at most 30s)')])


def test_baseline_storm_true_is_the_storms_defaults() -> None:
    storm, _ = step("baseline", {"metric": "m", "storm": True}).plan(context(SERVING))
    assert does([storm]) == does(step("storm").plan(context(SERVING)))


def test_drain_reads_until_the_bound_holds_for_its_polls_within_60s() -> None:
    plan = step("drain", {"metric": "kv_pending", "to": 0}).plan(context(SERVING))
    assert does(plan) == does([scrape("read sum(kv_pending{}) every 1s until <= 0 for 3 polls (at most 60s)")])


def test_drain_reads_the_steps_own_url_with_its_op_bound_and_budget() -> None:
    plan = step("drain", {"metric": "tokens_per_s", "to": 2.5, "op": ">=", "within_s": 120, "stable_polls": 4,
                          "url": "http://10.0.0.2:9100/metrics"}).plan(context(SERVING))
    assert does(plan) == does([scrape("read sum(tokens_per_s{}) every 1s until >= 2.5 for 4 polls (at most 120s)",
                                      "http://10.0.0.2:9100/metrics")])


def test_drain_after_a_revert_holds_the_old_build_to_no_worse_than_its_baseline() -> None:
    reverted = step("drain", {"metric": "kv_pending", "to": 0}).after_revert({"kv_pending": 7})
    assert not isinstance(reverted, str)
    assert does(reverted.plan(context(SERVING))) == does([scrape(
        "read sum(kv_pending{}) every 1s until <= 7 (no worse than 7, its baseline before the fix) for 3 polls "
        "(at most 60s)")])


def test_drain_after_a_revert_of_an_equality_bound_allows_the_baselines_distance() -> None:
    reverted = step("drain", {"metric": "m", "to": 1, "op": "=="}).after_revert({"m": 4})
    assert not isinstance(reverted, str)
    [read] = reverted.plan(context(SERVING))
    assert read.what == ("read sum(m{}) every 1s until within 3 of 1 (no worse than 4, its baseline before the fix) "
                         "for 3 polls (at most 60s)")


def test_drain_without_a_baseline_is_not_run_again_after_a_revert() -> None:
    assert isinstance(step("drain", {"metric": "m", "to": 0}).after_revert({}), str)


@pytest.mark.parametrize("kind", ["baseline", "drain"])
def test_baseline_and_drain_cannot_plan_without_a_metrics_url(kind: str) -> None:
    with pytest.raises(StepFailed, match="no metrics URL: set `metrics` on host gpu-1 or `url` on the step"):
        step(kind, {"metric": "m", "to": 0} if kind == "drain" else {"metric": "m"}).plan(context(host()))
