"""The early-warning and collapse rules, on hand-written metric histories (torch-free)."""

from __future__ import annotations

import pytest

from searchgym.agents.grpo.diagnostics import collapse_step, lld_warning, warning_steps


def history(deltas: list[float | None], rewards: list[float] | None = None) -> list[dict[str, float | None]]:
    rewards = rewards or [0.5] * len(deltas)
    return [
        {"step": i + 1, "lld/delta_adv_pos": d, "rollout/reward": r}
        for i, (d, r) in enumerate(zip(deltas, rewards, strict=True))
    ]


def test_warning_fires_after_k_consecutive_non_positive_deltas() -> None:
    h = history([0.1, -0.01, 0.0, -0.2, 0.05, -0.1, -0.1, -0.1])
    assert not lld_warning(h[:3], window=3)  # 0.1 breaks the run
    assert lld_warning(h[:4], window=3)  # -0.01, 0.0, -0.2: zero counts as "failed to rise"
    assert not lld_warning(h[:5], window=3)
    assert warning_steps(h, window=3) == [4, 8]
    assert warning_steps(h, window=1) == [2, 3, 4, 6, 7, 8]


def test_missing_values_never_fire_the_warning() -> None:
    h = history([-0.1, None, -0.1, -0.1])
    assert not lld_warning(h[:3], window=3)
    assert lld_warning(h + history([-0.1]), window=3) is True
    assert not lld_warning([{"lld/delta_adv_pos": float("nan")}] * 3, window=3)
    assert not lld_warning(h[:2], window=3)  # too short
    with pytest.raises(ValueError, match="window"):
        lld_warning(h, window=0)


def test_collapse_is_the_smoothed_reward_below_half_its_running_peak() -> None:
    rewards = [0.2, 0.6, 0.6, 0.6, 0.5, 0.4, 0.2, 0.1, 0.0, 0.0]
    h = history([0.0] * len(rewards), rewards)
    # 3-step averages from step 3: .467 .6 .567 .5 .367 .233(<.3 = half of the .6 peak) -> step 8.
    assert collapse_step(h, smooth=3) == 8
    assert collapse_step(h, smooth=1) == 7  # raw: 0.2 < 0.3 at step 7
    assert collapse_step(h, smooth=3, fraction=0.2) == 9
    assert collapse_step(history([0.0] * 4, [0.5, 0.5, 0.4, 0.5]), smooth=2) is None
    # A lone noisy first step does not set the peak: only full windows count.
    assert collapse_step(history([0.0] * 4, [0.9, 0.3, 0.3, 0.3]), smooth=2) is None
    assert collapse_step(h, smooth=3, min_peak=0.7) is None


def test_collapse_rule_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="fraction"):
        collapse_step([], fraction=1.5)
    assert collapse_step([]) is None
