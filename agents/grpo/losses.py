"""GRPO and LLDS as pure tensor functions: tensors and masks in, ``(loss, metrics)`` or tensors out.

Shapes: ``B`` responses in the batch, ``T`` token positions (the whole transcript, prompt and tool text
included), ``V`` vocabulary entries. Every per-token tensor is aligned with the transcript: position ``t``
holds the quantity of token ``t`` given the tokens before it. The ``loss_mask`` is 1 exactly on the tokens
the policy wrote (``sources == Source.POLICY``): prompt, tool output and padding are context only, never in
a loss, a KL or a metric.

Aggregation is the token mean over the batch: a sum over the masked tokens of all responses divided by
their number ``N`` (or by ``num_tokens`` when the caller accumulates gradients over micro-batches and
wants the whole mini-batch's count). Metrics are plain floats under short names; the trainer records them
under its own namespace (``train/clip_frac`` …). The maths, in the paper's notation, is in ``docs/grpo.md``.
"""

from __future__ import annotations

import math

try:
    import torch
    from torch import Tensor
except ImportError as e:  # pragma: no cover - depends on the installation
    from searchgym.errors import MissingDependencyError

    raise MissingDependencyError("torch", "train", "GRPO training") from e

from searchgym.errors import ConfigError

from .advantages import broadcast_advantages
from .config import GATES, MA_SCHEDULES, SAPO_THRESHOLD, Gate, GRPOLossConfig, LLDSConfig

__all__ = [
    "KL_VALUE_CAP",
    "MA_SCHEDULES",
    "RATIO_CAP",
    "action_ids",
    "adaptive_answer_weight",
    "answer_weights",
    "entropy_bonus",
    "entropy_from_logits",
    "grpo_llds_loss",
    "k3_kl",
    "kl_penalty",
    "ledger_llds_loss",
    "llds_loss",
    "masked_mean",
    "policy_loss",
    "sapo_loss",
]


# A floor/ceiling on every log-ratio before exp(): far inside float32's range (e^88 overflows), far outside
# anything the caps below let through. Purely numerical; the caps are the modelling choice.
_MAX_LOG_RATIO = 20.0

RATIO_CAP = 100.0
"""Default cap on the importance ratio ``pi_theta / pi_old`` (the reference code's value; see docs/grpo.md)."""

KL_VALUE_CAP = 10.0
"""Default cap on the per-token k3 value: it is clamped to ``[-cap, cap]`` (the reference code's value)."""

DEFAULT_LOSS = GRPOLossConfig()
"""The loss section :func:`grpo_llds_loss` uses when given none: ``train grpo``'s defaults."""
DEFAULT_LLDS = LLDSConfig()
"""The LLDS section :func:`grpo_llds_loss` uses when given none: lambda 0.2 with the action gate."""


# -- aggregation ---------------------------------------------------------------------------------------


def as_bool(mask: Tensor) -> Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def _count(mask: Tensor, num_tokens: float | None) -> Tensor | float:
    """The token-mean denominator: ``num_tokens`` if given, else the masked tokens (at least 1)."""
    if num_tokens is not None:
        if num_tokens <= 0:
            raise ConfigError(f"num_tokens must be > 0, got {num_tokens}")
        return float(num_tokens)
    return as_bool(mask).sum().clamp(min=1)


def masked_mean(values: Tensor, mask: Tensor, num_tokens: float | None = None) -> Tensor:
    """Token mean of ``values`` over the masked positions of the whole batch.

    Positions outside the mask are zeroed with ``where`` (not multiplied), so a NaN or infinity there
    (e.g. a log-probability of padding) cannot leak into the result.

    Args:
        values: ``(B, T)`` per-token values.
        mask: ``(B, T)`` bool or 0/1 mask.
        num_tokens: Denominator override (default: the number of masked positions, at least 1).

    Returns:
        A scalar tensor.
    """
    m = as_bool(mask)
    return torch.where(m, values, torch.zeros_like(values)).sum() / _count(m, num_tokens)


def _float(x: Tensor | float) -> float:
    return float(x.detach()) if isinstance(x, Tensor) else float(x)


def _token_advantages(advantages: Tensor, loss_mask: Tensor) -> Tensor:
    return broadcast_advantages(advantages, loss_mask) if advantages.dim() == 1 else advantages


# -- PPO-clipped surrogate -----------------------------------------------------------------------------


def policy_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    num_tokens: float | None = None,
    ratio_cap: float = RATIO_CAP,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The PPO-clipped surrogate on token ratios ``rho = exp(logp - logp_old)``, token-mean aggregated.

    Per token: ``max(-A * rho, -A * clip(rho, 1 - clip_eps, 1 + clip_eps_high))`` with ``rho`` first capped
    at ``ratio_cap`` (zero gradient beyond the cap). The cap matters for negative advantages, where the
    unclipped term is the active one: without it one token whose probability jumped by ``e^k`` weighs
    ``e^k`` times in the loss and its gradient.

    Args:
        logp: ``(B, T)`` log-probabilities of the taken tokens under the policy being trained.
        logp_old: ``(B, T)`` the same under the rollout policy ``pi_old`` (treated as a constant).
        advantages: ``(B,)`` per-response advantages, or ``(B, T)`` per-token ones.
        loss_mask: ``(B, T)`` 1 on policy tokens.
        clip_eps: Lower clip range (and the upper one unless ``clip_eps_high`` is given).
        clip_eps_high: Upper clip range (DAPO's "clip higher"); defaults to ``clip_eps``.
        num_tokens: Token-mean denominator override.
        ratio_cap: Largest importance ratio that reaches the loss (``inf``: no cap).
        is_weights: ``(B, T)`` non-negative per-token weights of the surrogate (constants): the rollout
            correction's importance weights ``pi_old / pi_sampler`` when another engine sampled the tokens
            (:func:`searchgym.agents.grpo.mismatch.rollout_correction`); ``None``: 1.

    Returns:
        ``(loss, metrics)`` with metrics ``pg_loss``, ``clip_frac`` (fraction of policy tokens whose clipped
        term was the active one), ``approx_kl`` (token mean of ``(rho - 1) - log rho``, an estimate of
        ``KL(pi_old || pi_theta)``), ``max_abs_log_ratio`` (largest ``|log rho|`` before any cap) and
        ``ratio_cap_frac`` (fraction of policy tokens whose ratio hit the cap).
    """
    if not ratio_cap > 1.0:
        raise ConfigError(f"ratio_cap must be > 1, got {ratio_cap}")
    m = as_bool(loss_mask)
    high = clip_eps if clip_eps_high is None else clip_eps_high
    adv = _token_advantages(advantages, m)
    raw = torch.where(m, logp - logp_old.detach(), 0.0)
    # clamp() passes no gradient beyond its bounds: a capped token contributes a constant.
    log_ratio = raw.clamp(-_MAX_LOG_RATIO, min(math.log(ratio_cap), _MAX_LOG_RATIO))
    ratio = log_ratio.exp()
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_eps, 1.0 + high)
    surrogate = torch.maximum(unclipped, clipped)
    if is_weights is not None:  # w >= 0, so w * max(a, b) = max(w * a, w * b): the weight scales the token
        surrogate = surrogate * is_weights.detach()
    loss = masked_mean(surrogate, m, num_tokens)
    with torch.no_grad():
        clip_frac = masked_mean((clipped > unclipped).float(), m)
        approx_kl = masked_mean((ratio - 1.0) - log_ratio, m)
        capped = (raw > log_ratio) & m
        max_abs = float(raw.abs().max()) if bool(m.any()) else 0.0
    return loss, {
        "pg_loss": _float(loss),
        "clip_frac": _float(clip_frac),
        "approx_kl": _float(approx_kl),
        "max_abs_log_ratio": max_abs,
        "ratio_cap_frac": _float(masked_mean(capped.float(), m)),
    }


# -- KL to the reference and entropy -------------------------------------------------------------------


def k3_kl(logp: Tensor, ref_logp: Tensor, value_cap: float = KL_VALUE_CAP) -> Tensor:
    """Per-token k3 ("low-variance") estimate of ``KL(pi_theta || pi_ref)``: ``e^x - x - 1``, x = ref - logp.

    Non-negative, unbiased for tokens sampled from ``pi_theta``. The value is clamped to
    ``[-value_cap, value_cap]`` with zero gradient beyond (as the reference code does): a token the policy
    has moved far from the reference adds a bounded, constant penalty instead of a gradient growing like
    ``e^x``.

    Args:
        logp: ``(B, T)`` log-probabilities under the policy.
        ref_logp: ``(B, T)`` log-probabilities under the frozen reference.
        value_cap: Bound on each token's value (``inf``: no cap).

    Returns:
        ``(B, T)`` per-token estimates (defined everywhere; mask them yourself or use :func:`kl_penalty`).
    """
    if not value_cap > 0:
        raise ConfigError(f"value_cap must be > 0, got {value_cap}")
    delta = (ref_logp.detach() - logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return (delta.exp() - delta - 1.0).clamp(-value_cap, value_cap)


def kl_penalty(
    logp: Tensor,
    ref_logp: Tensor,
    loss_mask: Tensor,
    num_tokens: float | None = None,
    value_cap: float = KL_VALUE_CAP,
) -> tuple[Tensor, dict[str, float]]:
    """Token mean of :func:`k3_kl` over policy tokens (tool tokens never count).

    Args:
        logp: ``(B, T)`` log-probabilities under the policy.
        ref_logp: ``(B, T)`` log-probabilities under the frozen reference.
        loss_mask: ``(B, T)`` 1 on policy tokens.
        num_tokens: Token-mean denominator override.
        value_cap: Bound on each token's k3 value.

    Returns:
        ``(loss, {"kl_ref": loss, "kl_cap_frac": fraction of policy tokens at the cap})``.
    """
    m = as_bool(loss_mask)
    # Zero the inputs outside the mask first: garbage there would give inf * 0 = NaN in the gradient.
    kl = k3_kl(torch.where(m, logp, 0.0), torch.where(m, ref_logp, 0.0), value_cap)
    loss = masked_mean(kl, m, num_tokens)
    with torch.no_grad():
        at_cap = masked_mean((kl >= value_cap).float(), m)
    return loss, {"kl_ref": _float(loss), "kl_cap_frac": _float(at_cap)}


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of ``softmax(logits)`` along the last axis; entries at ``-inf`` (masked ids) count as 0.

    Args:
        logits: ``(..., V)`` unnormalised log-probabilities.

    Returns:
        ``(...)`` entropies in nats.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    p = logp.exp()
    # p * logp is 0 * -inf = NaN at masked ids; their contribution is 0 by continuity.
    return -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1)


def entropy_bonus(
    entropy: Tensor, loss_mask: Tensor, num_tokens: float | None = None
) -> tuple[Tensor, dict[str, float]]:
    """Token mean of the policy's entropy over policy tokens (subtract ``coef * H`` from the loss).

    Args:
        entropy: ``(B, T)`` per-token entropies (e.g. from :func:`entropy_from_logits`), or ``(B, T, V)``
            logits, from which they are computed.
        loss_mask: ``(B, T)`` 1 on policy tokens.
        num_tokens: Token-mean denominator override.

    Returns:
        ``(mean_entropy, {"entropy": mean_entropy})``.
    """
    ent = entropy_from_logits(entropy) if entropy.dim() == 3 else entropy
    h = masked_mean(ent, loss_mask, num_tokens)
    return h, {"entropy": _float(h)}


# -- actions and the answer span -----------------------------------------------------------------------


def action_ids(loss_mask: Tensor) -> Tensor:
    """Numbers the actions of each response: contiguous runs of policy tokens, split by any other token.

    In a transcript the policy's turns are separated by tool output (search results or the corrective
    message), so an action is one turn.

    Args:
        loss_mask: ``(B, T)`` 1 on policy tokens.

    Returns:
        ``(B, T)`` int64: ``k`` on the tokens of the response's ``k``-th action (from 0), ``-1`` elsewhere.

    >>> action_ids(torch.tensor([[0, 1, 1, 0, 1]])).tolist()
    [[-1, 0, 0, -1, 1]]
    """
    m = as_bool(loss_mask)
    prev = torch.zeros_like(m)
    prev[:, 1:] = m[:, :-1]
    starts = m & ~prev
    ids = starts.long().cumsum(dim=1) - 1
    return torch.where(m, ids, torch.full_like(ids, -1))


def _segment_sums(values: Tensor, segments: Tensor) -> tuple[Tensor, Tensor]:
    """Sums ``values`` (B, T) within each segment of ``segments`` (B, T; -1 = none).

    Returns the per-token sum of the token's own segment (0 outside) and the per-segment sums.
    """
    per_row = segments.max(dim=1).values.clamp(min=-1) + 1  # segments in each row
    offset = torch.cumsum(per_row, 0) - per_row
    inside = segments >= 0
    flat = torch.where(inside, segments + offset[:, None], 0).reshape(-1)
    total = int(per_row.sum())
    sums = torch.zeros(total, dtype=values.dtype, device=values.device)
    if total == 0:
        return torch.zeros_like(values), sums
    sums.index_add_(0, flat, torch.where(inside, values, 0.0).reshape(-1))
    return torch.where(inside, sums[flat].reshape(values.shape), 0.0), sums


def adaptive_answer_weight(mean_valid_searches: float, schedule: str = "code") -> float:
    """LLDS-MA's adaptive answer weight ``beta`` from the batch's mean number of valid searches ``V``.

    * ``"paper"``: ``beta = min(V / 2, 1)`` — the paper's formula: half weight at one search, full at two.
    * ``"code"``: ``beta = clip(V - 1, 0, 1)`` — the authors' released code (answer weight
      ``min(w * max(V - 1, 0), lambda)`` with ``w = lambda``): the answer span is not preserved at all
      while episodes search once or less, which is the degenerate regime LLDS-MA exists for.

    Raises:
        ConfigError: ``schedule`` is not one of :data:`MA_SCHEDULES`.
    """
    v = max(mean_valid_searches, 0.0)
    if schedule == "paper":
        return min(v / 2.0, 1.0)
    if schedule == "code":
        return min(max(v - 1.0, 0.0), 1.0)
    raise ConfigError(f"unknown LLDS-MA schedule {schedule!r}; valid schedules: {list(MA_SCHEDULES)}")


def answer_weights(answer_mask: Tensor, beta: float) -> Tensor:
    """LLDS-MA's per-token weights: ``beta`` on the final answer span, 1 elsewhere.

    Args:
        answer_mask: ``(B, T)`` from :func:`answer_span_mask`.
        beta: Weight of answer tokens (constant, or :func:`adaptive_answer_weight`).

    Returns:
        ``(B, T)`` float weights.
    """
    ones = torch.ones(answer_mask.shape, dtype=torch.float32, device=answer_mask.device)
    return torch.where(as_bool(answer_mask), ones * beta, ones)


# -- LLDS ----------------------------------------------------------------------------------------------


def _gate_token(d: Tensor, m: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    # No gate: max(d, 0) already selects the tokens that lost likelihood; "open" reports which did.
    return torch.ones_like(d), d > 0, m


def _gate_response(d: Tensor, m: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    total = torch.where(m, d, 0.0).sum(dim=1)
    open_ = total > 0
    return open_[:, None].expand(d.shape).to(d.dtype), open_, m.any(dim=1)


def _gate_action(d: Tensor, m: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    per_token, per_action = _segment_sums(d, action_ids(m))
    gate = (per_token > 0) & m
    return gate.to(d.dtype), per_action > 0, torch.ones_like(per_action, dtype=torch.bool)


_GATE_FNS = {"action": _gate_action, "response": _gate_response, "token": _gate_token}


def llds_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    gate: Gate = "action",
    weights: Tensor | None = None,
    num_tokens: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The LLDS likelihood-preserving regulariser (Deng et al., 2025), unscaled (multiply by lambda).

    Per token ``d = logp_old - logp`` (positive: the token lost likelihood since the rollout). Only the
    preserving set, responses with ``A >= 0``, is regularised::

        L = sum_{i,t} gate_{i,t} * w_{i,t} * max(d_{i,t}, 0) * mask_{i,t} * [A_i >= 0] / N

    with ``N`` the number of policy tokens of the whole batch, all responses included (what the official
    code does: the term is a token mean like the policy loss, so lambda does not depend on the share of
    correct responses). Gates (unweighted sums of ``d``):

    * ``"action"``: one gate per action (contiguous run of policy tokens between tool outputs), open when
      the action's summed ``d`` is > 0 — the paper's best variant;
    * ``"response"``: one gate per response, open when its summed ``d`` over all policy tokens is > 0;
    * ``"token"``: no gate, every token with ``d > 0`` is penalised.

    Args:
        logp: ``(B, T)`` log-probabilities of the taken tokens under the policy being trained.
        logp_old: ``(B, T)`` the same under the rollout policy (a constant).
        advantages: ``(B,)`` per-response advantages.
        loss_mask: ``(B, T)`` 1 on policy tokens.
        gate: ``"action"``, ``"response"`` or ``"token"``.
        weights: ``(B, T)`` per-token weights ``w`` (LLDS-MA: :func:`answer_weights`); default all 1.
        num_tokens: Denominator override (default: the policy tokens of the batch).

    Returns:
        ``(loss, metrics)`` with metrics ``llds_loss`` and ``llds_gate_open`` (fraction of the preserving
        set's gate units that are open: actions, responses, or tokens with ``d > 0``).

    Raises:
        ConfigError: ``gate`` is not one of :data:`GATES`.
    """
    if gate not in _GATE_FNS:
        raise ConfigError(f"unknown LLDS gate {gate!r}; valid gates: {list(GATES)}")
    if advantages.dim() != 1:
        raise ConfigError(
            f"llds_loss needs per-response advantages of shape (B,), got {tuple(advantages.shape)}"
        )
    m = as_bool(loss_mask)
    preserve = (advantages >= 0)[:, None] & m
    d = torch.where(preserve, logp_old.detach() - logp, 0.0)
    gate_w, units_open, units = _GATE_FNS[gate](d.detach(), preserve)
    w = torch.ones_like(d) if weights is None else weights.to(d.dtype)
    penalty = gate_w * w * torch.relu(d)
    loss = masked_mean(penalty, preserve, num_tokens=_float(_count(m, num_tokens)))
    n_units = int(units.sum())
    frac = float((units_open & units).sum()) / n_units if n_units else 0.0
    return loss, {"llds_loss": _float(loss), "llds_gate_open": frac}


def ledger_llds_loss(
    logp: Tensor,
    anchor_logp: Tensor,
    loss_mask: Tensor,
    gate: Gate = "action",
    weights: Tensor | None = None,
    num_tokens: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Ledger-LLDS: LLDS against the *anchors* of past successes, unscaled (multiply by ``lambda_R``).

    Each ledger response was positively rewarded at some earlier step; its anchor is its log-likelihood
    right after that step's updates. Per token ``d = anchor - logp`` (positive: likelihood lost since the
    success was recorded, by any later update), and every response is in the preserving set::

        L_R = sum_{i,t} gate_{i,t} * w_{i,t} * max(d_{i,t}, 0) * mask_{i,t} / N_R

    with ``N_R`` the policy tokens of the ledger sample (its own token mean, independent of the batch). It
    is :func:`llds_loss` with every advantage positive and the anchor in place of ``pi_old``: LLDS protects
    the current batch from its own updates, this term protects earlier successes from later ones.

    Args:
        logp: ``(R, T)`` log-probabilities of the ledger responses' tokens under the policy being trained.
        anchor_logp: ``(R, T)`` their anchors (constants).
        loss_mask: ``(R, T)`` 1 on policy tokens.
        gate: ``"action"``, ``"response"`` or ``"token"`` (see :func:`llds_loss`).
        weights: ``(R, T)`` per-token weights, default 1.
        num_tokens: Denominator override (default: the policy tokens of these responses; a sample split
            into micro-batches passes the whole sample's count).

    Returns:
        ``(loss, metrics)`` with ``ledger_llds_loss`` and ``ledger_gate_open``.
    """
    positive = torch.ones(logp.shape[0], dtype=logp.dtype, device=logp.device)
    loss, m = llds_loss(logp, anchor_logp, positive, loss_mask, gate, weights, num_tokens)
    return loss, {"ledger_llds_loss": m["llds_loss"], "ledger_gate_open": m["llds_gate_open"]}


# -- SAPO ----------------------------------------------------------------------------------------------


def sapo_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    threshold: float = SAPO_THRESHOLD,
    num_tokens: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """SAPO's conditional KL to the rollout policy (Li et al., 2026, arXiv 2603.10069), unscaled.

    Per token ``d = logp_old - logp = -log r`` (the single-sample k1 estimate of ``KL(pi_old || pi)``).
    Only tokens of responses with ``A >= 0`` whose ratio ``r = pi / pi_old`` has fallen to ``threshold`` or
    below are penalised::

        L = sum_{i,t} d_{i,t} * [r_{i,t} <= threshold] * mask_{i,t} * [A_i >= 0] / N_+

    with ``N_+`` the policy tokens of the ``A >= 0`` responses (penalised or not). Its gradient raises the
    likelihood of those tokens with weight 1 whatever ``r`` is, where the clipped surrogate's weight ``r``
    vanishes as ``r -> 0``. Against :func:`llds_loss`: no gate over actions or responses (each token is
    judged alone), a ratio threshold below 1 instead of "any loss", and a mean over the preserving set
    instead of over the whole batch. With ``threshold = 1`` it is LLDS's token gate up to that denominator.

    Args:
        logp: ``(B, T)`` log-probabilities of the taken tokens under the policy being trained.
        logp_old: ``(B, T)`` the same under the rollout policy (a constant).
        advantages: ``(B,)`` per-response advantages.
        loss_mask: ``(B, T)`` 1 on policy tokens.
        threshold: ``t`` in ``(0, 1]``: a token is penalised once ``r <= t``.
        num_tokens: Denominator override (default: the policy tokens of the ``A >= 0`` responses; a
            mini-batch split into micro-batches passes the whole mini-batch's count).

    Returns:
        ``(loss, metrics)`` with ``sapo_loss`` and ``sapo_frac`` (tokens at or below the threshold, over
        ``N_+``).

    Raises:
        ConfigError: ``threshold`` is outside ``(0, 1]`` or ``advantages`` is not ``(B,)``.
    """
    if not 0 < threshold <= 1:
        raise ConfigError(f"SAPO threshold must be in (0, 1], got {threshold}")
    if advantages.dim() != 1:
        raise ConfigError(
            f"sapo_loss needs per-response advantages of shape (B,), got {tuple(advantages.shape)}"
        )
    positive = (advantages >= 0)[:, None] & as_bool(loss_mask)
    d = torch.where(positive, logp_old.detach() - logp, 0.0)
    low = positive & (d.detach() >= -math.log(threshold))
    denominator = _count(positive, num_tokens)
    loss = masked_mean(d, low, num_tokens=_float(denominator))
    return loss, {"sapo_loss": _float(loss), "sapo_frac": float(low.sum()) / _float(denominator)}


# -- the total -----------------------------------------------------------------------------------------


def grpo_llds_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    loss: GRPOLossConfig = DEFAULT_LOSS,
    llds: LLDSConfig = DEFAULT_LLDS,
    *,
    llds_weights: Tensor | None = None,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
    num_tokens: float | None = None,
    sapo_tokens: float | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """``L = L_GRPO + lambda * L_LLDS + sapo_coef * L_SAPO + kl_coef * KL(pi || ref) - entropy_coef * H``.

    The weights and caps are ``loss``'s (default: clip 0.2, KL 0.001, the reference code's caps: ratio 100,
    k3 value 10; SAPO off) and LLDS's are ``llds``'s (default: lambda 0.2, the action gate). A term whose
    coefficient is 0, or whose input (``ref_logp``, ``entropy``) is missing, is skipped.

    Args:
        logp: ``(B, T)`` log-probabilities of the taken tokens under the policy being trained.
        logp_old: ``(B, T)`` the same under the rollout policy.
        advantages: ``(B,)`` per-response advantages.
        loss_mask: ``(B, T)`` 1 on policy tokens.
        loss: The loss section: clip range, ratio and k3 caps (:func:`policy_loss`, :func:`k3_kl`), KL and
            entropy weights, SAPO's weight and threshold (:func:`sapo_loss`).
        llds: LLDS's section: lambda and the gate (see :func:`llds_loss`); no LLDS term unless
            ``llds.enabled``.
        llds_weights: ``(B, T)`` LLDS per-token weights (LLDS-MA), default 1.
        ref_logp: ``(B, T)`` log-probabilities under the frozen reference, or ``None``.
        entropy: ``(B, T)`` per-token entropies of the policy, or ``None``.
        num_tokens: Token-mean denominator override for every term.
        sapo_tokens: SAPO's denominator override (the ``A >= 0`` policy tokens of the whole mini-batch).
        is_weights: ``(B, T)`` the policy-gradient term's per-token weights (:func:`policy_loss`).

    Returns:
        ``(loss, metrics)``: the metrics of every active term, plus ``loss`` and ``cap_frac`` (fraction of
        policy tokens at the ratio cap or the k3 cap).
    """
    total, metrics = policy_loss(
        logp,
        logp_old,
        advantages,
        loss_mask,
        loss.clip_eps,
        num_tokens=num_tokens,
        ratio_cap=loss.ratio_cap,
        is_weights=is_weights,
    )
    if llds.gate is not None and llds.coef:
        term, m = llds_loss(logp, logp_old, advantages, loss_mask, llds.gate, llds_weights, num_tokens)
        total = total + llds.coef * term
        metrics.update(m)
    if loss.sapo_coef:
        sapo, m = sapo_loss(logp, logp_old, advantages, loss_mask, loss.sapo_threshold, sapo_tokens)
        total = total + loss.sapo_coef * sapo
        metrics.update(m)
    if loss.kl_coef and ref_logp is not None:
        kl, m = kl_penalty(logp, ref_logp, loss_mask, num_tokens, loss.kl_value_cap)
        total = total + loss.kl_coef * kl
        metrics.update(m)
        with torch.no_grad():
            mask = as_bool(loss_mask)
            raw = torch.where(mask, logp - logp_old.detach(), 0.0)
            k3 = k3_kl(torch.where(mask, logp, 0.0), torch.where(mask, ref_logp, 0.0), loss.kl_value_cap)
            either = ((raw > math.log(loss.ratio_cap)) | (k3 >= loss.kl_value_cap)) & mask
            metrics["cap_frac"] = _float(masked_mean(either.float(), mask))
    else:
        metrics["cap_frac"] = metrics["ratio_cap_frac"]
    if entropy is not None:
        h, m = entropy_bonus(entropy, loss_mask, num_tokens)
        total = total - loss.entropy_coef * h
        metrics.update(m)
    metrics["loss"] = _float(total)
    return total, metrics
