"""Per-token log-probabilities (and entropies) of given sequences, with gradients: what a trainer recomputes
for the ratio ``pi_theta / pi_old``.

:func:`token_logprobs` is the entry point. Its kernels: the output layer's log-softmax and entropy fused
into one autograd function with a hand-written backward (:class:`_PickedLogProb`), the output layer run on
the scored positions only, and a prefix every row shares read once (:func:`_hidden_states`).
:class:`ScoringOptions` chooses between these and the plain reference paths. Every distribution is over
the tokenizer's real vocabulary only (:func:`_scaled_logits`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from searchgym.errors import ConfigError

from .model import ModelIO, cache_of, output_size, select_rows
from .prefix_groups import prefix_levels

__all__ = ["DEFAULT_SCORING", "ScoringOptions", "token_logprobs"]


def score_dtype(t: Tensor) -> torch.dtype:
    """The dtype log-probabilities are computed and kept in: float32, or float64 for a float64 model (whose
    runs must not round to float32 anywhere on the way to a sample: see ``tests/agents/grpo/test_grpo_numerics.py``)."""
    return torch.promote_types(t.dtype, torch.float32)


def _scaled_logits(logits: Tensor, vocab_size: int, temperature: float) -> Tensor:
    # Dropping the ids beyond the real vocabulary is the same as setting their logits to -inf, and cheaper.
    z = logits[..., :vocab_size].to(score_dtype(logits))
    return z if temperature == 1.0 else z / temperature


def vocab_log_probs(logits: Tensor, vocab_size: int, temperature: float) -> Tensor:
    return torch.log_softmax(_scaled_logits(logits, vocab_size, temperature), dim=-1)


class _PickedLogProb(torch.autograd.Function):
    """``log softmax(z)[target]`` and the entropy of ``softmax(z)``, row by row, with a hand-written backward.

    Autograd through ``log_softmax``, ``exp`` and the entropy's product keeps several vocabulary-wide
    tensors and makes about ten passes over them backwards; the output layer's softmax is most of a small
    model's element-wise work. Here the forward keeps ``t = log_softmax(z)`` and ``p = exp(t)`` and the
    backward is two passes. With ``H = -sum(p * t)``::

        d t[y] / d z = onehot(y) - p          d H / d z = -p * (t + H)

    so ``dL/dz = onehot(y) * g_y - p * (g_y + g_H * H + g_H * t)``. The picked log-probs are bit for bit
    :func:`_picked_logprobs_reference`'s; the entropies and the gradients agree to float rounding (tested,
    and the backward checked against finite differences in float64).
    """

    @staticmethod
    def forward(ctx: Any, z: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        t = torch.log_softmax(z, dim=-1)
        p = t.exp()
        entropy = -torch.linalg.vecdot(p, t)
        ctx.save_for_backward(t, p, entropy, target)
        return t.gather(-1, target.unsqueeze(-1)).squeeze(-1), entropy

    @staticmethod
    def backward(ctx: Any, g_picked: Tensor, g_entropy: Tensor) -> tuple[Tensor, None]:
        t, p, entropy, target = ctx.saved_tensors
        g_y, g_h = g_picked.unsqueeze(-1), g_entropy.unsqueeze(-1)
        grad = torch.addcmul(-(g_y + g_h * entropy.unsqueeze(-1)), t, g_h, value=-1).mul_(p)
        return grad.scatter_add_(-1, target.unsqueeze(-1), g_y), None


def _picked_logprobs(
    logits: Tensor, target: Tensor, vocab_size: int, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """``log p(target)`` under ``logits`` (over the first ``vocab_size`` ids, at ``temperature``) and, if
    asked, the distribution's entropy. ``target`` must lie below ``vocab_size``. The picked log-prob is
    the same bits with or without gradients (``pi_old`` may come from either)."""
    z = _scaled_logits(logits, vocab_size, temperature)
    if with_entropy and torch.is_grad_enabled() and z.requires_grad:
        picked, entropy = _PickedLogProb.apply(z, target)
        return picked, entropy
    t = torch.log_softmax(z, dim=-1)
    picked = t.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return picked, -torch.linalg.vecdot(t.exp(), t) if with_entropy else None


def _picked_logprobs_reference(
    logits: Tensor, target: Tensor, vocab_size: int, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """:func:`_picked_logprobs` by plain autograd through ``log_softmax``: the test oracle, and the reference
    update path (``searchgym bench update``'s *before*)."""
    logp = vocab_log_probs(logits, vocab_size, temperature)
    picked = logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return picked, -(logp.exp() * logp).sum(-1) if with_entropy else None


@dataclass(frozen=True)
class ScoringOptions:
    """How log-probabilities are computed. The defaults are the fast path; the other values give the
    reference paths that ``searchgym bench update`` times as its *before*, and that tests compare against.

    Attributes:
        fused: The output layer's log-softmax and entropy through the fused autograd function with its
            hand-written backward (``False``: plain autograd through ``log_softmax``).
        shared_prefix_min: :func:`token_logprobs` with a ``score_mask`` reads a prefix every row shares
            once when it is at least this long (0: never; each row reads it) and saves at least
            :data:`_SHARED_PREFIX_SAVING` of the batch's token slots (else a second forward call is not
            worth it).
        group_prefixes: :func:`token_logprobs` with a ``score_mask`` finds groups of rows that share a
            prefix of at least ``shared_prefix_min`` tokens (a GRPO group's prompt and question, and the
            turns its responses have in common) and reads each group's prefix once
            (:func:`_grouped_hidden`), when that saves at least :data:`_SHARED_PREFIX_SAVING` of the batch's
            token slots (``False``: only a prefix every row shares is read once).
        inference_mode: Gradient-free scoring (a trainer's ``pi_old``, reference and diagnostics) runs
            under ``torch.inference_mode`` (``False``: ``torch.no_grad``). See :meth:`no_grad`.
        autocast_bf16: The model's matrix products run in bfloat16 under ``torch.autocast`` (the weights
            stay as they are, float32 for a trainer); the output layer's log-softmax, the picked log-probs
            and the entropies are computed in float32 from the logits whatever this says. See
            :meth:`autocast`.
    """

    fused: bool = True
    shared_prefix_min: int = 16
    group_prefixes: bool = False
    inference_mode: bool = True
    autocast_bf16: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.shared_prefix_min, bool) or self.shared_prefix_min < 0:
            raise ConfigError(f"shared_prefix_min must be an integer >= 0, got {self.shared_prefix_min!r}")

    def pick(
        self, logits: Tensor, target: Tensor, vocab_size: int, temperature: float, with_entropy: bool
    ) -> tuple[Tensor, Tensor | None]:
        """``log p(target)`` (and the entropy, if asked) by the chosen output-layer path."""
        fn = _picked_logprobs if self.fused else _picked_logprobs_reference
        return fn(logits, target, vocab_size, temperature, with_entropy)

    def no_grad(self) -> Any:
        """The context manager of gradient-free scoring: ``torch.inference_mode()`` or ``torch.no_grad()``."""
        return torch.inference_mode() if self.inference_mode else torch.no_grad()

    def autocast(self, device: torch.device | str) -> Any:
        """The context manager of the model's forward: bfloat16 autocast on ``device``'s type with
        ``autocast_bf16``, else nothing."""
        if not self.autocast_bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


DEFAULT_SCORING = ScoringOptions()
"""The options every scoring call takes unless given others: fused, shared prefixes read once."""


def token_logprobs(
    model: Any,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    vocab_size: int | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    score_mask: Tensor | None = None,
    scoring: ScoringOptions = DEFAULT_SCORING,
) -> tuple[Tensor, Tensor | None]:
    """Log-probability of every token given its prefix, under ``model`` (differentiable).

    Padding may be on either side: positions come from the attention mask, as during generation, so the
    values match those :meth:`LLMPolicy.generate_segments` returned for the same tokens.

    Args:
        model: A causal LM.
        input_ids: ``(B, T)`` token ids.
        attention_mask: ``(B, T)`` 1 on real tokens, 0 on padding.
        vocab_size: The tokenizer's real vocabulary size (distributions are over these ids only);
            default the model's output size.
        temperature: The sampling temperature the tokens were drawn with (logits are divided by it).
        with_entropy: Also return the entropy of each position's predictive distribution.
        score_mask: ``(B, T)`` bool: score only these tokens (others hold 0). The output layer then runs on
            the selected positions only, which is most of the cost when the vocabulary is large and few
            tokens count (a trainer's policy tokens). Needs a model with ``base_model`` and output
            embeddings (every ``transformers`` causal LM without logit post-processing).
        scoring: How the output layer and shared prefixes are computed (:class:`ScoringOptions`).

    Returns:
        ``(logp, entropy)``: ``(B, T)`` float32 each (``entropy`` is ``None`` unless requested). Position
        ``t`` holds ``log p(x_t | x_<t)`` and the entropy of that distribution; each sequence's first token, padding,
        and ids outside the vocabulary hold 0.
    """
    vocab = vocab_size if vocab_size is not None else output_size(model)
    mask = attention_mask.to(torch.long)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    if score_mask is not None:
        return _selected_logprobs(
            model, input_ids, mask, positions, score_mask, vocab, temperature, with_entropy, scoring
        )
    with scoring.autocast(input_ids.device):
        logits = model(
            input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=False
        ).logits
    target = input_ids[:, 1:]
    # A token is scored when it and its predecessor are real: the first real token has no prefix.
    real = mask[:, 1:].bool() & mask[:, :-1].bool()
    valid = real & (target < vocab)
    picked, ent_inner = scoring.pick(
        logits[:, :-1], torch.where(valid, target, 0), vocab, temperature, with_entropy
    )
    logp = torch.zeros(input_ids.shape, dtype=picked.dtype, device=input_ids.device)
    logp[:, 1:] = torch.where(valid, picked, 0.0)
    if ent_inner is None:
        return logp, None
    entropy = torch.zeros_like(logp)
    entropy[:, 1:] = torch.where(real, ent_inner, 0.0)
    return logp, entropy


#: A prefix every row shares is read once by :func:`_hidden_states` only if that saves at least this share
#: of the batch's token slots (and it is at least :attr:`ScoringOptions.shared_prefix_min` long).
_SHARED_PREFIX_SAVING = 0.05


def _shared_prefix(input_ids: Tensor, mask: Tensor) -> int:
    """How many leading tokens every row has, identical and real (0 for a single row)."""
    if input_ids.shape[0] < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(dim=0) & mask.bool().all(dim=0)
    return int(same.long().cumprod(dim=0).sum())


def _outputs(out: Any) -> tuple[Tensor, Any]:
    """The last hidden states and the cache of a base model's output (any ``transformers`` version)."""
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    return hidden, cache_of(out)


def _checkpointing(model: Any) -> bool:
    flag = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5.x's name
    return bool(flag if flag is not None else getattr(model, "is_gradient_checkpointing", False))


def _hidden_states(
    base: Any, input_ids: Tensor, mask: Tensor, positions: Tensor, shared_prefix_min: int
) -> Tensor:
    """``(B, T, H)`` last hidden states of right-padded rows, differentiable.

    When the rows start with the same tokens (a GRPO group's prompt, or a shared instruction template), that
    prefix is read once, for one row, and its keys and values are repeated for every row through the KV
    cache: the prefix's work is not done ``B`` times, and its gradient is the sum over the rows, as autograd
    takes it through the repeat. The result equals one forward over the whole batch up to float rounding
    (tested, gradients included). Models without a row-selectable cache, or with gradient checkpointing,
    take the whole batch in one forward, and so does a prefix shorter than ``shared_prefix_min`` (0: always).
    """
    prefix = _shared_prefix(input_ids, mask)
    rows, width = input_ids.shape
    shareable = (
        shared_prefix_min
        and shared_prefix_min <= prefix < width
        and prefix * (rows - 1) >= _SHARED_PREFIX_SAVING * rows * width
        and not _checkpointing(base)
    )
    if shareable:
        cache_kw = ModelIO(base).cache_kw
        head, cache = _outputs(
            base(input_ids=input_ids[:1, :prefix], position_ids=positions[:1, :prefix], use_cache=True)
        )
        index = torch.zeros(rows, dtype=torch.long, device=input_ids.device)
        cache = select_rows(cache, index) if cache is not None else None
        if cache is not None:
            tail, _ = _outputs(
                base(
                    input_ids=input_ids[:, prefix:],
                    attention_mask=mask,
                    position_ids=positions[:, prefix:],
                    use_cache=True,
                    **{cache_kw: cache},
                )
            )
            return torch.cat([head.expand(rows, -1, -1), tail], dim=1)
    hidden, _ = _outputs(
        base(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=False)
    )
    return hidden


#: What one more forward call costs :func:`_grouped_hidden`, in token slots (a CPU's; see
#: :func:`searchgym.agents.grpo.batching.call_overhead_tokens`).
_CALL_SLOTS = 256.0


def _grouped_hidden(
    base: Any, input_ids: Tensor, mask: Tensor, select: Tensor, min_prefix: int
) -> Tensor | None:
    """``(N, H)`` last hidden states at the ``N`` positions ``t`` where ``select[b, t]`` (row-major order, as
    ``hidden[:, :-1][select]``), differentiable; ``None`` where this path does not apply.

    The columns are cut into levels (:func:`prefix_levels`): level ``i`` reads columns
    ``[c_{i-1}, c_i)`` once per distinct prefix ``x[:c_i]`` (the prompt's template once for the batch, then
    each group's question and shared turns once for the group), attending to the keys and values of the
    levels before, repeated to its rows through the KV cache; a last forward reads every row's columns
    from ``c_k`` on. A selected position takes the hidden state of the level (and distinct prefix) that
    read it. Gradients reach a prefix through the repeats (the sum over the rows that share it), so the
    result and its gradients equal one forward over the whole batch up to float rounding (tested).
    ``None`` for rows that are not right-padded, for a model with gradient checkpointing or without a
    row-selectable cache, and when the levels would not save :data:`_SHARED_PREFIX_SAVING` of the batch's
    token slots.
    """
    rows, width = input_ids.shape
    lengths = mask.sum(dim=1)
    columns = torch.arange(width, device=input_ids.device)
    if not bool((mask.bool() == (columns < lengths[:, None])).all()) or _checkpointing(base):
        return None
    plan = prefix_levels(input_ids, lengths, min_prefix, _CALL_SLOTS)
    if plan is None or plan.slots(width) > (1 - _SHARED_PREFIX_SAVING) * rows * width:
        return None
    cache_kw = ModelIO(base).cache_kw
    cache: Any = None
    hidden: list[Tensor] = []
    offsets: list[int] = []  # where each level's (and the tail's) flattened hidden states start
    start, offset = 0, 0
    for level, (cut, first) in enumerate(zip(plan.cuts, plan.first, strict=True)):
        if level:
            cache = select_rows(cache, plan.parent(level))
            if cache is None:
                return None
        out, cache = _outputs(
            base(
                input_ids=input_ids[first, start:cut],
                position_ids=columns[start:cut].expand(len(first), -1),
                use_cache=True,
                **({cache_kw: cache} if level else {}),
            )
        )
        if cache is None:
            return None
        hidden.append(out.reshape(-1, out.shape[-1]))
        offsets.append(offset)
        offset += out.shape[0] * out.shape[1]
        start = cut
    cache = select_rows(cache, plan.owner[-1])
    if cache is None:
        return None
    tail, _ = _outputs(
        base(
            input_ids=input_ids[:, start:],
            attention_mask=mask,
            position_ids=columns[start:].expand(rows, -1),
            use_cache=True,
            **{cache_kw: cache},
        )
    )
    hidden.append(tail.reshape(-1, tail.shape[-1]))
    offsets.append(offset)
    # Each selected (row, t): the level that read column t, and the row of that level holding its prefix.
    row, t = select.nonzero(as_tuple=True)
    bounds = torch.tensor([0, *plan.cuts], device=input_ids.device)
    read_by = torch.bucketize(t, bounds[1:], right=True)  # the level, 0 … k (k: the tail)
    flat = torch.empty_like(t)
    for i in range(len(plan.cuts) + 1):
        at = read_by == i
        lo = int(bounds[i])
        if i < len(plan.cuts):
            span = plan.cuts[i] - lo
            which = plan.owner[i][row[at]]
        else:
            span, which = width - lo, row[at]
        flat[at] = offsets[i] + which * span + (t[at] - lo)
    return torch.cat(hidden).index_select(0, flat)


def _selected_logprobs(
    model: Any,
    input_ids: Tensor,
    mask: Tensor,
    positions: Tensor,
    score_mask: Tensor,
    vocab: int,
    temperature: float,
    with_entropy: bool,
    scoring: ScoringOptions,
) -> tuple[Tensor, Tensor | None]:
    """:func:`token_logprobs` restricted to ``score_mask``: the output layer runs on those positions only."""
    # Token t is predicted from the hidden state at t - 1; the first token has no prefix.
    real = mask[:, 1:].bool() & mask[:, :-1].bool() & score_mask[:, 1:].bool()
    target = input_ids[:, 1:]
    valid = real & (target < vocab)
    with scoring.autocast(input_ids.device):
        hidden = None
        if scoring.group_prefixes and scoring.shared_prefix_min:
            hidden = _grouped_hidden(model.base_model, input_ids, mask, real, scoring.shared_prefix_min)
        if hidden is None:
            hidden = _hidden_states(model.base_model, input_ids, mask, positions, scoring.shared_prefix_min)
            hidden = hidden[:, :-1][real]
        logits = model.get_output_embeddings()(hidden)
    picked, ent_sel = scoring.pick(
        logits, torch.where(valid, target, 0)[real], vocab, temperature, with_entropy
    )
    logp = torch.zeros(input_ids.shape, dtype=picked.dtype, device=input_ids.device)
    inner = torch.zeros(real.shape, dtype=picked.dtype, device=input_ids.device)
    inner = inner.masked_scatter(real, torch.where(valid[real], picked, 0.0))
    logp = torch.cat([logp[:, :1], inner], dim=1)
    if ent_sel is None:
        return logp, None
    ent = torch.zeros(real.shape, dtype=ent_sel.dtype, device=input_ids.device)
    ent = ent.masked_scatter(real, ent_sel)
    return logp, torch.cat([torch.zeros_like(logp[:, :1]), ent], dim=1)
