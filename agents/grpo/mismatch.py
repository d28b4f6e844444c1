"""The sampler–learner mismatch dial: rollouts sampled by a policy that differs from the learner's in a
controlled way, the gap it makes, and the correction of the loss for it.

An inference engine (vLLM, SGLang) samples a trainer's rollouts with its own kernels, precision and weight
copy, so the probabilities it samples from differ from the ones the trainer computes — most on the
low-probability tokens a tool's output provokes. Here the learner samples its own rollouts in one engine, so
its gap is zero, and :class:`Sampler` adds one on purpose (``SamplerConfig``):

* ``sampler_dtype = "bfloat16"``: the sampler's weights are the learner's rounded to bfloat16;
* ``sampler_noise = sigma``: Gaussian noise of standard deviation ``sigma`` on the sampler's logits;
* ``sampler_stale = k``: the sampler's weights are the learner's of ``k`` optimizer updates ago.

The loss then treats the samples as a trainer of a real engine does: the tokens are the sampler's, and
``pi_old`` is the learner's own log-probabilities of them before the step's updates (every response
re-scored). :func:`mismatch_metrics` measures the gap on the sampled tokens every step;
:func:`rollout_correction` weights the policy-gradient term for it:

* ``tis`` (truncated importance sampling, Yao et al. 2025, "Your efficient RL framework secretly brings you
  off-policy RL training"): each token's surrogate is weighted by ``min(pi_old / pi_sampler, C)``;
* ``mis`` (masked importance sampling at the sequence level, as in Liu et al. 2025, "When speed kills
  stability: demystifying RL collapse from the training-inference mismatch"): a response whose
  geometric-mean ratio ``exp(mean_t log(pi_old / pi_sampler))`` lies outside ``[1/C, C]`` is dropped from
  the step's loss (its tokens leave the loss mask, numerator and denominator alike); the others keep
  weight 1.
"""

from __future__ import annotations

import copy
from collections import deque
from typing import Any

import torch
from torch import Tensor

from ..llm import LLMPolicy
from ..training.rollout import RolloutBatch
from .config import SamplerConfig

__all__ = ["Sampler", "correct_for_sampler", "mismatch_metrics", "rollout_correction"]


class Sampler:
    """The policy that samples the rollouts while the dial is on: a copy of the learner's model, synced
    before every rollout from the learner's current or stale weights, rounded to bfloat16 if asked, and
    sampling with noise on its logits if asked.

    Args:
        learner: The learner's policy (its model, tokenizer and sampling settings are copied).
        config: The dial's settings.
        seed: Seed of the sampler's own sampling generator (the run's).
    """

    def __init__(self, learner: LLMPolicy, config: SamplerConfig, seed: int) -> None:
        self.config = config
        self.learner = learner.model
        model = copy.deepcopy(learner.model).eval().requires_grad_(False)
        self.policy = LLMPolicy(
            model,
            learner.tokenizer,
            temperature=learner.temperature,
            max_turn_tokens=learner.max_turn_tokens,
            seed=seed,
            top_p=learner.top_p,
            scoring=learner.scoring,
            logit_noise=config.sampler_noise,
        )
        # The learner's weights after each of its last k updates (and before them), oldest first.
        self._history: deque[dict[str, Tensor]] = deque(maxlen=config.sampler_stale + 1)
        self.record()

    def record(self) -> None:
        """Keeps the learner's current weights (after an optimizer update), for a stale sampler."""
        if self.config.sampler_stale:
            self._history.append({k: v.detach().clone() for k, v in self.learner.state_dict().items()})

    def sync(self) -> None:
        """Loads the sampler's weights: the learner's ``sampler_stale`` updates ago (its initial ones before
        that many updates were made), else its current ones; rounded to bfloat16 with ``sampler_dtype``."""
        source = self._history[0] if self.config.sampler_stale else self.learner.state_dict()
        with torch.no_grad():
            for name, target in self.policy.model.state_dict().items():
                value = source[name]
                if self.config.sampler_dtype == "bfloat16" and value.is_floating_point():
                    value = value.to(torch.bfloat16)
                target.copy_(value.to(target.dtype))

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps to resume the sampler: the stale weights' history."""
        return {"history": list(self._history)}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state`'s history."""
        self._history.clear()
        self._history.extend(state.get("history", []))
        if not self._history:
            self.record()


def _quantile(values: Tensor, q: float) -> float:
    return float(torch.quantile(values.double(), q)) if values.numel() else float("nan")


@torch.no_grad()
def mismatch_metrics(logp_sampler: Tensor, logp_learner: Tensor, loss_mask: Tensor) -> dict[str, float]:
    """The sampler–learner gap on the sampled policy tokens.

    Args:
        logp_sampler: ``(B, T)`` log-probabilities of the taken tokens under the sampler (as it reported them).
        logp_learner: ``(B, T)`` the same under the learner (``pi_old``).
        loss_mask: ``(B, T)`` 1 on policy tokens.

    Returns:
        ``gap_mean`` and ``gap_p99``: the mean and 99th percentile of ``log pi_sampler - log pi_learner``;
        ``gap_abs_p99``: of its absolute value; ``kl_k1`` (= ``gap_mean``) and ``kl_k3`` (the mean of
        ``r - 1 - log r``, ``r = pi_learner / pi_sampler``): estimates of ``KL(pi_sampler || pi_learner)``
        from the sampler's own draws; ``ratio_mean``, ``ratio_p01``, ``ratio_p50``, ``ratio_p99``,
        ``ratio_max``: the distribution of ``r``. NaN everywhere when there are no policy tokens.
    """
    m = loss_mask.bool()
    gap = (logp_sampler.double() - logp_learner.double())[m]
    ratio = (-gap).exp()
    if not gap.numel():
        nan = float("nan")
        keys = (
            "gap_mean",
            "gap_p99",
            "gap_abs_p99",
            "kl_k1",
            "kl_k3",
            "ratio_mean",
            "ratio_p01",
            "ratio_p50",
        )
        return dict.fromkeys((*keys, "ratio_p99", "ratio_max"), nan)
    return {
        "gap_mean": float(gap.mean()),
        "gap_p99": _quantile(gap, 0.99),
        "gap_abs_p99": _quantile(gap.abs(), 0.99),
        "kl_k1": float(gap.mean()),
        "kl_k3": float((ratio - 1.0 + gap).mean()),
        "ratio_mean": float(ratio.mean()),
        "ratio_p01": _quantile(ratio, 0.01),
        "ratio_p50": _quantile(ratio, 0.5),
        "ratio_p99": _quantile(ratio, 0.99),
        "ratio_max": float(ratio.max()),
    }


@torch.no_grad()
def rollout_correction(
    logp_learner: Tensor, logp_sampler: Tensor, loss_mask: Tensor, mode: str, threshold: float
) -> tuple[Tensor | None, Tensor, dict[str, float]]:
    """The rollout correction of the policy-gradient term (see the module docstring).

    Args:
        logp_learner: ``(B, T)`` ``log pi_old`` of the taken tokens (the learner's, before the updates).
        logp_sampler: ``(B, T)`` the same under the sampler.
        loss_mask: ``(B, T)`` 1 on policy tokens.
        mode: ``"none"``, ``"tis"`` or ``"mis"``.
        threshold: ``C``: the weight cap (``tis``) or the geometric-mean ratio's bound (``mis``), > 1.

    Returns:
        ``(weights, keep, metrics)``: ``weights`` ``(B, T)`` for :func:`~.losses.policy_loss`'s
        ``is_weights`` (``None`` unless ``tis``; 0 off the policy tokens); ``keep`` ``(B,)`` bool, the
        responses that stay in the loss (all but those ``mis`` drops); ``metrics``: ``tis_capped_frac`` (the
        share of policy tokens whose weight hit the cap) and ``tis_weight_mean``, or ``mis_dropped_frac``
        (the share of responses dropped).

    Raises:
        ValueError: an unknown ``mode``.
    """
    m = loss_mask.bool()
    keep = torch.ones(m.shape[0], dtype=torch.bool, device=m.device)
    if mode == "none":
        return None, keep, {}
    log_ratio = torch.where(m, logp_learner.double() - logp_sampler.double(), 0.0)
    if mode == "tis":
        ratio = log_ratio.exp()
        weights = torch.where(m, ratio.clamp(max=threshold), 0.0).to(logp_learner.dtype)
        n = max(int(m.sum()), 1)
        return (
            weights,
            keep,
            {
                "tis_capped_frac": float(((ratio > threshold) & m).sum()) / n,
                "tis_weight_mean": float(weights.double()[m].sum()) / n,
            },
        )
    if mode == "mis":
        tokens = m.sum(dim=1)
        geo = (log_ratio.sum(dim=1) / tokens.clamp(min=1)).exp()
        bound = float(threshold)
        keep = (tokens == 0) | ((geo >= 1.0 / bound) & (geo <= bound))
        return None, keep, {"mis_dropped_frac": float((~keep).float().mean())}
    raise ValueError(f"unknown rollout correction {mode!r}; choose one of none, tis, mis")


def correct_for_sampler(
    batch: RolloutBatch, logp_learner: Tensor, config: SamplerConfig
) -> tuple[Tensor | None, Tensor, dict[str, float]]:
    """A step's rollout correction (:func:`rollout_correction`) and, where a sampler other than the learner
    drew the batch (or a correction is asked), the gap it drew with (:func:`mismatch_metrics`).

    Args:
        batch: The step's rollouts; ``batch.logp_old`` holds the log-probs the sampler reported.
        logp_learner: ``(B, T)`` ``pi_old``: the learner's log-probs of the same tokens.
        config: The dial and the correction.

    Returns:
        ``(is_weights, keep, metrics)`` as :func:`rollout_correction` gives them, ``metrics`` with the gap's
        (empty when ``config`` is all off).
    """
    weights, keep, correction = rollout_correction(
        logp_learner,
        batch.logp_old,
        batch.loss_mask,
        config.rollout_correction,
        config.rollout_correction_threshold,
    )
    if not config.active:
        return weights, keep, {}
    return weights, keep, mismatch_metrics(batch.logp_old, logp_learner, batch.loss_mask) | correction
