"""Drawing the next token: greedy, tempered and nucleus (top-p) sampling in one place, by inverse CDF."""

from __future__ import annotations

import torch
from torch import Tensor

from .scoring import vocab_log_probs

__all__ = ["sample_tokens"]


def sample_tokens(
    logits: Tensor,
    vocab_size: int,
    *,
    temperature: float = 1.0,
    greedy: bool = False,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Draws one id per row of ``logits``: greedy, tempered, and nucleus (top-p) sampling in one place.

    Sampling inverts the cumulative distribution: one uniform draw per row, located with ``searchsorted`` in
    the row's cumulative probabilities. That is the same categorical distribution ``torch.multinomial``
    samples, at a fraction of its cost (it needs one random number per row, not a pass that normalises and
    draws over the whole vocabulary). An id of probability 0 is never drawn: the search returns the first
    index whose cumulative sum exceeds the draw, and a zero-probability id never raises the sum.

    Args:
        logits: ``(B, V_model)`` next-token logits (any float dtype).
        vocab_size: Only ids below it are ever drawn (the tokenizer's real vocabulary).
        temperature: Logits are divided by it (> 0).
        greedy: Take the most likely id (``temperature`` and ``top_p`` then play no part in the choice).
        top_p: Nucleus sampling: draw from the smallest set of most likely ids whose probability reaches
            ``top_p`` (1.0: the whole distribution).
        generator: The random generator (on ``logits``' device); default torch's global one.

    Returns:
        ``(ids, logp)``: ``(B,)`` int64 ids and ``(B,)`` float32 ``log p(id)`` under the tempered distribution
        over the whole vocabulary, the quantity :func:`token_logprobs` recomputes (with ``top_p < 1`` the
        draw comes from the truncated distribution, so these are not the behaviour policy's exact
        probabilities).
    """
    logp = vocab_log_probs(logits, vocab_size, temperature)
    if greedy:
        ids = logp.argmax(dim=-1)
    else:
        probs = logp.exp()
        order: Tensor | None = None
        if top_p < 1.0:
            probs, order = probs.sort(dim=-1, descending=True)
            # Keep an id when the mass before it is below top_p (the most likely id is always kept).
            before = probs.cumsum(dim=-1) - probs
            probs = torch.where(before < top_p, probs, 0.0)
        cdf = probs.cumsum(dim=-1)
        u = torch.rand((logp.shape[0], 1), generator=generator, device=logp.device) * cdf[:, -1:]
        ids = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=logp.shape[-1] - 1)
        if order is not None:
            ids = order.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return ids, logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
