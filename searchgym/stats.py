"""Intervals and tests for comparing agents on the same questions: a proportion's interval, a paired
difference's interval, McNemar's exact test, bootstrap means, pass@k.

A proportion (exact match, answered) gets Wilson's score interval (:func:`wilson`), everywhere: ``eval``,
``benchmark``, the demo and :class:`~searchgym.agents.evaluate.EvalSummary`. Wilson rather than
Clopper–Pearson because its coverage is close to the nominal 95 % on average where Clopper–Pearson's
guaranteed minimum makes it wider than needed (Newcombe 1998a; Agresti and Coull 1998), and because the
paired-difference interval that agrees with McNemar's test (:func:`paired_difference`, Newcombe's square
and add) is built from Wilson intervals: one rule for both. Neither collapses to zero width at 0/n or n/n,
as a percentile bootstrap does. Averages of several proportions and their differences combine the Wilson
limits by the same square-and-add rule (:func:`mover_sum`, Zou and Donner's MOVER).

Figures that are not proportions (F1, searches) keep a percentile bootstrap over questions with a fixed
seed, so a benchmark's table is the same on every run. The percentiles use numpy's ``inverted_cdf`` rule (an order statistic of the
resampled means, never an interpolation between two), which makes small cases exact to hand-compute:
for differences ``[1, 0, 0, 0]`` the resampled mean is ``k / 4`` with ``k ~ Binomial(4, 1/4)``, whose
2.5 % and 97.5 % points are 0 and 0.75.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Interval",
    "bootstrap_mean",
    "bootstrap_mean_of_means",
    "mcnemar_p",
    "mover_sum",
    "paired_difference",
    "pass_at_k",
    "wilson",
]

RESAMPLES = 2000
"""Bootstrap resamples per interval (Efron and Tibshirani's usual figure for a percentile interval)."""


@dataclass(frozen=True)
class Interval:
    """A mean and its 95 % interval."""

    mean: float
    low: float
    high: float

    def to_json(self) -> dict[str, float]:
        return {"mean": self.mean, "low": self.low, "high": self.high}


def _resampled_means(values: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    n = len(values)
    means = np.empty(resamples)
    chunk = max(1, 4_000_000 // max(n, 1))  # bounded memory for large datasets
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        means[start:stop] = values[rng.integers(0, n, size=(stop - start, n))].mean(axis=1)
    return means


def _interval(mean: float, means: np.ndarray, level: float) -> Interval:
    tail = round((1.0 - level) / 2.0, 12)  # 0.025, not 0.025000000000000022: the intended order statistic
    low, high = np.quantile(means, [tail, 1.0 - tail], method="inverted_cdf")
    return Interval(mean=mean, low=float(low), high=float(high))


def bootstrap_mean(
    values: Sequence[float] | np.ndarray, *, seed: int = 0, resamples: int = RESAMPLES, level: float = 0.95
) -> Interval:
    """The mean of ``values`` and its percentile-bootstrap interval.

    For a paired comparison pass the per-question differences (agent B's score minus agent A's on the
    same questions): resampling questions keeps each pair together.

    Raises:
        ValueError: ``values`` is empty.
    """
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        raise ValueError("bootstrap_mean needs at least one value")
    rng = np.random.default_rng(seed)
    return _interval(float(array.mean()), _resampled_means(array, rng, resamples), level)


def bootstrap_mean_of_means(
    groups: Sequence[Sequence[float] | np.ndarray],
    *,
    seed: int = 0,
    resamples: int = RESAMPLES,
    level: float = 0.95,
) -> Interval:
    """The unweighted mean of the groups' means (a benchmark's average over datasets, each dataset counting
    once whatever its size) and its interval, resampling questions within each group independently.

    Raises:
        ValueError: no group, or an empty group.
    """
    arrays = [np.asarray(g, dtype=float) for g in groups]
    if not arrays or any(a.size == 0 for a in arrays):
        raise ValueError("bootstrap_mean_of_means needs at least one group, none of them empty")
    rng = np.random.default_rng(seed)
    means = np.mean([_resampled_means(a, rng, resamples) for a in arrays], axis=0)
    return _interval(float(np.mean([a.mean() for a in arrays])), means, level)


def mcnemar_p(a: Sequence[bool] | np.ndarray, b: Sequence[bool] | np.ndarray) -> tuple[float, int, int]:
    """McNemar's exact test of two agents' correctness on the same questions.

    Only the discordant questions count: ``only_a`` (A right, B wrong) and ``only_b`` (B right, A wrong).
    Under the null each discordant question is a fair coin, so the two-sided p-value is the exact binomial
    one, ``min(1, 2 P[X <= min(only_a, only_b)])`` with ``X ~ Binomial(only_a + only_b, 1/2)``.

    Returns:
        ``(p, only_a, only_b)``; ``p`` is 1 when no question is discordant.

    Raises:
        ValueError: the two sequences differ in length.
    """
    from scipy.stats import binom

    right_a, right_b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if right_a.shape != right_b.shape:
        raise ValueError(f"McNemar's test pairs questions: got {right_a.size} and {right_b.size} outcomes")
    only_a = int(np.sum(right_a & ~right_b))
    only_b = int(np.sum(right_b & ~right_a))
    discordant = only_a + only_b
    if discordant == 0:
        return 1.0, 0, 0
    p = min(1.0, 2.0 * float(binom.cdf(min(only_a, only_b), discordant, 0.5)))
    return p, only_a, only_b


def _z(level: float) -> float:
    from scipy.stats import norm

    if not 0.0 < level < 1.0:
        raise ValueError(f"an interval's level is in (0, 1), got {level}")
    return float(norm.ppf(0.5 + level / 2.0))


def wilson(successes: float, n: int, *, level: float = 0.95) -> Interval:
    """A proportion ``successes / n`` and its Wilson score interval.

    ``successes`` may be fractional: the sum over ``n`` questions of each question's success rate over K
    samples (mean@K). Each question's rate lies in [0, 1], so its variance is at most ``p (1 - p)``, and the
    interval over ``n`` questions is then at least as wide as it needs to be.

    Raises:
        ValueError: ``n < 1``, or ``successes`` outside ``[0, n]``.
    """
    if n < 1:
        raise ValueError(f"a proportion needs at least one trial, got n={n}")
    if not -1e-9 * n <= successes <= n * (1 + 1e-9):
        raise ValueError(f"successes must lie in [0, {n}], got {successes}")
    successes = min(max(successes, 0.0), float(n))  # a rate times n can miss n by a rounding error
    z = _z(level)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # The limits equal 0 (or 1) exactly at p = 0 (or 1); rounding must not leave them a hair inside.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Interval(mean=p, low=low, high=high)


def mover_sum(parts: Sequence[tuple[float, Interval]]) -> Interval:
    """The interval of a weighted sum ``sum(w * x)`` of independent estimates from each one's interval, by
    square and add (Zou and Donner 2008's MOVER): the sum's lower limit is ``sum(w x) - sqrt(sum of the squared
    distances to the limit on the side the weight points)``, and likewise above.

    Used for a benchmark's unweighted average over datasets (``w = 1 / datasets``) and for the average of
    per-dataset paired differences.

    Raises:
        ValueError: no part.
    """
    if not parts:
        raise ValueError("mover_sum needs at least one part")
    mean = sum(w * x.mean for w, x in parts)
    below = sum((w * (x.mean - (x.low if w >= 0 else x.high))) ** 2 for w, x in parts)
    above = sum((w * ((x.high if w >= 0 else x.low) - x.mean)) ** 2 for w, x in parts)
    return Interval(mean=mean, low=mean - math.sqrt(below), high=mean + math.sqrt(above))


def paired_difference(
    a: Sequence[bool] | np.ndarray, b: Sequence[bool] | np.ndarray, *, level: float = 0.95
) -> Interval:
    """The difference ``mean(b) - mean(a)`` of two agents' success rates on the same questions, with Newcombe's
    square-and-add interval for paired proportions (Newcombe 1998b, method 10).

    Each rate gets its Wilson interval; the two are combined with the estimated correlation of the paired
    outcomes (the phi coefficient of the 2x2 table, shrunk towards 0 by ``n / 2`` when positive, set to 0
    when it is between 0 and ``n / 2`` or a margin is empty). Like McNemar's test, it is driven by the
    discordant questions, yet never collapses to a point: with none, the difference is 0 and the interval
    keeps the width the two rates' own uncertainty gives.

    Raises:
        ValueError: the sequences differ in length, or are empty.
    """
    right_a, right_b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if right_a.shape != right_b.shape or right_a.size == 0:
        raise ValueError(
            f"a paired difference pairs questions: got {right_a.size} and {right_b.size} outcomes"
        )
    n = int(right_a.size)
    both = int(np.sum(right_a & right_b))
    only_a = int(np.sum(right_a & ~right_b))
    only_b = int(np.sum(right_b & ~right_a))
    neither = n - both - only_a - only_b
    first, second = wilson(both + only_b, n, level=level), wilson(both + only_a, n, level=level)
    margins = (both + only_b) * (neither + only_a) * (both + only_a) * (neither + only_b)
    cross = both * neither - only_a * only_b
    if margins == 0 or 0 <= cross <= n / 2:
        phi = 0.0
    else:
        phi = (cross - n / 2 if cross > n / 2 else cross) / math.sqrt(margins)
    d1, d2 = first.mean - first.low, first.high - first.mean  # the later rate, b
    e1, e2 = second.mean - second.low, second.high - second.mean  # the earlier rate, a
    diff = first.mean - second.mean
    low = diff - math.sqrt(max(0.0, d1 * d1 + e2 * e2 - 2 * phi * d1 * e2))
    high = diff + math.sqrt(max(0.0, d2 * d2 + e1 * e1 - 2 * phi * d2 * e1))
    return Interval(mean=diff, low=max(-1.0, low), high=min(1.0, high))


def pass_at_k(samples: int, successes: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``samples`` draws of which ``successes`` succeeded (Chen et al.
    2021): ``1 - C(samples - successes, k) / C(samples, k)``, the chance that k draws without replacement
    hold at least one success.

    Raises:
        ValueError: ``k`` outside ``1..samples``, or ``successes`` outside ``0..samples``.
    """
    if not 1 <= k <= samples:
        raise ValueError(f"pass@k needs 1 <= k <= samples, got k={k}, samples={samples}")
    if not 0 <= successes <= samples:
        raise ValueError(f"successes must lie in 0..{samples}, got {successes}")
    if samples - successes < k:
        return 1.0
    return 1.0 - math.comb(samples - successes, k) / math.comb(samples, k)
