"""The KV cache a policy keeps between turns, and how a batch of contexts is read into a cache.

A batch of contexts is left-padded into one forward (identical contexts, such as the prompt a GRPO group
shares, read once and their cache rows repeated). With a :class:`Session` kept from the previous turn,
contexts that extend its rows feed only their new tokens, right-aligned in one chunk whose padding is
masked out, each token's position counted as in a fresh forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .model import ModelIO, select_rows

Prefilled = tuple[Tensor, Any, Tensor]
"""``(logits, cache, mask)``: each row's last-position logits ``(B, V_model)``, the KV cache, and the
attention mask ``(B, T)`` of what the cache holds (padding 0)."""


@dataclass
class Session:
    """A KV cache kept between turns: row ``r`` holds ``tokens[r]`` in the columns where ``mask[r]`` is 1."""

    cache: Any
    mask: Tensor
    tokens: list[list[int]]
    version: tuple[tuple[int, int], ...]


def parameter_version(model: Any) -> tuple[tuple[int, int], ...]:
    """Changes whenever a parameter is modified in place (an optimizer step, ``load_state_dict``) or
    replaced: a cache computed before is then stale."""
    return tuple((id(p), p._version) for p in model.parameters())


class Prefill:
    """Reads a batch of contexts into a KV cache, reusing a kept :class:`Session` where it applies.

    Args:
        io: The model's keyword names (:class:`ModelIO`).
        pad_token_id: The id written into padding (masked out of attention).
    """

    def __init__(self, io: ModelIO, pad_token_id: int) -> None:
        self.io = io
        self.pad_token_id = pad_token_id
        self.rows_selectable = True  # becomes False for a model whose cache rows cannot be selected
        self.share_extensions = True  # equal contexts' extensions read once (False: the benchmarks' before)

    def __call__(self, model: Any, session: Session | None, contexts: list[list[int]]) -> Prefilled:
        """Extends ``session`` when every context extends one of its rows by at least one token; else reads
        the contexts whole. ``session``'s cache is consumed (updated in place) either way."""
        rows = self.match(model, session, contexts) if session is not None else None
        extended = self.extend(model, session, rows, contexts) if session is not None and rows else None
        return extended if extended is not None else self.whole(model, contexts)

    def whole(self, model: Any, contexts: list[list[int]]) -> Prefilled:
        """Reads the contexts whole (each distinct one once); returns last logits, cache and mask per row."""
        unique: dict[tuple[int, ...], int] = {}
        inverse = [unique.setdefault(tuple(c), len(unique)) for c in contexts]
        if len(unique) < len(contexts) and self.rows_selectable:
            logits, cache, mask = self.left_padded(model, [list(c) for c in unique])
            index = torch.tensor(inverse, device=mask.device)
            selected = select_rows(cache, index)
            if selected is not None:
                return logits[index], selected, mask[index]
            self.rows_selectable = False
        return self.left_padded(model, contexts)

    def left_padded(self, model: Any, contexts: list[list[int]]) -> Prefilled:
        """One forward over the contexts, left-padded to the longest."""
        device = next(model.parameters()).device
        width = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(contexts), width), dtype=torch.long)
        for i, context in enumerate(contexts):
            ids[i, width - len(context) :] = torch.as_tensor(context, dtype=torch.long)
            mask[i, width - len(context) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        logits, cache = self.io.forward(
            model, None, True, input_ids=ids, attention_mask=mask, position_ids=positions
        )
        return logits, cache, mask

    def match(self, model: Any, session: Session, contexts: list[list[int]]) -> list[int] | None:
        """For each context, the session row it extends by at least one token (``None`` if one extends none)."""
        if session.version != parameter_version(model) or not self.rows_selectable:
            return None
        held = session.tokens
        rows: list[int] = []
        start = 0
        for context in contexts:
            # Active episodes keep their order from turn to turn: look after the last match first.
            order = [*range(start, len(held)), *range(start)]
            row = next(
                (r for r in order if len(held[r]) < len(context) and context[: len(held[r])] == held[r]), None
            )
            if row is None:
                return None
            rows.append(row)
            start = row + 1
        return rows

    def extend(
        self, model: Any, session: Session, rows: list[int], contexts: list[list[int]]
    ) -> Prefilled | None:
        """Feeds each context's tokens beyond its cached row, right-aligned in one chunk (padding masked); each
        distinct context once (a GRPO group's responses that searched alike get the same tool output: their
        contexts are equal again), its cache rows then repeated for the equal contexts."""
        unique: dict[tuple[int, ...], int] = {}
        inverse = [unique.setdefault(tuple(c), len(unique)) for c in contexts]
        if len(unique) == len(contexts) or not self.share_extensions:
            return self._extend(model, session, rows, contexts)
        first = {u: i for i, u in reversed(list(enumerate(inverse)))}  # each distinct context's first row
        picked = [first[u] for u in range(len(unique))]
        out = self._extend(model, session, [rows[i] for i in picked], [contexts[i] for i in picked])
        if out is None:
            return None
        logits, cache, mask = out
        index = torch.tensor(inverse, device=mask.device)
        selected = select_rows(cache, index)
        return None if selected is None else (logits[index], selected, mask[index])

    def _extend(
        self, model: Any, session: Session, rows: list[int], contexts: list[list[int]]
    ) -> Prefilled | None:
        device = session.mask.device
        index = torch.tensor(rows, device=device)
        cache = select_rows(session.cache, index)
        if cache is None:
            self.rows_selectable = False
            return None
        mask = session.mask[index]
        new = [c[len(session.tokens[r]) :] for c, r in zip(contexts, rows, strict=True)]
        width = max(len(n) for n in new)
        ids = torch.full((len(new), width), self.pad_token_id, dtype=torch.long)
        chunk = torch.zeros((len(new), width), dtype=torch.long)
        positions = torch.zeros((len(new), width), dtype=torch.long)
        for i, (tokens, row) in enumerate(zip(new, rows, strict=True)):
            n, start = len(tokens), len(session.tokens[row])
            ids[i, width - n :] = torch.as_tensor(tokens, dtype=torch.long)
            chunk[i, width - n :] = 1
            positions[i, width - n :] = torch.arange(start, start + n)
            positions[i, : width - n] = start  # padding: masked out; any position will do
        mask = torch.cat([mask, chunk.to(device)], dim=1)
        logits, cache = self.io.forward(
            model,
            cache,
            True,
            input_ids=ids.to(device),
            attention_mask=mask,
            position_ids=positions.to(device),
        )
        return logits, cache, mask
