"""The per-token values ``searchgym view`` colours a policy's tokens by: each segment's ids, the text each
token adds, and one value per policy token from each row of scores (log-probabilities under a checkpoint, or
the rollout's own)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from searchgym.app.view.page import Episode, SourceName

if TYPE_CHECKING:
    import numpy as np

    from searchgym.tokenization import Tokenizer

__all__ = ["policy_token_values", "segment_ids", "token_pieces"]


def segment_ids(episode: Episode, tokenizer: Tokenizer) -> list[tuple[SourceName, list[int]]]:
    """Each segment's source and token ids: the record's own ids when it holds them, else its text encoded
    segment by segment, as the environment encodes the prompt and each tool observation.

    A sampled policy may have written a turn's text with other ids than its encoding; the ids of an
    export-trajectories row are the sampled ones.
    """
    return [
        (s.source, list(s.ids) if s.ids is not None else tokenizer.encode(s.text)) for s in episode.segments
    ]


def token_pieces(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    """The text each token adds. A character split over several tokens is shown with the token that
    completes it (the earlier ones add ``""``); bytes left incomplete at the end become U+FFFD."""
    pieces: list[str] = []
    pending = b""
    for i in ids:
        pending += tokenizer.token_bytes[int(i)]
        try:
            pieces.append(pending.decode("utf-8"))
            pending = b""
        except UnicodeDecodeError:
            pieces.append("")
    if pending:
        pieces[-1] += pending.decode("utf-8", errors="replace")
    return pieces


def policy_token_values(
    tokenizer: Tokenizer,
    segments: Sequence[tuple[SourceName, Sequence[int]]],
    *rows: Sequence[float] | np.ndarray,
) -> list[list[list[Any]]]:
    """For each policy segment, its tokens as ``[piece, value, …]``: one value from each row.

    Args:
        tokenizer: Gives each token's text (:func:`token_pieces`).
        segments: Each segment's source and ids (:func:`segment_ids`).
        rows: Per-token values over the whole episode (all segments' ids, concatenated), e.g. the
            log-probabilities under one checkpoint, then under another. They are kept to 5 decimals.
    """
    out: list[list[list[Any]]] = []
    at = 0
    for source, ids in segments:
        if source == "policy":
            pieces = token_pieces(tokenizer, ids)
            out.append([[piece, *(_rounded(row[at + k]) for row in rows)] for k, piece in enumerate(pieces)])
        at += len(ids)
    return out


def _rounded(value: float) -> float | None:
    """A token's value as the page stores it: 5 decimals (the tooltip shows 3), ``None`` if not finite."""
    value = float(value)
    return round(value, 5) if math.isfinite(value) else None
