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
    self_critical_advantages,
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
    greedy = torch.tensor([0.0, 1.0])
    assert torch.equal(
        compute_advantages(rewards, 2, "greedy", greedy_rewards=greedy), torch.tensor([1.0, 0.0, -1.0, -1.0])
    )
    assert set(ADVANTAGES) == {"group", "mean", "sign", "greedy"}
    with pytest.raises(ConfigError, match="unknown advantage 'rank'"):
        compute_advantages(rewards, 2, "rank")


def test_compute_advantages_greedy_needs_the_greedy_rewards_and_only_greedy_takes_them() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    with pytest.raises(ConfigError, match="advantage 'greedy' needs greedy_rewards"):
        compute_advantages(rewards, 2, "greedy")
    with pytest.raises(ConfigError, match="baseline of advantage 'greedy', not of 'group'"):
        compute_advantages(rewards, 2, "group", greedy_rewards=torch.zeros(2))


def test_self_critical_advantages_subtract_the_greedy_reward_of_each_group() -> None:
    # G = 4: question 0's greedy answer fails (samples 0 and 3 beat it), question 1's succeeds (all do worse).
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    adv = self_critical_advantages(rewards, torch.tensor([0.0, 1.0]), 4)
    assert torch.equal(adv, torch.tensor([1.0, 0.0, 0.0, 1.0, -1.0, -1.0, -1.0, -1.0]))
    # No std scaling, and a group of equal rewards still has a signal (question 1 above: all -1).
    # F1-like rewards: 0.75 - 0.5, 0.25 - 0.5, 0.5 - 0.5; 0.2 - 0.6, 1.0 - 0.6, 0.6 - 0.6.
    f1 = torch.tensor([0.75, 0.25, 0.5, 0.2, 1.0, 0.6])
    adv = self_critical_advantages(f1, torch.tensor([0.5, 0.6]), 3)
    assert torch.allclose(adv, torch.tensor([0.25, -0.25, 0.0, -0.4, 0.4, 0.0]), atol=1e-6)


def test_self_critical_advantages_by_labels_follow_the_sorted_labels() -> None:
    # Labels 7, 2, 9: greedy_rewards are in label order 2, 7, 9 (a singleton group gets its own baseline).
    rewards = torch.tensor([1.0, 3.0, 0.0, 3.0, 5.0])
    adv = self_critical_advantages(rewards, torch.tensor([2.0, 0.5, 4.0]), torch.tensor([7, 2, 7, 2, 9]))
    assert torch.equal(adv, torch.tensor([0.5, 1.0, -0.5, 1.0, 1.0]))
    # Integer rewards and baselines come out as floats.
    out = self_critical_advantages(torch.tensor([1, 0]), torch.tensor([1]), 2)
    assert out.dtype == torch.float32 and out.tolist() == [0.0, -1.0]


def test_self_critical_advantages_shape_errors() -> None:
    with pytest.raises(
        ConfigError, match=r"greedy_rewards must have shape \(2,\), one reward per group, got \(3,\)"
    ):
        self_critical_advantages(torch.zeros(4), torch.zeros(3), 2)
    with pytest.raises(ConfigError, match="greedy_rewards must have shape"):
        self_critical_advantages(torch.zeros(4), torch.zeros(2, 1), 2)
    with pytest.raises(ConfigError, match="rewards must have shape"):
        self_critical_advantages(torch.zeros(2, 2), torch.zeros(2), 2)
    with pytest.raises(ConfigError, match="divide"):
        self_critical_advantages(torch.zeros(5), torch.zeros(2), 2)


def test_broadcast_advantages_only_on_policy_tokens() -> None:
    out = broadcast_advantages(torch.tensor([2.0, -1.0]), torch.tensor([[0, 1, 1], [1, 0, 1]]))
    assert torch.equal(out, torch.tensor([[0.0, 2.0, 2.0], [-1.0, 0.0, -1.0]]))
