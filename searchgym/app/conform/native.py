"""The ``native`` conformance adapter: ``searchgym train grpo``'s batch building and loss.

The episodes are played through the vector env by :func:`~searchgym.agents.training.rollout.collect_rollouts`
(the trainer's rollout, here with the scripted turns as the policy), their advantages computed by
:func:`~searchgym.agents.grpo.advantages.compute_advantages`, and the loss is the one
:meth:`~searchgym.agents.grpo.trainer.GRPOTrainer.loss` computes: :func:`~searchgym.agents.llm.token_logprobs`
on the policy tokens, then :func:`~searchgym.agents.grpo.losses.grpo_llds_loss` with the sampler's
log-probs as ``pi_old`` (LLDS off: it is zero at a first update).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch

from searchgym.agents.grpo.advantages import compute_advantages
from searchgym.agents.grpo.config import GRPOLossConfig, LLDSConfig
from searchgym.agents.grpo.losses import grpo_llds_loss
from searchgym.agents.llm import LLMPolicy, token_logprobs
from searchgym.agents.training.rollout import RolloutBatch, collect_rollouts
from searchgym.envs.vector import SearchQAVectorEnv

from .adapter import LossOutput, Setup, TrainBatch
from .episodes import Episode, ScriptedTurns

__all__ = ["native_adapter", "native_batch", "native_loss"]

#: ``train grpo``'s ``--advantage`` values under the conformance check's estimator names.
ESTIMATOR = {"group": "grpo", "mean": "dr_grpo", "sign": "sign"}


def native_batch(episodes: Sequence[Episode], setup: Setup) -> RolloutBatch:
    """The episodes as ``train grpo``'s rollout collects them: groups of consecutive sub-envs on one question."""
    g = setup.group_size
    env = SearchQAVectorEnv(
        len(episodes), autoreset_mode="Disabled", tokenizer=setup.tokenizer, spec=setup.env
    )
    try:
        questions = [episodes[k].question_id for k in range(0, len(episodes), g)]
        policy = cast(LLMPolicy, ScriptedTurns(episodes))
        return collect_rollouts(env, policy, seed=0, group_size=g, question_ids=questions)
    finally:
        env.close()


def native_loss(batch: RolloutBatch, advantages: torch.Tensor, setup: Setup) -> LossOutput:
    """``GRPOTrainer.loss`` on the whole batch as one update: the policy's log-probs (and entropies) of its
    tokens, the reference's when there is a KL term, and ``grpo_llds_loss`` over the token mean."""
    model, vocab = setup.model, setup.tokenizer.vocab_size
    logp, entropy = token_logprobs(
        model,
        batch.tokens,
        batch.attention_mask,
        vocab_size=vocab,
        with_entropy=True,
        score_mask=batch.loss_mask,
    )
    ref_logp = None
    if setup.kl_coef and setup.reference is not None:
        with torch.no_grad():
            ref_logp, _ = token_logprobs(
                setup.reference,
                batch.tokens,
                batch.attention_mask,
                vocab_size=vocab,
                score_mask=batch.loss_mask,
            )
    loss, _ = grpo_llds_loss(
        logp,
        batch.logp_old,
        advantages,
        batch.loss_mask,
        GRPOLossConfig(clip_eps=setup.clip_eps, kl_coef=setup.kl_coef, entropy_coef=setup.entropy_coef),
        LLDSConfig(gate=None),
        ref_logp=ref_logp,
        entropy=entropy if setup.entropy_coef else None,
        num_tokens=float(batch.loss_mask.sum().clamp(min=1)),
    )
    return LossOutput(loss, logp, entropy if setup.entropy_coef else None)


def train_batch(
    batch: RolloutBatch, advantages: torch.Tensor, episodes: Sequence[Episode], loss: Any, estimator: str
) -> TrainBatch:
    """A :class:`~searchgym.app.conform.runner.TrainBatch` of a rollout batch's rows, in order."""
    lengths = batch.attention_mask.sum(dim=1).tolist()
    return TrainBatch(
        tokens=[batch.tokens[i, :n].tolist() for i, n in enumerate(lengths)],
        loss_mask=[batch.loss_mask[i, :n].long().tolist() for i, n in enumerate(lengths)],
        old_logp=[batch.logp_old[i, :n].tolist() for i, n in enumerate(lengths)],
        advantages=advantages.tolist(),
        episodes=[ep.index for ep in episodes],
        estimator=estimator,
        aggregation="token-mean",
        loss=loss,
    )


def native_adapter(episodes: Sequence[Episode], setup: Setup, advantage: str = "group") -> TrainBatch:
    """``train grpo`` on the episodes (``advantage``: its ``--advantage``, one of ``group``, ``mean``,
    ``sign``)."""
    model_mode = setup.model.training
    setup.model.eval()  # as GRPOTrainer.update: dropout off, pi_old and pi_theta the same function
    batch = native_batch(episodes, setup)
    advantages = compute_advantages(batch.rewards, setup.group_size, advantage)
    setup.model.train(model_mode)

    def loss() -> LossOutput:
        setup.model.eval()
        return native_loss(batch, advantages, setup)

    return train_batch(batch, advantages, episodes, loss, ESTIMATOR[advantage])
