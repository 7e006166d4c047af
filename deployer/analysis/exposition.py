"""One read of a server's /metrics (Prometheus text exposition), as the analysis needs it: its histograms with
their buckets put together, and every sample (counters, gauges, a histogram's `_count`) by its name.

The text is parsed by prometheus_client's parser, the one the metric steps (steps/metrics.py) read gauges with;
this module only puts a histogram's `_bucket{le=...}`, `_count` and `_sum` series back together, which reading
one value at a time cannot do.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict


class ExpositionError(ValueError):
    """Text that is not Prometheus exposition, or a histogram whose buckets contradict each other."""


class Histogram(BaseModel):
    """One histogram series, cumulative as exported: `cumulative[i]` observations were <= `bounds[i]`.
    The +Inf bucket is `count` (it always equals `_count`), so every number here is finite and JSON keeps it."""
    model_config = ConfigDict(frozen=True)

    labels: dict[str, str]
    bounds: tuple[float, ...]  # the finite upper bounds (`le`), ascending
    cumulative: tuple[float, ...]
    count: float
    sum: float
    created: float | None = None  # `_created`: when the process made the series (prometheus_client exports it)

    def same_buckets(self, other: Histogram) -> bool:
        return self.bounds == other.bounds


class Sample(BaseModel):
    model_config = ConfigDict(frozen=True)

    labels: dict[str, str]
    value: float


def matches(labels: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in wanted.items())


class Scrape(BaseModel):
    """Every series of one read of /metrics, and when it was read (seconds, the reader's clock)."""
    model_config = ConfigDict(frozen=True)

    at: float
    histograms: dict[str, tuple[Histogram, ...]]  # by family name: `sglang:time_to_first_token_seconds`
    samples: dict[str, tuple[Sample, ...]]  # by sample name: `sglang:num_transfer_failed_reqs_total`

    def histogram(self, name: str, labels: Mapping[str, str]) -> Histogram | None:
        """The series of histogram `name` whose labels include `labels`, added up bucket by bucket (PromQL's
        `sum by (le)`: a server exports one series per TP rank, say); None when none is exported."""
        series = [h for h in self.histograms.get(name, ()) if matches(h.labels, labels)]
        if not series:
            return None
        first = series[0]
        if any(not h.same_buckets(first) for h in series):
            raise ExpositionError(f"{name}{dict(labels)}: its series have different buckets and cannot be added")
        created = [h.created for h in series if h.created is not None]
        return Histogram(labels=dict(labels), bounds=first.bounds,
                         cumulative=tuple(map(sum, zip(*(h.cumulative for h in series), strict=True))),
                         count=sum(h.count for h in series), sum=sum(h.sum for h in series),
                         created=max(created) if len(created) == len(series) else None)

    def value(self, name: str, labels: Mapping[str, str]) -> float | None:
        """The sum of sample `name` over the series whose labels include `labels`; None when none is exported."""
        values = [s.value for s in self.samples.get(name, ()) if matches(s.labels, labels)]
        return sum(values) if values else None


def parse_scrape(text: str, at: float) -> Scrape:
    """Parse one /metrics answer read at `at`. Raises ExpositionError on text the parser refuses or a histogram
    without a +Inf bucket or with buckets that shrink."""
    # here: prometheus_client brings http.server and urllib with it, which a run without analysis never needs
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise ExpositionError(f"unparseable metrics: {exc}") from exc
    samples: dict[str, list[Sample]] = {}
    for family in families:
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(Sample(labels=dict(sample.labels), value=sample.value))
    # `_created` comes as a family of its own, after the histogram's
    histograms = {family.name: _histograms(family.name, family.samples, samples.get(f"{family.name}_created", []))
                  for family in families if family.type == "histogram"}
    return Scrape(at=at, histograms=histograms, samples={name: tuple(found) for name, found in samples.items()})


def _key(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "le"))


def _bound(name: str, le: str | None) -> float:
    try:
        return float(le or "")
    except ValueError:
        raise ExpositionError(f"{name}_bucket: le={le!r} is not a bound") from None


def _histograms(name: str, samples: Sequence[Any], created_samples: Sequence[Sample]) -> tuple[Histogram, ...]:
    """A family's samples put back together per series (its labels but `le`)."""
    buckets: dict[tuple[tuple[str, str], ...], dict[float, float]] = {}
    sums: dict[tuple[tuple[str, str], ...], float] = {}
    created = {_key(s.labels): s.value for s in created_samples}
    for sample in samples:
        key = _key(sample.labels)
        if sample.name == f"{name}_bucket":
            buckets.setdefault(key, {})[_bound(name, sample.labels.get("le"))] = sample.value
        elif sample.name == f"{name}_sum":
            sums[key] = sample.value
    series = []
    for key, by_bound in buckets.items():
        shown = f"{name}{dict(key)}"
        if math.inf not in by_bound:
            raise ExpositionError(f"{shown}: no +Inf bucket")
        bounds = sorted(b for b in by_bound if b != math.inf)
        cumulative = [by_bound[b] for b in bounds]
        upward = [*cumulative, by_bound[math.inf]]
        if any(later < earlier for earlier, later in itertools.pairwise(upward)):
            raise ExpositionError(f"{shown}: a bucket counts fewer observations than the one below it")
        series.append(Histogram(labels=dict(key), bounds=tuple(bounds), cumulative=tuple(cumulative),
                                count=by_bound[math.inf], sum=sums.get(key, 0.0), created=created.get(key)))
    return tuple(series)
