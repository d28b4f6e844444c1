"""``pi_old``, the policy a step's updates are measured against: its log-probs for the step and how far the
sampler's log-probs were from them (see :meth:`~searchgym.agents.grpo.trainer.GRPOTrainer.update`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from ..training.rollout import RolloutBatch

__all__ = ["PI_OLD_TOLERANCE", "PiOld", "pi_old_gap"]

PI_OLD_TOLERANCE = 1e-3
"""Largest gap between the sampler's log-probs and a full forward that ``rescore_pi_old=None`` accepts as
``pi_old`` (a ratio within 0.1% of 1, far inside the clip); fp32 models measure ~1e-6, bf16 ones far more."""


@dataclasses.dataclass
class PiOld:
    """``pi_old`` for one step's updates: its log-probs (``logp``, filled in place before the first optimizer
    step when ``own_first``: the first update's own forward is ``pi_old`` for its responses, ``check`` then
    re-scores the rest if the sampler's log-probs drift), and how far the sampler's log-probs were from it."""

    batch: RolloutBatch
    logp: Tensor
    first: Tensor
    own_first: bool
    check: Callable[[], None] | None = None
    mismatch: Tensor | None = None

    def gap(self) -> Tensor:
        """Per policy token of the first mini-batch (or of every response, re-scored): ``|pi_old - sampler|``."""
        if self.mismatch is not None:
            return self.mismatch
        if self.own_first:
            return pi_old_gap(self.batch, self.logp, self.first)
        return torch.full((1,), float("nan"))


def pi_old_gap(batch: RolloutBatch, logp_old: Tensor, first: Tensor) -> Tensor:
    """``|pi_old - sampler|`` on the policy tokens of the responses ``first`` (whose ``pi_old`` is exact)."""
    return (logp_old[first] - batch.logp_old[first]).abs()[batch.loss_mask[first]]
