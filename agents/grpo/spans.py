"""Where each kind of action sits in a transcript: masks found on the transcript's bytes with the
environment's own action rule (the first ``<search>…</search>`` or ``<answer>…</answer>`` pair of a turn
decides what the turn is). LLDS-MA weights the final answer span; the probe set is scored per action kind.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
from torch import Tensor

from searchgym.protocol import ACTION_PATTERN, Source

from .losses import action_ids, adaptive_answer_weight, answer_weights

__all__ = [
    "PROBE_ACTIONS",
    "PROTOCOL_TAGS",
    "answer_span_mask",
    "llds_ma_weights",
    "probe_masks",
    "tag_masks",
]

# Same pattern as the environment's parser, on bytes so that offsets map to tokens exactly.
_ACTION_PATTERN_BYTES = re.compile(ACTION_PATTERN.pattern.encode(), re.DOTALL)


def answer_span_mask(tokens: Tensor, sources: Tensor, token_bytes: Sequence[bytes]) -> Tensor:
    """Marks the tokens of the final ``<answer> … </answer>`` span of each response, tags included.

    The span is looked for in the last action (the last run of policy tokens) only, with the
    environment's own rule: the first ``<search>…</search>`` or ``<answer>…</answer>`` pair of the turn
    decides, on its bytes. A response whose last action is not an answer (turn budget or context limit
    reached) gets no span. A token is in the span when any of its bytes is.

    Args:
        tokens: ``(B, T)`` token ids of the transcripts.
        sources: ``(B, T)`` who wrote each token (``Source``: 2 = policy).
        token_bytes: The tokenizer's bytes of every id (``Tokenizer.token_bytes``).

    Returns:
        ``(B, T)`` bool mask.
    """
    policy = sources == int(Source.POLICY)
    ids = action_ids(policy)
    out = torch.zeros(tokens.shape, dtype=torch.bool)
    tok = tokens.cpu().tolist()
    for b, row in enumerate(ids.cpu()):
        last = int(row.max())
        if last < 0:
            continue
        positions = (row == last).nonzero().flatten().tolist()
        pieces = [token_bytes[tok[b][t]] for t in positions]
        match = _ACTION_PATTERN_BYTES.search(b"".join(pieces))
        if match is None or match.group(1) != b"answer":
            continue
        lo, hi = match.span()
        at = 0
        for t, piece in zip(positions, pieces, strict=True):
            if at < hi and at + len(piece) > lo:
                out[b, t] = True
            at += len(piece)
    return out.to(tokens.device)


PROBE_ACTIONS: tuple[str, ...] = ("first", "search", "answer")
"""The action kinds the probe set is scored by: the first action, search actions, the final answer span."""


def llds_ma_weights(
    tokens: Tensor,
    sources: Tensor,
    token_bytes: Sequence[bytes],
    mean_searches: float,
    beta: float | None = None,
    schedule: str = "code",
) -> tuple[Tensor, float]:
    """LLDS-MA's per-token weights of a batch and the answer weight ``beta`` they use.

    The final answer span (:func:`answer_span_mask`) gets ``beta``, every other token 1; ``beta`` is the
    given one, or the adaptive one from the batch's mean valid searches per episode
    (:func:`~searchgym.agents.grpo.losses.adaptive_answer_weight` with ``schedule``).
    """
    if beta is None:
        beta = adaptive_answer_weight(mean_searches, schedule)
    return answer_weights(answer_span_mask(tokens, sources, token_bytes), beta), beta


def probe_masks(tokens: Tensor, sources: Tensor, token_bytes: Sequence[bytes]) -> dict[str, Tensor]:
    """Per-token masks of the probe set's action kinds (see :data:`PROBE_ACTIONS`), policy tokens only.

    * ``first``: the tokens of each response's first action (its first run of policy tokens);
    * ``search``: the tokens of every action that is a search (``<search>…</search>`` decides the turn);
    * ``answer``: the final ``<answer>…</answer>`` span, tags included (:func:`answer_span_mask`).

    Args:
        tokens: ``(B, T)`` token ids of the transcripts.
        sources: ``(B, T)`` who wrote each token (``Source``).
        token_bytes: The tokenizer's bytes of every id.

    Returns:
        ``{"all": policy mask, "first": …, "search": …, "answer": …}``, each ``(B, T)`` bool.
    """
    policy = sources == int(Source.POLICY)
    ids = action_ids(policy)
    search = torch.zeros_like(policy)
    tok = tokens.cpu().tolist()
    for b, row in enumerate(ids.cpu().tolist()):
        actions: dict[int, list[int]] = {}
        for t, k in enumerate(row):
            if k >= 0:
                actions.setdefault(k, []).append(t)
        for positions in actions.values():
            match = _ACTION_PATTERN_BYTES.search(b"".join(token_bytes[tok[b][t]] for t in positions))
            if match is not None and match.group(1) == b"search":
                search[b, positions] = True
    return {
        "all": policy,
        "first": ids == 0,
        "search": search.to(policy.device),
        "answer": answer_span_mask(tokens, sources, token_bytes),
    }


PROTOCOL_TAGS: dict[str, bytes] = {
    "search_open": b"<search>",
    "search_close": b"</search>",
    "answer_open": b"<answer>",
    "answer_close": b"</answer>",
}
"""The protocol's tags a policy writes, by the name its diagnostics take."""


def tag_masks(
    tokens: Tensor, sources: Tensor, token_bytes: Sequence[bytes], eos_id: int | None
) -> dict[str, Tensor]:
    """The policy tokens that write each protocol tag (:data:`PROTOCOL_TAGS`), and its end-of-sequence token.

    Each action's policy tokens are joined as bytes; a token belongs to a tag when any of its bytes lies in
    one of the tag's occurrences (a tag may take several tokens, or share one with text). ``eos`` marks the
    policy tokens that are ``eos_id``.

    Args:
        tokens: ``(B, T)`` token ids of the transcripts.
        sources: ``(B, T)`` who wrote each token (``Source``).
        token_bytes: The tokenizer's bytes of every id.
        eos_id: The end-of-sequence id (``None``: no ``eos`` mask is all false).

    Returns:
        ``{"search_open": …, "search_close": …, "answer_open": …, "answer_close": …, "eos": …}``, each
        ``(B, T)`` bool.
    """
    policy = sources == int(Source.POLICY)
    ids = action_ids(policy).cpu().tolist()
    out = {name: torch.zeros(tokens.shape, dtype=torch.bool) for name in PROTOCOL_TAGS}
    tok = tokens.cpu().tolist()
    for b, row in enumerate(ids):
        actions: dict[int, list[int]] = {}
        for t, k in enumerate(row):
            if k >= 0:
                actions.setdefault(k, []).append(t)
        for positions in actions.values():
            pieces = [token_bytes[tok[b][t]] for t in positions]
            starts, at = [], 0
            for piece in pieces:
                starts.append(at)
                at += len(piece)
            text = b"".join(pieces)
            for name, tag in PROTOCOL_TAGS.items():
                lo = text.find(tag)
                while lo >= 0:
                    hi = lo + len(tag)
                    for t, start, piece in zip(positions, starts, pieces, strict=True):
                        if start < hi and start + len(piece) > lo:
                            out[name][b, t] = True
                    lo = text.find(tag, hi)
    eos = policy & (tokens == eos_id) if eos_id is not None else torch.zeros_like(policy)
    return {name: mask.to(policy.device) for name, mask in out.items()} | {"eos": eos}
