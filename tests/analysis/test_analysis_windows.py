"""A read of /metrics as the analysis sees it, and the windows between reads: deltas, never cumulative counts,
and a restart (a count that went down, or a new `_created`) starting its window from zero, flagged."""

from __future__ import annotations

import pytest
from analysis_reads import TRANSFER_FAILED, TTFT, Server, histogram_text
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from deployer.analysis import ExpositionError, parse_scrape
from deployer.analysis.window import Absent, counter_windows, histogram_windows


def test_a_prometheus_client_histogram_parses_into_its_cumulative_buckets_and_series_add_up_by_bound() -> None:
    registry = CollectorRegistry()
    ttft = Histogram(TTFT, "TTFT", labelnames=["tp_rank"], buckets=[0.1, 0.2, 0.4], registry=registry)
    failed = Counter("sglang:num_transfer_failed_reqs", "failed", registry=registry)
    for value in (0.05, 0.15, 0.3, 0.5):
        ttft.labels(tp_rank="0").observe(value)
    ttft.labels(tp_rank="1").observe(0.15)
    failed.inc(2)
    scrape = parse_scrape(generate_latest(registry).decode(), at=10.0)

    rank0 = scrape.histogram(TTFT, {"tp_rank": "0"})
    assert rank0 is not None
    assert (rank0.bounds, rank0.cumulative, rank0.count, rank0.sum) == ((0.1, 0.2, 0.4), (1, 2, 3), 4, 1.0)
    assert rank0.created is not None  # prometheus_client exports `_created`: a restart shows by it
    both = scrape.histogram(TTFT, {})
    assert both is not None and (both.cumulative, both.count) == ((1, 3, 4), 5)
    assert scrape.value(TRANSFER_FAILED, {}) == 2
    assert scrape.histogram("sglang:inter_token_latency_seconds", {}) is None


def test_a_histogram_without_its_inf_bucket_or_with_a_shrinking_bucket_is_refused() -> None:
    no_inf = f'# TYPE {TTFT} histogram\n{TTFT}_bucket{{le="0.1"}} 1\n{TTFT}_count 1\n{TTFT}_sum 0.05\n'
    with pytest.raises(ExpositionError, match=r"no \+Inf bucket"):
        parse_scrape(no_inf, 0.0)
    shrinking = histogram_text(TTFT, (0.1, 0.2), [3, -1, 0], 0.2)
    with pytest.raises(ExpositionError, match="fewer observations than the one below"):
        parse_scrape(shrinking, 0.0)
    with pytest.raises(ExpositionError, match="unparseable"):
        parse_scrape("sglang:x{le= 1\n", 0.0)


def test_windows_hold_what_happened_between_reads_not_since_the_process_started() -> None:
    server = Server()
    server.observe([0.05] * 1000)  # traffic long before the analysis
    first = server.read(0.0)
    server.observe([0.3, 0.5, 0.7])
    second = server.read(60.0)
    server.observe([1.5])
    third = server.read(120.0)

    one, two = histogram_windows([first, second, third], TTFT, {})
    assert (one.start, one.end, one.count, one.reset) == (0.0, 60.0, 3, False)
    assert one.cumulative[:5] == (0, 0, 1, 2, 3)  # 0.1 0.2 0.4 0.6 0.8: the 1000 earlier ones are not in it
    assert one.sum == pytest.approx(1.5)
    assert (two.count, two.cumulative[5:7]) == (1, (0, 1))  # 1.5 s: in (1, 2]


def test_a_bucket_that_went_down_means_a_restart_so_the_window_counts_from_zero_and_is_flagged() -> None:
    old = Server(started=100.0)
    old.observe([0.3] * 50)
    before = old.read(0.0)
    new = Server(started=100.0)  # the same `_created`: only the counts show the restart
    new.observe([0.3] * 4)
    (window,) = histogram_windows([before, new.read(60.0)], TTFT, {})
    assert window.reset and window.count == 4 and window.cumulative[2] == 4


def test_a_restart_that_already_counted_past_the_old_values_shows_by_its_created_time() -> None:
    old = Server(started=100.0)
    old.observe([0.3] * 5)
    before = old.read(0.0)
    new = Server(started=130.0)
    new.observe([0.3] * 9)  # more than before: the counts alone would read +4
    (window,) = histogram_windows([before, new.read(60.0)], TTFT, {})
    assert window.reset and window.count == 9


def test_a_counter_that_went_down_restarted_its_window_from_zero() -> None:
    reads = []
    for at, value in ((0.0, 10), (60.0, 15), (120.0, 3), (180.0, 7)):
        server = Server()
        server.failed = value
        reads.append(server.read(at))
    windows = counter_windows(reads, TRANSFER_FAILED, {})
    assert [(w.increase, w.reset) for w in windows] == [(5, False), (3, True), (4, False)]


def test_a_read_without_the_metric_cannot_make_a_window() -> None:
    server = Server()
    empty = parse_scrape("", 60.0)
    with pytest.raises(Absent, match=f"{TTFT} absent from the read at 60"):
        histogram_windows([server.read(0.0), empty], TTFT, {})

