"""GRPO learns: on a task a tiny random model can learn in seconds, the sampled reward rises from a fixed
seed — and the same check fails when the policy loss's sign is flipped or its mask drops the policy's tokens.

The task: the reward of a response is 1 when its first token lies on the positive side of a fixed random
direction ``u`` of the initial output-embedding space (``E_v · u > 0``), else 0. At random weights about
half the vocabulary is rewarded (reward ≈ 0.5, every group informative); the policy can earn it only by
turning its first-token distribution towards ``u``, which its own gradients can do. Everything else is the
real trainer: rollouts through the env, group advantages, the clipped surrogate, Adam.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import searchgym.agents.grpo.trainer as trainer_module  # noqa: E402
from searchgym.agents.grpo.config import GRPOConfig  # noqa: E402
from searchgym.agents.grpo.trainer import GRPOTrainer  # noqa: E402
from searchgym.agents.training.rollout import RolloutBatch  # noqa: E402

STEPS = 15
GAIN = 0.2
"""Learned: the last 5 steps' mean sampled reward is at least this much above the first 5 steps'."""


class DirectionReward(GRPOTrainer):
    """The trainer with the task's reward in place of the env's (see the module doc)."""

    def __init__(self, config: GRPOConfig) -> None:
        super().__init__(config)
        embeddings = self.model.get_output_embeddings().weight.detach()
        direction = torch.randn(embeddings.shape[1], generator=torch.Generator().manual_seed(0))
        self.rewarded = embeddings @ direction > 0

    def _draw(self, draw: int = 0) -> RolloutBatch:
        batch = super()._draw(draw)
        first = batch.loss_mask.float().argmax(dim=1)  # the position of each response's first policy token
        batch.rewards = self.rewarded[batch.tokens[torch.arange(len(batch)), first]].float()
        return batch


def sampled_rewards(folder: Path) -> list[float]:
    config = GRPOConfig(
        run_dir=str(folder),
        tiny_layers=1,
        tiny_hidden=32,
        max_turns=1,
        max_turn_tokens=2,
        questions_per_step=8,
        group_size=4,
        minibatch_size=32,
        steps=STEPS,
        lr=3e-2,
        weight_decay=0.0,
        kl_coef=0.0,
        entropy_coef=0.0,
        llds="none",
        probe_size=0,
        onpolicy_probe_size=0,
        ledger_size=0,
        eval_questions=0,
        save_every=0,
        seed=0,
        progress=False,
        tensorboard=False,
    )
    trainer = DirectionReward(config)
    trainer.train()
    return [float(r["rollout/sampled_reward"]) for r in trainer.history]


def learned(rewards: list[float]) -> bool:
    return statistics.fmean(rewards[-5:]) - statistics.fmean(rewards[:5]) >= GAIN


def plant(monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    """Plants a bug in the loss the trainer calls: the sign of the whole loss flipped (KL, entropy and LLDS
    are off, so that is the policy loss), or a loss mask with none of the policy's tokens."""
    real = trainer_module.grpo_llds_loss

    def planted(logp: Any, logp_old: Any, advantages: Any, mask: Any, *args: Any, **kwargs: Any) -> Any:
        if change == "flipped_sign":
            loss, metrics = real(logp, logp_old, advantages, mask, *args, **kwargs)
            return -loss, metrics
        return real(logp, logp_old, advantages, torch.zeros_like(mask), *args, **kwargs)

    monkeypatch.setattr(trainer_module, "grpo_llds_loss", planted)


@pytest.mark.parametrize("change", [None, "flipped_sign", "mask_drops_policy_tokens"])
def test_grpo_raises_the_reward_and_fails_under_planted_bugs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str | None
) -> None:
    if change is not None:
        plant(monkeypatch, change)
    rewards = sampled_rewards(tmp_path / "run")
    assert 0.3 <= statistics.fmean(rewards[:3]) <= 0.7, "the task starts near half rewarded"
    assert learned(rewards) == (change is None), f"sampled reward per step: {[round(r, 2) for r in rewards]}"
    if change == "flipped_sign":  # it learns the opposite
        assert statistics.fmean(rewards[-5:]) < statistics.fmean(rewards[:5])
