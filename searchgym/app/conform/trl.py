"""The ``trl`` conformance adapter: TRL's ``GRPOTrainer`` as ``searchgym train trl`` configures it.

The episodes are the rollout of :class:`~searchgym.agents.integrations.trl.SearchQARollout` (the vector
env played with the scripted turns instead of the model's samples), handed to TRL through its
``rollout_func``; TRL's own ``_generate_and_score_completions`` pads them, turns ``env_mask`` into its
``tool_mask``, scores the rewards, computes the group advantages and (two passes per rollout batch, so that
it keeps them) ``pi_old``; the loss is TRL's ``_compute_loss`` on that batch, as one update.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any, cast

import torch

from searchgym.agents.grpo.config import LLDSConfig
from searchgym.agents.integrations.config import TRLConfig
from searchgym.agents.integrations.trl import (
    LLDSGRPOTrainer,
    SearchQARollout,
    episode_reward,
    question_dataset,
    trl_args,
)
from searchgym.envs.spec import EnvSpec

from .adapter import LossOutput, Setup, TrainBatch
from .episodes import ConformError, Episode, ScriptedTurns

__all__ = ["trl_adapter"]

#: TRL's ``scale_rewards`` under the conformance check's estimator names.
ESTIMATOR = {"group": "grpo", "none": "dr_grpo"}
#: TRL's ``loss_type`` under the conformance check's aggregation names.
AGGREGATION = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dapo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
}


class _ScriptedRollout(SearchQARollout):
    """``SearchQARollout`` whose turns come from the scripted episodes (prompt ``i`` plays episode ``i``)."""

    def __init__(self, spec: EnvSpec, tokenizer: Any, episodes: Sequence[Episode]) -> None:
        super().__init__(spec, tokenizer)
        self.turns = ScriptedTurns(episodes)

    def _policy_for(self, trainer: Any, env: Any, model: Any) -> Any:
        return self.turns


def trl_adapter(episodes: Sequence[Episode], setup: Setup, loss_type: str = "dapo") -> TrainBatch:
    """TRL's batch building and loss on the episodes (``loss_type``: TRL's)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    n, g = len(episodes), setup.group_size
    config = TRLConfig(
        run_dir=str(setup.workdir / "trl"),
        questions_per_step=n // g,
        group_size=g,
        minibatch_size=n,
        epochs=2,  # TRL keeps old_per_token_logps only when a rollout batch serves several updates
        loss_type=cast(Any, loss_type),
        kl_coef=0.0,  # the reference is the setup's, set below: TRL would load one from the model's path
        entropy_coef=setup.entropy_coef,
        clip_eps=setup.clip_eps,
        updates=1,
        progress=False,
        device="cpu",
        env=setup.env,
    )
    rollout = _ScriptedRollout(config.env, setup.tokenizer, episodes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' renamings, inside TRL
        trainer = LLDSGRPOTrainer(
            model=setup.model,
            reward_funcs=[episode_reward],
            args=trl_args(config, num_processes=1),
            train_dataset=question_dataset(rollout.env(n)),
            processing_class=setup.tokenizer.to_transformers(),
            rollout_func=rollout,
            llds=LLDSConfig(gate=None),
            tokenizer=setup.tokenizer,
            warning_window=None,
        )
        if setup.kl_coef:
            from trl.trainer.utils import add_fused_lm_head

            # As TRL prepares the reference it builds: log-probs from its fused LM head.
            add_fused_lm_head(
                setup.reference,
                temperature=trainer.temperature,
                cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32,
            )
            trainer.beta = setup.kl_coef
            trainer.ref_model = setup.reference
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
        inputs = trainer._generate_and_score_completions([{"prompt": ep.question_id} for ep in episodes])
    old = inputs.get("old_per_token_logps")
    if old is None:
        raise ConformError("TRL kept no old_per_token_logps for a rollout batch of two passes")
    prompt_mask, completion_mask = inputs["prompt_mask"].bool(), inputs["completion_mask"].bool()
    trained = inputs["completion_mask"] * inputs.get("tool_mask", torch.ones_like(inputs["completion_mask"]))
    tokens, loss_mask, old_logp, offset = [], [], [], []
    for i in range(n):
        prompt = inputs["prompt_ids"][i][prompt_mask[i]].tolist()
        width = int(completion_mask[i].sum())
        tokens.append(prompt + inputs["completion_ids"][i, :width].tolist())
        loss_mask.append([0] * len(prompt) + trained[i, :width].tolist())
        old_logp.append([0.0] * len(prompt) + old[i, :width].tolist())
        offset.append(len(prompt))
    captured: dict[str, Any] = {}
    scoring = trainer._get_per_token_logps_and_entropies

    def capture(model: Any, *args: Any, **kwargs: Any) -> Any:
        out = scoring(model, *args, **kwargs)
        captured["logp"], captured["entropy"] = out[0], out[1]
        return out

    def loss() -> LossOutput:
        trainer._get_per_token_logps_and_entropies = capture  # type: ignore[method-assign]
        try:
            value = trainer._compute_loss(trainer.model, inputs)
        finally:
            del trainer._get_per_token_logps_and_entropies
        entropy = captured["entropy"] if setup.entropy_coef else None
        return LossOutput(value, captured["logp"], entropy, offset)

    return TrainBatch(
        tokens=tokens,
        loss_mask=loss_mask,
        old_logp=old_logp,
        advantages=inputs["advantages"].tolist(),
        episodes=[ep.index for ep in episodes],
        estimator=ESTIMATOR.get(str(trainer.scale_rewards), str(trainer.scale_rewards)),
        aggregation=AGGREGATION.get(loss_type, loss_type),
        loss=loss,
    )
