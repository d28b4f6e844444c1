"""Likelihood and its displacement, measured: tensors and masks in, plain floats out, no gradient.

What the trainer logs under ``lld/`` and ``rollout/logp_*``: the sampler's likelihood of correct and
incorrect responses, the change across a step's updates by advantage sign (LLD on the step's own
responses), the change of past successes since they were anchored (the ledger) and the probe sets' mean
log-likelihood by action kind. The losses these measurements watch are in :mod:`.losses`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .losses import as_bool, masked_mean

__all__ = ["displacement_by_advantage", "ledger_displacement", "likelihood_metrics", "probe_metrics"]


def likelihood_metrics(logp: Tensor, loss_mask: Tensor, correct: Tensor) -> dict[str, float]:
    """Log-likelihood of correct and incorrect responses under one policy, summed and per token.

    Scored on freshly sampled responses this is *not* LLD (each step's responses are new); the
    displacement diagnostics are :func:`displacement_by_advantage` and :func:`probe_metrics`.

    Args:
        logp: ``(B, T)`` log-probabilities of the taken tokens.
        loss_mask: ``(B, T)`` 1 on policy tokens.
        correct: ``(B,)`` bool, which responses are correct (e.g. reward > 0).

    Returns:
        ``logp_correct`` / ``logp_incorrect``: mean over responses of the summed log-likelihood;
        ``logp_token_correct`` / ``logp_token_incorrect``: token mean. ``nan`` when a set is empty.
    """
    m = as_bool(loss_mask)
    with torch.no_grad():
        per_resp = torch.where(m, logp, 0.0).sum(dim=1)
        out: dict[str, float] = {}
        for name, sel in (("correct", correct.bool()), ("incorrect", ~correct.bool())):
            if not bool(sel.any()):
                out[f"logp_{name}"] = out[f"logp_token_{name}"] = float("nan")
                continue
            out[f"logp_{name}"] = float(per_resp[sel].mean())
            out[f"logp_token_{name}"] = float(masked_mean(logp[sel], m[sel]))
    return out


def displacement_by_advantage(
    logp_before: Tensor, logp_after: Tensor, advantages: Tensor, loss_mask: Tensor
) -> dict[str, float]:
    """Lazy likelihood displacement on the *same* responses: how a step's updates moved their likelihood.

    For each response, the mean over its policy tokens of ``logp_after - logp_before``; then the mean over
    the responses of each advantage sign. LLD is ``delta_adv_pos <= 0``: responses the step was meant to
    reinforce did not gain likelihood (or lost it).

    Args:
        logp_before: ``(B, T)`` log-probabilities under the policy before the step's updates (``pi_old``).
        logp_after: ``(B, T)`` the same under the policy after them.
        advantages: ``(B,)`` per-response advantages.
        loss_mask: ``(B, T)`` 1 on policy tokens.

    Returns:
        ``delta_adv_pos`` (A > 0), ``delta_adv_zero`` (A = 0), ``delta_adv_neg`` (A < 0), and the responses
        in each set (``n_adv_pos`` …); a delta is ``nan`` when its set is empty.
    """
    m = as_bool(loss_mask)
    with torch.no_grad():
        delta = torch.where(m, logp_after.float() - logp_before.float(), 0.0)
        tokens = m.sum(dim=1)
        per_resp = delta.sum(dim=1) / tokens.clamp(min=1)
        has_tokens = tokens > 0
        out: dict[str, float] = {}
        for name, sel in (("pos", advantages > 0), ("zero", advantages == 0), ("neg", advantages < 0)):
            sel = sel & has_tokens
            n = int(sel.sum())
            out[f"delta_adv_{name}"] = float(per_resp[sel].mean()) if n else float("nan")
            out[f"n_adv_{name}"] = float(n)
    return out


def ledger_displacement(
    logp_now: Tensor, anchor_logp: Tensor, loss_mask: Tensor, tol: float = 1e-5
) -> dict[str, float]:
    """Cross-step displacement of the ledger: how far past successes moved since they were anchored.

    For each response, the mean over its policy tokens of ``logp_now - anchor``; then the mean over the
    responses (``ledger_delta``, < 0: the successes lost likelihood to later updates) and the share of
    responses below their anchor by more than ``tol`` nats per token (``ledger_frac_displaced``; the
    tolerance absorbs the float noise of scoring the same tokens in other batch shapes).

    Args:
        logp_now: ``(R, T)`` log-probabilities of the ledger responses under the current policy.
        anchor_logp: ``(R, T)`` their anchors.
        loss_mask: ``(R, T)`` 1 on policy tokens.
        tol: Per-token margin below the anchor that counts as displaced.

    Returns:
        ``ledger_delta``, ``ledger_frac_displaced`` (``nan`` for an empty ledger) and ``ledger_size``.
    """
    m = as_bool(loss_mask)
    with torch.no_grad():
        tokens = m.sum(dim=1)
        keep = tokens > 0
        per_resp = torch.where(m, logp_now.float() - anchor_logp.float(), 0.0).sum(dim=1) / tokens.clamp(
            min=1
        )
        per_resp = per_resp[keep]
        n = int(per_resp.numel())
        if not n:
            return {"ledger_delta": float("nan"), "ledger_frac_displaced": float("nan"), "ledger_size": 0.0}
        return {
            "ledger_delta": float(per_resp.mean()),
            "ledger_frac_displaced": float((per_resp < -tol).float().mean()),
            "ledger_size": float(n),
        }


def probe_metrics(logp: Tensor, masks: dict[str, Tensor]) -> dict[str, float]:
    """Mean per-token log-likelihood of a fixed probe set, overall and per action kind.

    Args:
        logp: ``(B, T)`` log-probabilities of the probe transcripts' tokens under the current policy.
        masks: From :func:`probe_masks`.

    Returns:
        ``probe_logp`` (all policy tokens) and ``probe_logp_<kind>`` for each kind; ``nan`` for a kind with
        no tokens.
    """
    with torch.no_grad():
        out = {}
        for kind, mask in masks.items():
            name = "probe_logp" if kind == "all" else f"probe_logp_{kind}"
            out[name] = float(masked_mean(logp, mask)) if bool(mask.any()) else float("nan")
    return out
