"""GRPO's advantages on small hand-computed rewards."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch", reason="the advantages need torch (the train extra)")

from searchgym.agents.grpo.advantages import (  # noqa: E402
    ADVANTAGES,
    broadcast_advantages,
    compute_advantages,
    group_advantages,
    mean_advantages,
    sign_advantages,
)
from searchgym.errors import ConfigError  # noqa: E402


def test_group_advantages_by_group_size() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0]), 5, eps=0.0)
    # mean 0.4, unbiased std sqrt((2 * 0.36 + 3 * 0.16) / 4) = sqrt(0.3)
    hi, lo = 0.6 / math.sqrt(0.3), -0.4 / math.sqrt(0.3)
    assert torch.allclose(adv, torch.tensor([hi, lo, lo, hi, lo]), atol=1e-6)


def test_group_advantages_by_labels_equal_rewards_and_singletons() -> None:
    rewards = torch.tensor([1.0, 3.0, 0.0, 3.0, 5.0])
    adv = group_advantages(rewards, torch.tensor([7, 2, 7, 2, 9]), eps=0.0)
    # group 7: mean 0.5, std sqrt(0.5); group 2: equal rewards; group 9: a single response.
    s = 0.5 / math.sqrt(0.5)
    assert torch.allclose(adv, torch.tensor([s, 0.0, -s, 0.0, 0.0]), atol=1e-6)
    assert torch.equal(group_advantages(torch.ones(4), 2), torch.zeros(4))


def test_group_advantages_eps_and_errors() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0]), 2, eps=1.0)
    s = math.sqrt(0.5)  # unbiased std of (1, 0)
    assert torch.allclose(adv, torch.tensor([0.5 / (s + 1), -0.5 / (s + 1)]))
    with pytest.raises(ConfigError, match="divide"):
        group_advantages(torch.zeros(5), 2)
    with pytest.raises(ConfigError, match="shape"):
        group_advantages(torch.zeros(4), torch.zeros(3))


def test_mean_advantages_are_unscaled_group_baselines() -> None:
    # group 0: mean 0.4 -> 0.6, -0.4 (no division by the std); group 1: equal rewards; group 2: a singleton.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.8])
    adv = mean_advantages(rewards, torch.tensor([0, 0, 0, 0, 0, 1, 1, 2]))
    assert torch.allclose(adv, torch.tensor([0.6, -0.4, -0.4, 0.6, -0.4, 0.0, 0.0, 0.0]), atol=1e-6)
    # F1-like rewards: the same centring, scale kept (group_advantages would divide by std 0.1).
    assert torch.allclose(mean_advantages(torch.tensor([0.9, 0.7]), 2), torch.tensor([0.1, -0.1]), atol=1e-6)


def test_sign_advantages_ignore_the_group() -> None:
    adv = sign_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 0.25]))
    assert torch.equal(adv, torch.tensor([1.0, -1.0, -1.0, -1.0, -0.5]))  # an all-wrong group still pushes
    with pytest.raises(ConfigError, match="shape"):
        sign_advantages(torch.zeros(2, 2))


def test_compute_advantages_dispatches_by_name() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert torch.equal(compute_advantages(rewards, 2, "group"), group_advantages(rewards, 2))
    assert torch.equal(compute_advantages(rewards, 2, "mean"), torch.tensor([0.5, -0.5, 0.0, 0.0]))
    assert torch.equal(compute_advantages(rewards, 2, "sign"), torch.tensor([1.0, -1.0, -1.0, -1.0]))
    assert set(ADVANTAGES) == {"group", "mean", "sign"}
    with pytest.raises(ConfigError, match="unknown advantage 'rank'"):
        compute_advantages(rewards, 2, "rank")


def test_broadcast_advantages_only_on_policy_tokens() -> None:
    out = broadcast_advantages(torch.tensor([2.0, -1.0]), torch.tensor([[0, 1, 1], [1, 0, 1]]))
    assert torch.equal(out, torch.tensor([[0.0, 2.0, 2.0], [-1.0, 0.0, -1.0]]))
