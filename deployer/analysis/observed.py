"""One side's observations of a latency metric, pooled over its windows, in the two forms a source gives them:
a histogram's bucket deltas (what /metrics exports), or raw samples (what a load generator that timed each
request itself can give).

Pooling adds the windows' deltas up (the deltas of consecutive windows add up to the delta over all of them, so
no observation counts twice) and judges once, on every observation: one test, not one per window.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from deployer.analysis.quantile import histogram_quantile, sample_quantile
from deployer.analysis.window import HistogramWindow

BUCKETED = ("bucket deltas: each observation stands at its bucket, so a bucket's observations all tie (the test "
            "uses only their order: a bucket's midpoint or bound gives the same U); quantiles by PromQL's "
            "histogram_quantile, linear inside a bucket")
RAW = "raw samples: each observation is its own value; quantiles interpolated between order statistics (type 7)"


@dataclass(frozen=True)
class Observed:
    count: float
    groups: Mapping[float, float]  # value -> how many observations: what the rank test reads
    mean: float | None
    how: str  # how the test's samples were formed, said in the verdict
    bounds: tuple[float, ...] | None  # the buckets, when bucketed: two sides are comparable only on the same ones
    _quantile: Callable[[float], float | None]

    def quantile(self, q: float) -> float | None:
        return self._quantile(q)


class BucketsDiffer(ValueError):
    """Windows whose buckets differ: a restart with other bucket bounds, or two builds configured apart."""


def from_windows(windows: Sequence[HistogramWindow]) -> Observed:
    """The windows' bucket deltas added up. Raises BucketsDiffer when their buckets differ."""
    if not windows:
        raise ValueError("no window to pool")
    bounds = windows[0].bounds
    if any(w.bounds != bounds for w in windows):
        raise BucketsDiffer("the buckets changed between windows (a restart with other bounds?)")
    cumulative = tuple(map(sum, zip(*(w.cumulative for w in windows), strict=True)))
    count = sum(w.count for w in windows)
    total = sum(w.sum for w in windows)
    per_bucket = [c - below for c, below in zip((*cumulative, count), (0.0, *cumulative), strict=True)]
    groups = {bound: n for bound, n in zip((*bounds, math.inf), per_bucket, strict=True) if n > 0}
    return Observed(count=count, groups=groups, mean=total / count if count > 0 else None, how=BUCKETED,
                    bounds=bounds, _quantile=lambda q: histogram_quantile(q, bounds, cumulative, count))


def from_samples(samples: Sequence[float]) -> Observed:
    return Observed(count=float(len(samples)), groups={v: float(n) for v, n in Counter(samples).items()},
                    mean=sum(samples) / len(samples) if samples else None, how=RAW, bounds=None,
                    _quantile=lambda q: sample_quantile(q, samples))
