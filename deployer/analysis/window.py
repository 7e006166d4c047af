"""What happened between two reads of /metrics: a window's deltas.

Prometheus counters and histogram buckets count from the process's start, so one read says how the server did
since it started — mostly under the old build, or before the traffic of interest. Only the difference between two
reads belongs to the window between them.

A process that restarts starts counting from zero again. A bucket (or a counter) that went *down*, or a
`_created` time that changed, can only mean that: the window then counts from zero, i.e. it is the later read
alone, what the new process saw since it started, and it is flagged `reset` (what the old process counted after
the earlier read is lost). A restart whose new process already counted past the old values, with no `_created`
to show it, cannot be seen — Prometheus's `rate()` has the same blind spot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from pydantic import BaseModel, ConfigDict

from deployer.analysis.exposition import Histogram, Scrape

T = TypeVar("T")


class Absent(ValueError):
    """A read without the metric asked for: its window cannot be formed."""


class HistogramWindow(BaseModel):
    """A histogram's observations within one window: `cumulative[i]` of them were <= `bounds[i]`."""
    model_config = ConfigDict(frozen=True)

    start: float
    end: float
    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    count: float
    sum: float
    reset: bool = False  # the process restarted within the window: counted from zero, from the later read


class CounterWindow(BaseModel):
    """How much a counter grew within one window."""
    model_config = ConfigDict(frozen=True)

    start: float
    end: float
    increase: float
    reset: bool = False


def histogram_delta(before: Histogram, after: Histogram, start: float, end: float) -> HistogramWindow:
    """The observations between two reads of one histogram: after - before, bucket by bucket; after alone (flagged
    reset) when a bucket went down, the buckets changed or `_created` moved: the process restarted."""
    restarted = (not after.same_buckets(before)
                 or (before.created is not None and after.created is not None and after.created != before.created)
                 or after.count < before.count
                 or any(a < b for a, b in zip(after.cumulative, before.cumulative, strict=True)))
    if restarted:
        return HistogramWindow(start=start, end=end, bounds=after.bounds, cumulative=after.cumulative,
                               count=after.count, sum=after.sum, reset=True)
    return HistogramWindow(start=start, end=end, bounds=after.bounds,
                           cumulative=tuple(a - b for a, b in zip(after.cumulative, before.cumulative, strict=True)),
                           count=after.count - before.count, sum=after.sum - before.sum)


def counter_delta(before: float, after: float, start: float, end: float) -> CounterWindow:
    """A counter's growth between two reads; the later value alone (flagged reset) when it went down."""
    if after < before:
        return CounterWindow(start=start, end=end, increase=after, reset=True)
    return CounterWindow(start=start, end=end, increase=after - before)


def histogram_windows(scrapes: Sequence[Scrape], name: str, labels: Mapping[str, str]) -> list[HistogramWindow]:
    """The windows between consecutive reads. Raises Absent when a read lacks the histogram."""
    series = [_present(scrape.histogram(name, labels), name, scrape) for scrape in scrapes]
    return [histogram_delta(series[i - 1], series[i], scrapes[i - 1].at, scrapes[i].at)
            for i in range(1, len(scrapes))]


def counter_windows(scrapes: Sequence[Scrape], name: str, labels: Mapping[str, str]) -> list[CounterWindow]:
    """The windows between consecutive reads of a counter (its sample name: `..._total`). A restart shows by the
    value going down or by the counter's `_created` (the same labels) changing. Raises Absent when a read lacks it."""
    created_name = name.removesuffix("_total") + "_created"
    values = [_present(scrape.value(name, labels), name, scrape) for scrape in scrapes]
    created = [scrape.value(created_name, labels) for scrape in scrapes]
    windows = []
    for i in range(1, len(scrapes)):
        window = counter_delta(values[i - 1], values[i], scrapes[i - 1].at, scrapes[i].at)
        moved = created[i - 1] is not None and created[i] is not None and created[i] != created[i - 1]
        windows.append(window if window.reset or not moved else
                       CounterWindow(start=window.start, end=window.end, increase=values[i], reset=True))
    return windows


def _present(value: T | None, name: str, scrape: Scrape) -> T:
    if value is None:
        raise Absent(f"{name} absent from the read at {scrape.at:g}")
    return value
