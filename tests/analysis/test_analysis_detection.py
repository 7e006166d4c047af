"""Issue 37's target for the analysis, on generated histograms: a 20% p99-TTFT regression injected in one build
is caught (fail) in >= 95 of 100 seeded runs, and an unchanged build passes in >= 95 of 100.

Each run is what a canary analysis sees: two servers read every 60 s over five windows of 600 requests, in
SGLang's TTFT buckets. The baseline has served 20,000 earlier, faster requests and the canary a warm-up of slow
ones before the first read: only the windows' deltas are judged, and cumulative counts would judge those
instead. The regression makes every request of the canary 20% slower, so its p99 too. The reads are made as
parse_scrape makes them, without the text (its parser is tested with text elsewhere, and costs 2 ms a read).
"""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest
from analysis_reads import TTFT, TTFT_BOUNDS, Lognormal

from deployer.analysis import LatencyCheck, Scrape, canary_vs_baseline
from deployer.analysis.exposition import Histogram

P99_TTFT = LatencyCheck(name="p99 TTFT", metric=TTFT)  # at most +10%, 50 samples, confidence 0.98
RUNS, WINDOWS, PER_WINDOW = 100, 5, 600
EARLIER = Lognormal(median=0.12, sigma=0.4)  # the baseline's traffic before the analysis: lighter load
WARM_UP = Lognormal(median=5.0, sigma=0.5)  # the canary's first requests: compile and CUDA-graph capture
# p99 0.79 s -> 0.95 s (across SGLang's 0.8 and 1 s bounds); 0.96 s -> 1.15 s (into the wide (1, 2] bucket)
TRAFFIC = {"median 0.25 s": (0.25, 0.5), "median 0.30 s": (0.30, 0.5)}


def server_reads(rng: random.Random, latency: Lognormal, before: Lognormal, served_before: int) -> list[Scrape]:
    per_bucket, total = before.expected_counts(served_before)
    reads = [read(per_bucket, total, 0.0)]
    for window in range(1, WINDOWS + 1):
        more, took = latency.bucket_counts(rng, PER_WINDOW)
        per_bucket, total = [a + b for a, b in zip(per_bucket, more, strict=True)], total + took
        reads.append(read(per_bucket, total, 60.0 * window))
    return reads


def read(per_bucket: list[int], total: float, at: float) -> Scrape:
    cumulative = list(itertools.accumulate(per_bucket))
    histogram = Histogram(labels={"model_name": "demo-model"}, bounds=TTFT_BOUNDS, cumulative=tuple(cumulative[:-1]),
                          count=cumulative[-1], sum=total, created=1_700_000_000.0)
    return Scrape(at=at, histograms={TTFT: (histogram,)}, samples={})


def outcomes(median: float, sigma: float, slower_by: float) -> Counter[str]:
    baseline, canary = Lognormal(median, sigma), Lognormal(median, sigma, slower_by)
    counted: Counter[str] = Counter()
    for seed in range(RUNS):
        rng = random.Random(seed)
        report = canary_vs_baseline([P99_TTFT], server_reads(rng, canary, WARM_UP, 30),
                                    server_reads(rng, baseline, EARLIER, 20_000))
        counted[report.outcome] += 1
    return counted


@pytest.mark.parametrize(("median", "sigma"), TRAFFIC.values(), ids=TRAFFIC.keys())
def test_a_20_percent_p99_ttft_regression_fails_in_at_least_95_of_100_seeded_runs(median: float,
                                                                                  sigma: float) -> None:
    counted = outcomes(median, sigma, slower_by=1.2)
    assert counted["fail"] >= 95, counted


@pytest.mark.parametrize(("median", "sigma"), TRAFFIC.values(), ids=TRAFFIC.keys())
def test_an_unchanged_build_passes_in_at_least_95_of_100_seeded_runs(median: float, sigma: float) -> None:
    counted = outcomes(median, sigma, slower_by=1.0)
    assert counted["pass"] >= 95, counted


@pytest.mark.xfail(strict=True, reason=(
    "histogram_quantile interpolates linearly inside a bucket: a p99 of 1.49 s -> 1.79 s, inside SGLang's (1, 2] "
    "bucket, reads as about +6%, within the allowed +10%; narrower buckets (SGLang's --bucket-time-to-first-token) "
    "or a check on a quantile that falls in narrow buckets see it"))
def test_a_20_percent_regression_inside_one_wide_bucket_is_caught() -> None:
    counted = outcomes(median=0.37, sigma=0.6, slower_by=1.2)
    assert counted["fail"] >= 95, counted
