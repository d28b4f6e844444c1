"""Intervals and tests for comparing agents on the same questions: bootstrap means, paired differences,
McNemar's exact test.

Every interval here is a percentile bootstrap over questions with a fixed seed, so a benchmark's table is
the same on every run. The percentiles use numpy's ``inverted_cdf`` rule (an order statistic of the
resampled means, never an interpolation between two), which makes small cases exact to hand-compute:
for differences ``[1, 0, 0, 0]`` the resampled mean is ``k / 4`` with ``k ~ Binomial(4, 1/4)``, whose
2.5 % and 97.5 % points are 0 and 0.75.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Interval", "bootstrap_mean", "bootstrap_mean_of_means", "mcnemar_p"]

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
