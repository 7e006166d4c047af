"""Quantiles: of a histogram's bucket counts, as PromQL's `histogram_quantile` estimates them, and of raw samples.

A histogram keeps only how many observations fell at or below each bucket's upper bound, so a quantile inside a
bucket is a guess: Prometheus assumes the observations are spread evenly between the bucket's bounds and
interpolates linearly. The estimate is only as precise as the bucket edges; two builds whose quantiles lie in the
same bucket differ only by how full that bucket is.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence


def histogram_quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float], count: float) -> float | None:
    """The q-quantile (0 <= q <= 1) of observations counted in buckets, by Prometheus's `histogram_quantile`
    (promql/quantile.go, classic buckets): find the first bucket whose cumulative count reaches rank = q * count,
    then interpolate linearly between that bucket's lower and upper bound. The lowest bucket starts at 0 (when its
    upper bound is above 0); a rank in the +Inf bucket answers the highest finite bound, as Prometheus does.

    bounds: the finite upper bounds, ascending; cumulative: the observations at or below each; count: every
    observation (the +Inf bucket). None when there is no observation: no quantile, not a zero."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    if len(bounds) != len(cumulative):
        raise ValueError(f"{len(bounds)} bounds but {len(cumulative)} bucket counts")
    if count <= 0:
        return None
    rank = q * count
    # The first bucket whose cumulative count reaches the rank; for q = 0 the first that holds an observation
    # (Prometheus divides 0 by 0 there and answers NaN when the lowest bucket is empty).
    index = bisect.bisect_left(cumulative, rank) if rank > 0 else bisect.bisect_right(cumulative, 0.0)
    if index == len(bounds):
        return bounds[-1] if bounds else None  # in the +Inf bucket: nothing above the highest bound is known
    upper = bounds[index]
    if index == 0:
        if upper <= 0:
            return upper
        lower, below = 0.0, 0.0
    else:
        lower, below = bounds[index - 1], cumulative[index - 1]
    in_bucket = cumulative[index] - below
    return lower + (upper - lower) * ((rank - below) / in_bucket)


def sample_quantile(q: float, samples: Sequence[float]) -> float | None:
    """The q-quantile of raw samples, interpolated linearly between the order statistics around (n - 1) * q
    (Hyndman & Fan's type 7, numpy's default). None when there is no sample."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    if not samples:
        return None
    ordered = sorted(samples)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
