"""``pi_old``, the policy a step's updates are measured against, and where its log-probs come from."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..training.rollout import RolloutBatch

__all__ = ["PI_OLD_TOLERANCE", "pi_old_logprobs"]

PI_OLD_TOLERANCE = 1e-3
"""Largest gap between the sampler's log-probs and a full forward that ``rescore_pi_old=None`` accepts as
``pi_old`` (a ratio within 0.1% of 1, far inside the clip); fp32 models measure ~1e-6, bf16 ones far more."""


def pi_old_logprobs(
    batch: RolloutBatch,
    plan: list[list[Tensor]],
    first_epoch: list[Tensor],
    rule: bool | None,
    score: Callable[[list[Tensor]], Tensor],
) -> tuple[Tensor, Tensor]:
    """``pi_old``'s log-probs for a step, and ``|pi_old - sampler|`` on the policy tokens it was scored on
    (NaN where none was), by ``rescore_pi_old``'s ``rule``.

    The weights at the step's start *are* ``pi_old``. ``None`` (default) scores the first mini-batch in the
    shapes its update will use, so that update starts exactly on-policy (ratio 1, LLDS 0, bit for bit); the
    other responses keep the sampler's log-probs (cached, last-position forwards: equal up to float noise,
    ``rollout/logp_mismatch`` measures it) unless that noise exceeds :data:`PI_OLD_TOLERANCE` (a bf16 model),
    when they are scored too. ``True`` scores every response with the first epoch's shapes (an update-free
    step then measures exactly zero displacement); ``False`` keeps the sampler's throughout (the first update
    then sees float noise, which LLDS's ``max(d, 0)`` turns into a gradient).

    Args:
        batch: The step's rollouts (``logp_old``: the sampler's log-probs).
        plan: The step's mini-batches, each a list of micro-batches (index tensors).
        first_epoch: The first epoch's micro-batches (every response once).
        rule: ``rescore_pi_old``: ``None``, ``True`` or ``False``.
        score: ``(B, T)`` log-probs of the batch under the current weights, filled on the given micro-batches.
    """
    logp = batch.logp_old.clone()
    if rule is False:
        return logp, torch.full((1,), float("nan"))
    scored = first_epoch if rule else plan[0]
    fresh = score(scored)
    for idx in scored:
        logp[idx] = fresh[idx]
    rows = torch.cat(scored)
    gap = (logp[rows] - batch.logp_old[rows]).abs()[batch.loss_mask[rows]]
    rest = first_epoch[len(plan[0]) :]  # the first epoch's micro-batches after the first mini-batch's
    if rule is None and rest and gap.numel() and float(gap.max()) > PI_OLD_TOLERANCE:
        fresh = score(rest)
        for idx in rest:
            logp[idx] = fresh[idx]
    return logp, gap
