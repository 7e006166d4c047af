"""A check's verdict and why: pass, fail, or inconclusive (hold, never a pass), which method judged it, and a
report a run log can keep as JSON with every window's values."""

from __future__ import annotations

import json
import random
import re

import pytest
from analysis_reads import TRANSFER_FAILED, TTFT, Lognormal, Server

from deployer.analysis import (
    CriticalCounter,
    LatencyCheck,
    Report,
    Scrape,
    before_after,
    canary_vs_baseline,
    judge,
    judge_samples,
    sglang_checks,
)

P99_TTFT = LatencyCheck(name="p99 TTFT", metric=TTFT)
TRANSFERS = CriticalCounter(name="KV transfer failures", metric=TRANSFER_FAILED)
TYPICAL = Lognormal(median=0.25, sigma=0.5)


def reads(latency: Lognormal, per_window: int, windows: int = 3, seed: int = 1,
          server: Server | None = None) -> list[Scrape]:
    """A server's reads 60 s apart with per_window requests between each two."""
    rng, server = random.Random(seed), server or Server()
    taken = [server.read(0.0)]
    for i in range(1, windows + 1):
        server.add_counts(*latency.bucket_counts(rng, per_window))
        taken.append(server.read(60.0 * i))
    return taken


def test_too_few_observations_is_inconclusive_even_when_the_canary_looks_faster() -> None:
    verdict = judge(P99_TTFT, reads(TYPICAL, 300), reads(Lognormal(0.1, 0.5), 10))
    assert verdict.outcome == "inconclusive" and verdict.method == "none"
    assert "too few observations: baseline 900, canary 30, 50 needed a side" in verdict.why


def test_a_canary_slower_everywhere_fails_by_the_rank_test_with_its_effect_size() -> None:
    verdict = judge(P99_TTFT, reads(TYPICAL, 500, seed=1), reads(Lognormal(0.25, 0.5, slower_by=1.3), 500, seed=2))
    assert verdict.outcome == "fail" and verdict.method == "mann-whitney"
    assert verdict.test is not None and verdict.test.p < 0.02 and verdict.test.rank_biserial > 0.1
    assert verdict.change is not None and verdict.change > 0.10
    assert "worse than allowed, and the canary is significantly worse (Mann-Whitney U p=" in verdict.why
    assert verdict.samples is not None and verdict.samples.startswith("bucket deltas")
    assert [w.count for w in verdict.canary_windows] == [500, 500, 500]


def test_a_significant_worsening_under_min_effect_is_a_drift_that_passes_and_a_large_one_still_fails() -> None:
    baseline = reads(TYPICAL, 500, seed=1)
    drifted = reads(Lognormal(0.25, 0.5, slower_by=1.3), 500, seed=2)  # fails without min_effect (the test above)
    check = P99_TTFT.model_copy(update={"min_effect": 0.5})
    verdict = judge(check, baseline, drifted)
    assert verdict.outcome == "pass" and verdict.test is not None and verdict.test.p < 0.02
    assert 0.1 < verdict.test.rank_biserial < 0.5
    assert "significantly worse, but by an effect under the least the check fails" in verdict.why
    assert "min_effect 0.5): a drift, not a regression" in verdict.why
    regressed = judge(check, baseline, reads(Lognormal(0.25, 0.5, slower_by=6), 500, seed=2))
    assert regressed.outcome == "fail" and regressed.test is not None and regressed.test.rank_biserial >= 0.5


def test_a_small_significant_shift_within_the_allowed_change_passes() -> None:
    check = P99_TTFT.model_copy(update={"allowed_change": 0.5})
    verdict = judge(check, reads(TYPICAL, 3000), reads(Lognormal(0.25, 0.5, slower_by=1.2), 3000, seed=2))
    assert verdict.outcome == "pass" and verdict.test is not None and verdict.test.p < 0.02
    assert "within the allowed change" in verdict.why


def test_a_p99_worse_than_allowed_that_the_test_cannot_tell_from_noise_passes_and_says_so() -> None:
    # One build on both sides, 300 requests each: 3 of them make the p99, and seed 5 draws it 27% higher.
    verdict = judge(P99_TTFT, reads(TYPICAL, 100, seed=5), reads(TYPICAL, 100, seed=105))
    assert verdict.change is not None and verdict.change > 0.25
    assert verdict.outcome == "pass" and verdict.test is not None and verdict.test.p >= 0.02
    assert "worse than allowed, but the test finds no significant worsening" in verdict.why


def test_with_too_few_to_rank_the_quantile_comparison_decides_and_says_why() -> None:
    check = P99_TTFT.model_copy(update={"min_samples": 5})
    verdict = judge(check, reads(TYPICAL, 3), reads(Lognormal(0.25, 0.5, slower_by=3), 3, seed=2))
    assert verdict.method == "quantile" and verdict.test is None
    assert verdict.outcome == "fail" and "quantile comparison: fewer than 20 observations a side" in verdict.why


def test_every_observation_in_one_bucket_cannot_be_ranked_so_the_quantiles_decide() -> None:
    one_bucket = Lognormal(median=0.5, sigma=0.01)  # all in (0.4, 0.6]
    verdict = judge(P99_TTFT, reads(one_bucket, 100), reads(one_bucket, 100, seed=2))
    assert (verdict.outcome, verdict.method) == ("pass", "quantile")
    assert "every observation of both sides ties (one bucket)" in verdict.why


def test_higher_is_better_fails_a_canary_that_got_lower() -> None:
    check = LatencyCheck(name="median tokens/s", metric=TTFT, quantile=0.5, better="higher")
    verdict = judge(check, reads(TYPICAL, 500), reads(Lognormal(0.25, 0.5, slower_by=0.6), 500, seed=2))
    assert verdict.outcome == "fail" and verdict.test is not None and verdict.test.z < 0


def test_min_effect_counts_toward_worse_when_higher_is_better() -> None:
    from deployer.steps.analysis import shown

    check = LatencyCheck(name="median tokens/s", metric=TTFT, quantile=0.5, better="higher", min_effect=0.3)
    verdict = judge(check, reads(TYPICAL, 500), reads(Lognormal(0.25, 0.5, slower_by=0.6), 500, seed=2))
    assert verdict.outcome == "fail" and verdict.test is not None and verdict.test.rank_biserial < -0.3
    line = shown(check, verdict)
    assert re.search(r"effect \+0\.\d\d toward worse, 0\.3 needed to fail", line), line


def test_raw_samples_are_ranked_one_by_one() -> None:
    rng = random.Random(3)
    baseline = [rng.lognormvariate(-1.4, 0.5) for _ in range(400)]
    canary = [rng.lognormvariate(-1.4, 0.5) * 1.3 for _ in range(400)]
    verdict = judge_samples(P99_TTFT, baseline, canary)
    assert verdict.outcome == "fail" and verdict.samples is not None and verdict.samples.startswith("raw samples")
    assert judge_samples(P99_TTFT, baseline, baseline[::-1]).outcome == "pass"


def test_any_transfer_failure_in_the_canary_fails_whatever_the_baseline_did() -> None:
    baseline, canary = reads(TYPICAL, 100), reads(TYPICAL, 100, seed=2)
    bumped = Server()
    bumped.failed = 1
    canary[-1] = bumped.read(canary[-1].at)
    report = canary_vs_baseline([P99_TTFT, TRANSFERS], canary, baseline)
    transfers = report.verdicts[1]
    assert (transfers.outcome, transfers.method, transfers.canary) == ("fail", "counter", 1)
    assert "rose by 1 in the canary" in transfers.why
    assert (report.outcome, report.why) == ("fail", "failed: KV transfer failures")


def test_a_counter_absent_is_inconclusive_when_required_and_a_pass_when_not() -> None:
    without = [Scrape(at=s.at, histograms=s.histograms, samples={}) for s in reads(TYPICAL, 100)]
    assert judge(TRANSFERS, without, without).outcome == "inconclusive"
    optional = judge(TRANSFERS.model_copy(update={"required": False}), without, without)
    assert optional.outcome == "pass" and "not required" in optional.why


def test_a_canary_that_restarted_within_its_windows_is_held() -> None:
    canary = reads(TYPICAL, 300, seed=2)
    again = Server(started=1_800_000_000.0)
    canary.append(reads(TYPICAL, 300, windows=1, seed=3, server=again)[-1].model_copy(update={"at": 240.0}))
    verdict = judge(P99_TTFT, reads(TYPICAL, 300, windows=4), canary)
    assert verdict.outcome == "inconclusive" and [w.reset for w in verdict.canary_windows][-1]
    assert "the canary restarted within window 4" in verdict.why


def test_before_after_judges_each_side_between_its_own_reads() -> None:
    old = reads(TYPICAL, 400, seed=1)
    new = reads(Lognormal(0.25, 0.5, slower_by=1.3), 400, seed=2, server=Server(started=1_800_000_000.0))
    report = before_after(sglang_checks(), old, new)
    by_name = {v.check: v for v in report.verdicts}
    assert report.mode == "before-after" and by_name["p99 TTFT"].outcome == "fail"
    assert not any(w.reset for v in report.verdicts for w in v.canary_windows)  # no window spans the restart
    assert by_name["p99 inter-token latency"].outcome == "inconclusive"  # not exported here: held
    assert report.outcome == "fail"


def test_canary_and_baseline_must_share_their_windows() -> None:
    with pytest.raises(ValueError, match="the windows must be the same"):
        canary_vs_baseline([P99_TTFT], reads(TYPICAL, 10, windows=2), reads(TYPICAL, 10, windows=3))


def test_the_report_is_json_with_every_window_the_verdict_and_why() -> None:
    report = canary_vs_baseline([P99_TTFT, TRANSFERS], reads(TYPICAL, 200, seed=2), reads(TYPICAL, 200))
    document = json.loads(report.model_dump_json())
    assert document["outcome"] == "pass"
    ttft = document["verdicts"][0]
    assert [w["count"] for w in ttft["baseline_windows"]] == [200, 200, 200]
    assert all(isinstance(w["value"], float) for w in ttft["canary_windows"])
    assert ttft["method"] == "mann-whitney" and ttft["test"]["p"] >= 0.02 and ttft["why"]
    assert Report.model_validate(document) == report
