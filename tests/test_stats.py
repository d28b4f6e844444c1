"""Bootstrap intervals and McNemar's exact test against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from searchgym.stats import bootstrap_mean, bootstrap_mean_of_means, mcnemar_p


def test_a_paired_difference_interval_equals_the_exact_bootstrap_distribution() -> None:
    # Differences [1, 0, 0, 0]: a resample's mean is k/4 with k ~ Binomial(4, 1/4), so
    # P(0) = .316, P(.25) = .422, P(.5) = .211, P(.75) = .047, P(1) = .004; the cumulative passes 2.5 % at 0
    # and 97.5 % at 0.75 (0.949 at 0.5, 0.996 at 0.75).
    interval = bootstrap_mean([1, 0, 0, 0], resamples=20_000)
    assert (interval.mean, interval.low, interval.high) == (0.25, 0.0, 0.75)


def test_a_mean_of_means_resamples_each_group_and_weighs_groups_equally() -> None:
    # Group means: [1, 0] -> 0 (1/4), .5 (1/2), 1 (1/4); [1, 1, 1, 1] -> always 1. The average of the two
    # is .5, .75 or 1 with those odds: the interval is [.5, 1] and the point estimate (.5 + 1) / 2, not the
    # pooled mean 5/6.
    interval = bootstrap_mean_of_means([[1, 0], [1, 1, 1, 1]], resamples=20_000)
    assert (interval.mean, interval.low, interval.high) == (0.75, 0.5, 1.0)


def test_intervals_are_seeded_and_cover_their_mean() -> None:
    values = np.random.default_rng(3).random(500)
    first, again = bootstrap_mean(values, seed=7), bootstrap_mean(values, seed=7)
    assert first == again
    assert first.low < first.mean < first.high
    # The standard error of a mean of 500 uniforms is 0.0129: a 95 % interval is about 0.05 wide.
    assert 0.04 < first.high - first.low < 0.065
    assert bootstrap_mean([0.5] * 10) == bootstrap_mean([0.5] * 10, seed=1)
    assert bootstrap_mean([0.5] * 10).low == bootstrap_mean([0.5] * 10).high == 0.5


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        # five questions only A gets right: p = 2 * 0.5^5
        ([1] * 5 + [0] * 3, [0] * 5 + [0] * 3, (0.0625, 5, 0)),
        # six against one: p = 2 * P[X <= 1], X ~ Binomial(7, 1/2) = 2 * (1 + 7) / 128
        ([1] * 6 + [0] + [1, 1], [0] * 6 + [1] + [1, 1], (0.125, 6, 1)),
        # balanced discordance: p capped at 1
        ([1, 0, 1, 0], [0, 1, 0, 1], (1.0, 2, 2)),
        # no discordant question
        ([1, 0, 1], [1, 0, 1], (1.0, 0, 0)),
    ],
)
def test_mcnemar_exact_p_values(a: list[int], b: list[int], expected: tuple[float, int, int]) -> None:
    p, only_a, only_b = mcnemar_p(a, b)
    assert (only_a, only_b) == expected[1:]
    assert p == pytest.approx(expected[0], abs=1e-12)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one value"):
        bootstrap_mean([])
    with pytest.raises(ValueError, match="none of them empty"):
        bootstrap_mean_of_means([[1.0], []])
    with pytest.raises(ValueError, match="pairs questions"):
        mcnemar_p([1, 0], [1])


def test_a_95_percent_interval_takes_the_2_5_and_97_5_order_statistics() -> None:
    from searchgym.stats import _interval

    # 2,000 resampled means 0 .. 1999: the 2.5 % point is the 50th value (49), the 97.5 % point the 1,950th.
    interval = _interval(0.0, np.arange(2000.0), 0.95)
    assert (interval.low, interval.high) == (49.0, 1949.0)
