"""``pi_old``, the policy a step's updates are measured against (see
:meth:`~searchgym.agents.grpo.trainer.GRPOTrainer._pi_old` for where its log-probs come from)."""

from __future__ import annotations

__all__ = ["PI_OLD_TOLERANCE"]

PI_OLD_TOLERANCE = 1e-3
"""Largest gap between the sampler's log-probs and a full forward that ``rescore_pi_old=None`` accepts as
``pi_old`` (a ratio within 0.1% of 1, far inside the clip); fp32 models measure ~1e-6, bf16 ones far more."""
