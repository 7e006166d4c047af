"""The Mann-Whitney U test (Wilcoxon rank-sum) of a canary's observations against a baseline's.

It asks whether one side's observations tend to be larger than the other's, using only their order, so it needs
no assumption about the latency distribution (long-tailed, multi-modal) and one slow outlier moves it by one
rank, not by its size. Kayenta judges a canary with it.

Observations come as counts per value (`{value: how many}`): raw samples counted one by one, or a histogram's
bucket deltas, where every observation of a bucket is one value (the test only uses order, so which value stands
for a bucket does not matter, only that the buckets keep their order). Equal values are ties: they share the mean
of the ranks they span, and the variance is corrected for them — with buckets nearly every observation is a tie.
Computing it per value, not per observation, is exact and costs one pass over the distinct values.

The p-value comes from the normal approximation with a continuity correction (scipy's `mannwhitneyu` with
`method="asymptotic"`, `use_continuity=True`); it is sound from about 20 observations a side.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

# Below this many observations on a side the normal approximation of U's distribution is too rough to trust.
MIN_PER_SIDE = 20


class MannWhitney(BaseModel):
    """The test's figures, as the run log records them."""
    model_config = ConfigDict(frozen=True)

    n_baseline: float
    n_canary: float
    u: float  # pairs (canary, baseline) where the canary's observation is larger, a tie counting half
    z: float  # (U - its mean) / its standard deviation, continuity-corrected; > 0: the canary tends to be larger
    p: float  # two-sided: how likely so large a |z| is when both sides come from one distribution
    rank_biserial: float  # 2U / (n_canary * n_baseline) - 1, in [-1, 1]: the effect size; 0 is no difference


def mann_whitney(baseline: Mapping[float, float], canary: Mapping[float, float]) -> MannWhitney | None:
    """The test of canary against baseline, each given as {value: count}. None when it cannot say anything: a side
    with no observation, or every observation of both sides tied (zero variance: nothing to rank)."""
    n_base, n_canary = sum(baseline.values()), sum(canary.values())
    if n_base <= 0 or n_canary <= 0:
        return None
    seen = 0.0
    canary_ranks = 0.0
    ties = 0.0  # the sum of t^3 - t over each group of t equal observations
    for value in sorted({*baseline, *canary}):
        here_canary = canary.get(value, 0.0)
        tied = here_canary + baseline.get(value, 0.0)
        canary_ranks += here_canary * (seen + (tied + 1) / 2)  # every tied observation takes their mean rank
        ties += tied**3 - tied
        seen += tied
    u = canary_ranks - n_canary * (n_canary + 1) / 2
    mean = n_canary * n_base / 2
    total = n_canary + n_base
    variance = n_canary * n_base / 12 * ((total + 1) - ties / (total * (total - 1)))
    if variance <= 0:
        return None
    distance = max(abs(u - mean) - 0.5, 0.0)  # continuity: U moves in steps of 1/2, the normal curve does not
    z = math.copysign(distance / math.sqrt(variance), u - mean)
    return MannWhitney(n_baseline=n_base, n_canary=n_canary, u=u, z=z, p=math.erfc(abs(z) / math.sqrt(2)),
                       rank_biserial=2 * u / (n_canary * n_base) - 1)
