"""The analysis's arithmetic on cases small enough to work out by hand: histogram_quantile's interpolation and
the Mann-Whitney U test with ties."""

from __future__ import annotations

import math

import pytest

from deployer.analysis.mannwhitney import mann_whitney
from deployer.analysis.quantile import histogram_quantile, sample_quantile

# 10 observations <= 0.1, 20 in (0.1, 0.2], 10 in (0.2, 0.4], 10 above 0.4
BOUNDS, CUMULATIVE, COUNT = (0.1, 0.2, 0.4), (10.0, 30.0, 40.0), 50.0


@pytest.mark.parametrize(("q", "expected"), [
    (0.5, 0.175),  # rank 25: (0.1, 0.2] holds ranks 10..30, 15 of its 20 in: 0.1 + 0.1 * 15/20
    (0.1, 0.05),  # rank 5 in the lowest bucket, which starts at 0: 0 + 0.1 * 5/10
    (0.8, 0.4),  # rank 40: the top of (0.2, 0.4]
    (0.9, 0.4),  # rank 45 lies above every finite bound: Prometheus answers the highest one
])
def test_histogram_quantile_interpolates_linearly_inside_the_bucket_that_holds_the_rank(
        q: float, expected: float) -> None:
    assert histogram_quantile(q, BOUNDS, CUMULATIVE, COUNT) == pytest.approx(expected)


def test_histogram_quantile_of_no_observation_is_none_not_zero() -> None:
    assert histogram_quantile(0.99, BOUNDS, (0.0, 0.0, 0.0), 0.0) is None


def test_histogram_quantile_zero_is_the_bottom_of_the_first_bucket_with_an_observation() -> None:
    assert histogram_quantile(0.0, (1.0, 2.0), (0.0, 4.0), 4.0) == 1.0


def test_sample_quantile_interpolates_between_order_statistics() -> None:
    assert sample_quantile(0.5, [4.0, 1.0, 3.0, 2.0]) == 2.5  # position 1.5 of 1, 2, 3, 4
    assert sample_quantile(0.99, [1.0, 2.0]) == pytest.approx(1.99)
    assert sample_quantile(0.5, []) is None


def test_mann_whitney_with_a_tie_matches_the_hand_computed_u_z_and_p() -> None:
    # baseline 1 2 3, canary 3 4 5 6; ranks 1 2 3.5 | 3.5 5 6 7, so the canary's rank sum is 21.5 and
    # U = 21.5 - 4*5/2 = 11.5 (its 3 beats 1 and 2 and ties 3: 2.5; 4, 5, 6 beat all three: 9).
    # mean 4*3/2 = 6; variance 4*3/12 * ((7 + 1) - (2^3 - 2) / (7*6)) = 55/7; z = (|11.5 - 6| - 0.5) / sqrt(55/7)
    test = mann_whitney({1.0: 1, 2.0: 1, 3.0: 1}, {3.0: 1, 4.0: 1, 5.0: 1, 6.0: 1})
    assert test is not None
    assert test.u == 11.5
    assert test.z == pytest.approx(5 / math.sqrt(55 / 7))  # 1.7838
    assert test.p == pytest.approx(0.074462, abs=1e-6)  # 2 * (1 - Phi(1.7838))
    assert test.rank_biserial == pytest.approx(2 * 11.5 / 12 - 1)  # 0.9167: the canary is mostly larger


def test_mann_whitney_is_symmetric_and_says_nothing_when_everything_ties() -> None:
    forward = mann_whitney({1.0: 3, 2.0: 5}, {2.0: 4, 3.0: 2})
    backward = mann_whitney({2.0: 4, 3.0: 2}, {1.0: 3, 2.0: 5})
    assert forward is not None and backward is not None
    assert forward.z == pytest.approx(-backward.z) and forward.p == pytest.approx(backward.p)
    assert mann_whitney({0.4: 30}, {0.4: 50}) is None  # one bucket both sides: nothing to rank
    assert mann_whitney({}, {0.4: 50}) is None

