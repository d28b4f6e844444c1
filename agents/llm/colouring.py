"""Per-token log-probabilities of finished transcripts under a policy, for ``searchgym view``'s colouring."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from searchgym.errors import ConfigError

from .policy import LLMPolicy

__all__ = ["sequence_logprobs"]


def sequence_logprobs(
    policy: LLMPolicy,
    sequences: Sequence[Sequence[int]],
    masks: Sequence[Sequence[bool]],
    *,
    batch_size: int = 8,
) -> list[np.ndarray]:
    """``log p(x_t | x_<t)`` of the masked tokens of each sequence under ``policy`` (its model, vocabulary and
    temperature): :meth:`LLMPolicy.token_logprobs` over right-padded batches, without gradients.

    Args:
        policy: The scoring policy.
        sequences: Token ids of each transcript (prompt, policy and tool tokens).
        masks: One flag per token of each sequence: score it (the policy's tokens).
        batch_size: Sequences scored together.

    Returns:
        For each sequence, ``(len,)`` float32: the log-probability of every masked token, 0 elsewhere (and on
        a sequence's first token, which has no prefix).

    Raises:
        ConfigError: a mask's length differs from its sequence's, a sequence is longer than the model's
            positions, or ``batch_size`` < 1.
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if len(masks) != len(sequences) or any(len(m) != len(s) for s, m in zip(sequences, masks, strict=False)):
        raise ConfigError("every sequence needs one mask flag per token")
    limit = getattr(getattr(policy.model, "config", None), "max_position_embeddings", None)
    longest = max((len(s) for s in sequences), default=0)
    if isinstance(limit, int) and longest > limit:
        raise ConfigError(f"a transcript of {longest} tokens is longer than the model's {limit} positions")
    out: list[np.ndarray] = []
    device = policy.device
    with policy.scoring.no_grad():
        for start in range(0, len(sequences), batch_size):
            rows = sequences[start : start + batch_size]
            width = max((len(r) for r in rows), default=0)
            if width == 0:
                out.extend(np.zeros(0, dtype=np.float32) for _ in rows)
                continue
            ids = torch.full((len(rows), width), policy.tokenizer.pad_token_id, dtype=torch.long)
            attention = torch.zeros((len(rows), width), dtype=torch.long)
            score = torch.zeros((len(rows), width), dtype=torch.bool)
            for i, (row, mask) in enumerate(zip(rows, masks[start : start + batch_size], strict=True)):
                ids[i, : len(row)] = torch.as_tensor(list(row), dtype=torch.long)
                attention[i, : len(row)] = 1
                score[i, : len(row)] = torch.as_tensor(list(mask), dtype=torch.bool)
            logp, _ = policy.token_logprobs(ids.to(device), attention.to(device), score_mask=score.to(device))
            values = logp.float().cpu().numpy()
            out.extend(values[i, : len(row)].copy() for i, row in enumerate(rows))
    return out
