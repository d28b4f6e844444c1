"""The inverse-CDF sampler draws from the tempered (and nucleus-truncated) distribution, reproducibly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

from searchgym.agents.llm import sample_tokens


def draws(logits: torch.Tensor, n: int, seed: int, **kwargs: object) -> np.ndarray:
    gen = torch.Generator().manual_seed(seed)
    batch = logits.expand(n, -1)
    ids, logp = sample_tokens(batch, logits.shape[-1], generator=gen, **kwargs)  # type: ignore[arg-type]
    assert torch.equal(
        logp,
        torch.log_softmax(batch.float() / float(kwargs.get("temperature", 1.0)), -1)
        .gather(-1, ids[:, None])
        .squeeze(-1),
    )
    return ids.numpy()


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
def test_draws_follow_the_tempered_distribution(temperature: float) -> None:
    """Chi-square goodness of fit over 50k draws of a 12-id distribution with a very unlikely id."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, 0.2, -3.0, 0.9, -0.1, -8.0]])
    n = 50_000
    ids = draws(logits, n, seed=0, temperature=temperature)
    expected = torch.softmax(logits[0] / temperature, -1).double().numpy() * n
    observed = np.bincount(ids, minlength=logits.shape[-1])
    keep = expected >= 5  # chi-square needs expected counts of at least 5 per cell
    rest_obs, rest_exp = observed[~keep].sum(), expected[~keep].sum()
    obs = np.append(observed[keep], rest_obs) if (~keep).any() else observed[keep]
    exp = np.append(expected[keep], rest_exp) if (~keep).any() else expected[keep]
    p = scipy_stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue
    assert p > 1e-3, (observed, expected)


@pytest.mark.slow
def test_draws_over_a_large_vocabulary_pass_a_ks_test() -> None:
    """Kolmogorov-Smirnov on the ids' discrete CDF (8192 ids, random logits): the model's size of problem."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 8192, generator=gen) * 2
    n = 40_000
    ids = np.sort(draws(logits, n, seed=3))
    cdf = torch.softmax(logits[0].double(), -1).cumsum(0).numpy()
    empirical = np.searchsorted(ids, np.arange(8192), side="right") / n
    d = np.abs(empirical - cdf).max()
    assert d < 1.63 / np.sqrt(n)  # the KS critical value at alpha = 0.01 (conservative for discrete data)


def test_zero_probability_and_out_of_vocabulary_ids_are_never_drawn() -> None:
    logits = torch.zeros(4000, 10)
    logits[:, 3] = -float("inf")
    logits[:, 8:] = 50.0  # beyond the vocabulary of 8: would win every draw if allowed
    ids, logp = sample_tokens(logits, 8, generator=torch.Generator().manual_seed(0))
    assert set(ids.tolist()) == {0, 1, 2, 4, 5, 6, 7}
    assert torch.allclose(logp, torch.full_like(logp, -np.log(7)))


def test_nucleus_keeps_the_smallest_set_reaching_top_p() -> None:
    probs = torch.tensor([[0.5, 0.25, 0.15, 0.1]])
    ids = draws(probs.log(), 20_000, seed=2, top_p=0.7)  # {0, 1} hold 0.75 >= 0.7
    counts = np.bincount(ids, minlength=4)
    assert counts[2] == counts[3] == 0
    p = scipy_stats.binomtest(int(counts[0]), int(counts.sum()), 2 / 3).pvalue
    assert p > 1e-3
    assert set(draws(probs.log(), 200, seed=2, top_p=1e-6).tolist()) == {0}


def test_greedy_takes_the_argmax_and_seeds_reproduce() -> None:
    logits = torch.randn(64, 300, generator=torch.Generator().manual_seed(5))
    ids, _ = sample_tokens(logits, 300, greedy=True)
    assert torch.equal(ids, logits.argmax(-1))
    a = sample_tokens(logits, 300, generator=torch.Generator().manual_seed(9))[0]
    b = sample_tokens(logits, 300, generator=torch.Generator().manual_seed(9))[0]
    c = sample_tokens(logits, 300, generator=torch.Generator().manual_seed(10))[0]
    assert torch.equal(a, b) and not torch.equal(a, c)
