"""Wilson, Newcombe and MOVER intervals against published values; bootstrap intervals and McNemar's exact test
against hand-computed cases; the pass@k estimator."""

from __future__ import annotations

import numpy as np
import pytest

from searchgym.stats import (
    Interval,
    bootstrap_mean,
    bootstrap_mean_of_means,
    mcnemar_p,
    mover_sum,
    paired_difference,
    pass_at_k,
    wilson,
)


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


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [  # Newcombe (1998a), Statistics in Medicine 17:857-872, Table II, method 3 (score, no continuity correction)
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_matches_newcombes_published_intervals(
    successes: int, n: int, low: float, high: float
) -> None:
    interval = wilson(successes, n)
    assert interval.mean == successes / n
    assert (round(interval.low, 4), round(interval.high, 4)) == (low, high)


def test_wilson_never_collapses_at_zero_or_all() -> None:
    none, every = wilson(0, 10), wilson(10, 10)
    assert none.low == 0.0 and none.high > 0.25
    assert every.high == 1.0 and every.low < 0.75
    assert wilson(2.5, 10).mean == 0.25  # mean@K: a fractional count of successes
    with pytest.raises(ValueError, match="at least one trial"):
        wilson(0, 0)
    with pytest.raises(ValueError, match="successes must lie"):
        wilson(11, 10)


def _table(both: int, only_first: int, only_second: int, neither: int) -> tuple[list[int], list[int]]:
    """Two outcome columns with the given paired 2x2 counts."""
    first = [1] * (both + only_first) + [0] * (only_second + neither)
    second = [1] * both + [0] * only_first + [1] * only_second + [0] * neither
    return first, second


def test_the_paired_difference_matches_the_published_newcombe_interval() -> None:
    # Fagerland, Lydersen and Laake (2017), Statistical Analysis of Contingency Tables, Chapter 8: Cavo et al.
    # (2012), complete response before/after consolidation, table [[59, 6], [16, 80]]; Newcombe's
    # square-and-add interval for p1+ - p+1 is -0.0621 (-0.1186 to -0.0046).
    before, after = _table(59, 6, 16, 80)
    interval = paired_difference(after, before)  # mean(second argument) - mean(first)
    assert round(interval.mean, 4) == -0.0621
    assert (round(interval.low, 4), round(interval.high, 4)) == (-0.1186, -0.0046)
    flipped = paired_difference(before, after)
    assert (flipped.low, flipped.high) == pytest.approx((-interval.high, -interval.low))


def test_the_paired_difference_has_width_without_discordant_questions() -> None:
    same = paired_difference([1, 1, 0, 0], [1, 1, 0, 0])
    assert same.mean == 0.0 and same.low < 0.0 < same.high
    with pytest.raises(ValueError, match="pairs questions"):
        paired_difference([1], [1, 0])


def test_mover_sum_squares_and_adds_each_side() -> None:
    a, b = Interval(0.5, 0.3, 0.6), Interval(0.2, 0.1, 0.5)
    mean = mover_sum([(0.5, a), (0.5, b)])
    assert mean.mean == pytest.approx(0.35)
    assert mean.low == pytest.approx(0.35 - ((0.5 * 0.2) ** 2 + (0.5 * 0.1) ** 2) ** 0.5)
    assert mean.high == pytest.approx(0.35 + ((0.5 * 0.1) ** 2 + (0.5 * 0.3) ** 2) ** 0.5)
    difference = mover_sum([(1.0, a), (-1.0, b)])  # a - b: b's upper distance widens the lower side
    assert difference.low == pytest.approx(0.3 - (0.2**2 + 0.3**2) ** 0.5)
    assert difference.high == pytest.approx(0.3 + (0.1**2 + 0.1**2) ** 0.5)


@pytest.mark.parametrize(
    ("samples", "successes", "k", "expected"),
    [(4, 0, 4, 0.0), (4, 1, 4, 1.0), (4, 1, 1, 0.25), (10, 3, 1, 0.3), (5, 2, 2, 1 - 3 / 10), (3, 3, 2, 1.0)],
)
def test_pass_at_k_is_the_unbiased_estimator(samples: int, successes: int, k: int, expected: float) -> None:
    # 1 - C(n - c, k) / C(n, k): e.g. n=5, c=2, k=2 leaves C(3, 2) / C(5, 2) = 3/10 all-failure draws.
    assert pass_at_k(samples, successes, k) == pytest.approx(expected)
    with pytest.raises(ValueError, match="1 <= k <= samples"):
        pass_at_k(4, 1, 5)
