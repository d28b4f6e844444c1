"""The ``verl`` conformance adapter: verl's agent-loop worker, its advantage step and its ``ppo_loss``.

The episodes are rows that ``searchgym prepare verl`` writes, read by verl's ``RLHFDataset``; verl's own
``AgentLoopWorker.generate_sequences`` plays each through the ``searchgym`` agent loop (the scripted turns
stand in for the rollout server) and builds verl's padded batch (``prompts``, ``responses``,
``response_mask``, ``rm_scores`` …). The advantages are verl's trainer step ``compute_advantage`` (GRPO over
the rows of one question). ``pi_old``, the reference's log-probs and the loss's log-probs come from one
forward pass as verl's actor takes it (``logprobs_from_logits`` over the logits of each position), and the
loss is ``verl.workers.utils.losses.ppo_loss``: verl's default ``vanilla`` policy loss, its entropy bonus and
its ``low_var_kl`` KL loss, aggregated by ``loss_agg_mode``.
"""

from __future__ import annotations

import asyncio
import copy
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from searchgym.agents.integrations.verl_data import write_verl_parquet

from .adapter import LossOutput, Setup, TrainBatch
from .episodes import Episode, ScriptedTurns

__all__ = ["verl_adapter"]

#: verl's ``algorithm.adv_estimator`` (with ``norm_adv_by_std_in_grpo``) under the check's estimator names.
ESTIMATOR = {("grpo", True): "grpo", ("grpo", False): "dr_grpo", ("rloo", True): "rloo"}


class _ScriptedServer:
    """verl's rollout server for one episode: each ``generate`` call returns the episode's next turn."""

    def __init__(self, turns: ScriptedTurns, index: int) -> None:
        self.turns = turns
        self.index = index

    async def generate(self, request_id: str, *, prompt_ids: list[int], **_: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        turn = self.turns.turn(self.index, prompt_ids)
        return TokenOutput(token_ids=list(turn.tokens), log_probs=list(turn.logprobs))


def _worker_config(model_dir: Path, train_file: Path) -> Any:
    import verl
    from hydra import compose, initialize_config_dir  # type: ignore[import-not-found,unused-ignore]

    with initialize_config_dir(
        config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None
    ):
        return compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_dir}",
                f"data.train_files={train_file}",
                "data.max_prompt_length=512",
                "data.max_response_length=768",
                "actor_rollout_ref.rollout.name=sglang",
                "actor_rollout_ref.rollout.calculate_log_probs=True",
                "trainer.use_v1=False",
            ],
        )


def _generate(episodes: Sequence[Episode], setup: Setup) -> Any:
    """verl's batch for the episodes: one dataset row per episode through ``generate_sequences``."""
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    hf_tokenizer = setup.tokenizer.to_transformers()
    model_dir = setup.workdir / "model"
    config = copy.deepcopy(setup.model.config)  # what verl reads from the model folder: its config
    config.architectures = [type(setup.model).__name__]
    config.save_pretrained(str(model_dir))
    hf_tokenizer.save_pretrained(str(model_dir))
    questions = {ep.question_id for ep in episodes}
    paths = write_verl_parquet(setup.workdir / "data", setup.env, ["train"], limit=len(questions) + 8)
    trainer_config = _worker_config(model_dir, paths["train"])
    dataset = RLHFDataset(str(paths["train"]), hf_tokenizer, trainer_config.data)
    row_of = {str(dataset[i]["extra_info"]["question_id"]): i for i in range(len(dataset))}
    turns = ScriptedTurns(episodes)
    worker = AgentLoopWorker(trainer_config, _ScriptedServer(turns, 0))
    # The policy's own tokenizer: transformers reloads a tokenizer saved next to a Qwen2 config as
    # Qwen2Tokenizer, whose pre-tokenizer splits digits and whitespace unlike the policy's; and no model
    # family for verl's chat-token builder (the searchgym loop renders no chat template; the built-in
    # tokenizer has no Qwen chat tokens).
    worker.tokenizer = hf_tokenizer
    worker.hf_model_type = None
    outputs = []
    for k, ep in enumerate(episodes):
        worker.llm_client = _ScriptedServer(turns, k)
        batch = DataProto.from_single_dict(collate_fn([dataset[row_of[ep.question_id]]]))
        outputs.append(asyncio.run(worker.generate_sequences(batch)))
    data = DataProto.concat(outputs)
    data.non_tensor_batch["uid"] = np.array([ep.question_id for ep in episodes], dtype=object)
    return data


def _logprobs(model: Any, data: Any, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    """``(B, S)`` log-probability (and entropy) of each position's next token, over the padded sequences:
    what verl's actor computes before keeping the response positions."""
    from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

    ids, attention = data.batch["input_ids"], data.batch["attention_mask"]
    logits = model(input_ids=ids, attention_mask=attention, position_ids=data.batch["position_ids"]).logits
    labels = torch.roll(ids, shifts=-1, dims=1)
    logp = logprobs_from_logits(logits.float(), labels)
    return logp, entropy_from_logits(logits.float()) if with_entropy else None


def verl_adapter(
    episodes: Sequence[Episode],
    setup: Setup,
    loss_agg_mode: str = "token-mean",
    adv_estimator: str = "grpo",
    norm_adv_by_std_in_grpo: bool = True,
) -> TrainBatch:
    """verl's batch building, advantages and ``ppo_loss`` on the episodes (``loss_agg_mode``,
    ``adv_estimator``, ``norm_adv_by_std_in_grpo``: verl's options of those names)."""
    from verl.trainer.ppo.ray_trainer import compute_advantage
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import ActorConfig
    from verl.workers.utils.losses import ppo_loss

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        data = _generate(episodes, setup)
    data.batch["token_level_rewards"] = data.batch["rm_scores"]
    data = compute_advantage(data, adv_estimator, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
    batch = data.batch
    prompt_width = batch["prompts"].shape[1]
    setup.model.eval()
    with torch.no_grad():
        old, _ = _logprobs(setup.model, data, False)
        ref = _logprobs(setup.reference, data, False)[0] if setup.kl_coef else None
    response = slice(prompt_width - 1, -1)  # the logits at position t score token t + 1
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=setup.group_size,
        ppo_micro_batch_size_per_gpu=len(episodes),
        clip_ratio=setup.clip_eps,
        entropy_coeff=setup.entropy_coef,
        use_kl_loss=bool(setup.kl_coef),
        kl_loss_coef=setup.kl_coef,
        kl_loss_type="low_var_kl",
        loss_agg_mode=loss_agg_mode,
    )
    attention = batch["attention_mask"].bool()
    response_mask = batch["response_mask"]
    tensors = {
        "prompts": batch["prompts"],
        "responses": batch["responses"],
        "attention_mask": batch["attention_mask"],
        "response_mask": response_mask,
        "old_log_probs": old[:, response],
        "advantages": batch["advantages"],
    }
    if ref is not None:
        tensors["ref_log_prob"] = ref[:, response]
    tokens: list[list[int]] = []
    loss_mask: list[list[int]] = []
    old_logp: list[list[float]] = []
    advantages: list[list[float]] = []
    offset: list[int] = []
    for i in range(len(episodes)):
        p = int(attention[i, :prompt_width].sum())
        n = int(attention[i, prompt_width:].sum())
        tokens.append(batch["input_ids"][i][attention[i]].tolist())
        loss_mask.append([0] * p + response_mask[i, :n].tolist())
        old_logp.append([0.0] * p + old[i, prompt_width - 1 : prompt_width - 1 + n].tolist())
        advantages.append([0.0] * p + batch["advantages"][i, :n].tolist())
        offset.append(1 - (prompt_width - p))  # logp[i, j] scores token j + 1 of the padded row

    def loss() -> LossOutput:
        setup.model.eval()
        logp, entropy = _logprobs(setup.model, data, bool(setup.entropy_coef))
        flat = {"log_probs": logp[attention]}  # verl's unpadded layout: each real position in order
        if entropy is not None:
            flat["entropy"] = entropy[attention]
        td = tu.get_tensordict(
            tensor_dict=tensors,
            non_tensor_dict={
                "dp_size": 1,
                "batch_num_tokens": int(response_mask.sum()),
                "global_batch_size": len(episodes),
            },
        )
        value, _ = ppo_loss(config, flat, td)
        return LossOutput(value, logp, entropy, offset)

    return TrainBatch(
        tokens=tokens,
        loss_mask=loss_mask,
        old_logp=old_logp,
        advantages=advantages,
        episodes=[ep.index for ep in episodes],
        estimator=ESTIMATOR.get((adv_estimator, norm_adv_by_std_in_grpo), adv_estimator),
        aggregation=loss_agg_mode,
        loss=loss,
    )
