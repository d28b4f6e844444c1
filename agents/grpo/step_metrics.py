"""A GRPO step's ``rollout/`` and ``train/`` metrics, from its rollout batch and its updates' own figures
(pure functions: the trainer records them with the rest of the step's metrics)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from torch import Tensor

from ..training.rollout import RolloutBatch, summarize_episodes
from .displacement import likelihood_metrics
from .noise import noise_scale_two_batch
from .spans import tag_masks

__all__ = ["add_micro_metrics", "collapse_metrics", "finite_mean", "rollout_metrics", "update_summary"]


def finite_mean(values: list[float]) -> float:
    """The mean of the finite values (NaN when there are none)."""
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


def rollout_metrics(
    batch: RolloutBatch, advantages: Tensor, group_size: int, greedy_rewards: Tensor | None = None
) -> dict[str, float]:
    """Reward, EM, searches, lengths, and the rollout policy's likelihood of correct/incorrect responses;
    with ``greedy_rewards`` (``(Q,)``, ``--advantage greedy``), the greedy reward of the step's questions
    and the share of responses that beat their question's."""
    summary = summarize_episodes(batch.infos)
    groups = batch.rewards.view(-1, group_size)
    metrics = {
        "rollout/reward": float(batch.rewards.mean()),
        "rollout/em": summary["em"],
        "rollout/f1": summary["f1"],
        "rollout/searches": summary["searches"],
        "rollout/answered": summary["answered"],
        "rollout/response_length": summary["response_length"],
        "rollout/solved_groups": float((groups.max(dim=1).values > 0).float().mean()),
        "rollout/zero_adv_groups": float((groups.std(dim=1) == 0).float().mean()),
        "rollout/adv_abs": float(advantages.abs().mean()),
    }
    if greedy_rewards is not None:
        metrics["rollout/greedy_reward"] = float(greedy_rewards.mean())
        metrics["rollout/beats_greedy_frac"] = float((groups > greedy_rewards[:, None]).float().mean())
    # The sampler's likelihood of fresh responses: context, not LLD (that is the displacement's).
    lik = likelihood_metrics(batch.logp_old, batch.loss_mask, batch.rewards > 0)
    return metrics | {f"rollout/{k}": v for k, v in lik.items()}


def collapse_metrics(
    batch: RolloutBatch, logp: Tensor, token_bytes: Sequence[bytes], eos_id: int | None
) -> dict[str, float]:
    """The step's collapse diagnostics (``collapse/``), from its rollouts and the policy's log-probabilities.

    * ``p_search_open``, ``p_search_close``, ``p_answer_open``, ``p_answer_close``, ``p_eos``: the mean
      probability the policy gives the tokens of each protocol tag where its responses write one (NaN when
      none does): a policy forgetting its protocol loses these first;
    * ``malformed_frac``: the share of episodes with at least one invalid turn (no well-formed tag pair);
    * ``answer_without_search_frac``: the share of episodes that answered without any search.

    Args:
        batch: The step's rollouts.
        logp: ``(B, T)`` the policy's log-probability of each taken token (``pi_old``: before the updates).
        token_bytes: The tokenizer's bytes of every id.
        eos_id: The tokenizer's end-of-sequence id.
    """
    out: dict[str, float] = {}
    masks = tag_masks(batch.tokens, batch.sources, token_bytes, eos_id)
    for name, mask in masks.items():
        m = mask & batch.loss_mask
        out[f"p_{name}"] = float(logp[m].double().exp().mean()) if bool(m.any()) else float("nan")
    infos = batch.infos
    n = max(len(infos), 1)
    out["malformed_frac"] = sum(int(i.get("invalid_turns", 0)) > 0 for i in infos) / n
    out["answer_without_search_frac"] = (
        sum(i.get("answer") is not None and int(i.get("searches", 0)) == 0 for i in infos) / n
    )
    return {f"collapse/{k}": v for k, v in out.items()}


def add_micro_metrics(sums: dict[str, float], metrics: dict[str, float], share: float) -> None:
    """Adds one micro-batch's loss metrics into its update's ``sums``: terms already divided by the
    update's token count add up, ratios (fractions, means) are weighted by the micro-batch's ``share`` of
    the tokens, like the loss itself; ``max_abs_log_ratio`` is a maximum."""
    direct = ("loss", "pg_loss", "llds_loss", "sapo_loss", "sapo_frac", "kl", "entropy")
    for k, v in metrics.items():
        if k == "max_abs_log_ratio":
            sums[k] = max(sums.get(k, 0.0), v)
        else:
            sums[k] = sums.get(k, 0.0) + (v if k in direct else v * share)


def update_summary(
    update_metrics: list[dict[str, float]], rate: float, mismatch: Tensor, beta: float | None, log_gns: bool
) -> dict[str, float]:
    """The step's ``train/`` metrics from its updates' own (means, and the maxima that matter), with the
    rate they ran at, ``|pi_old - sampler|`` (``rollout/logp_mismatch``), LLDS-MA's beta, and the gradient
    noise scale when ``log_gns``."""
    per_update: dict[str, list[float]] = defaultdict(list)
    for m in update_metrics:
        for k, v in m.items():
            per_update[k].append(v)
    metrics = {f"train/{k}": finite_mean(v) for k, v in per_update.items()}
    metrics["train/grad_norm_max"] = max(per_update["grad_norm"], default=float("nan"))
    metrics["train/max_abs_log_ratio"] = max(per_update["max_abs_log_ratio"], default=float("nan"))
    metrics["train/lr"] = rate
    if log_gns and "train/gns_small_sq" in metrics:
        sizes = [metrics[f"train/gns_{k}"] for k in ("small_sq", "big_sq", "small_groups", "big_groups")]
        gns = noise_scale_two_batch(*sizes)
        metrics |= {"train/gns_groups": gns["noise_scale"], "train/gns_grad_sq": gns["grad_sq"]}
        metrics["train/gns_trace_cov"] = gns["trace_cov"]
    metrics["train/updates"] = float(len(update_metrics))
    metrics["train/skipped_updates"] = float(sum(per_update["skipped"]))
    metrics["train/zero_signal_frac"] = finite_mean(per_update["zero_signal"])
    metrics["rollout/logp_mismatch"] = float(mismatch.max()) if mismatch.numel() else 0.0
    if beta is not None:
        metrics["train/llds_ma_beta"] = beta
    return metrics
