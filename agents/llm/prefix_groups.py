"""Which leading columns of a scoring batch its rows share, and how to read each shared run once: the plan
of :func:`searchgym.agents.llm.scoring.token_logprobs`'s grouped-prefix path.

The responses of a GRPO group share their prompt and question, and often much more (the same search, so
the same passages); rows of different groups share the prompt's template. :func:`prefix_levels` finds this
without being told which rows belong together. It cuts the columns at a few points ``c_1 < … < c_k``: the
columns ``[c_{i-1}, c_i)`` are read once per distinct prefix ``x[:c_i]`` (a level), and the columns from
``c_k`` on once per row (the tail). Every level is as wide for all its rows, so no level computes padding.
Pure: token ids and lengths in, a :class:`PrefixLevels` out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["PrefixLevels", "prefix_levels"]


@dataclass(frozen=True)
class PrefixLevels:
    """How a batch's rows read their shared prefixes: level ``i`` reads columns ``[cuts[i-1], cuts[i])``
    (from 0 for the first) once for each distinct prefix ``x[:cuts[i]]``, and the tail reads the columns
    from ``cuts[-1]`` on for every row.

    Attributes:
        cuts: The cut columns, increasing; every row has at least one real token past the last.
        owner: Per level, ``(B,)`` int64: the distinct prefix (``0 … n_i - 1``) each row has at that level.
        first: Per level, ``(n_i,)`` int64: a row holding each distinct prefix.
    """

    cuts: list[int]
    owner: list[Tensor]
    first: list[Tensor]

    def parent(self, level: int) -> Tensor:
        """``(n_level,)``: each distinct prefix of ``level``'s index at the level before (``level >= 1``)."""
        return self.owner[level - 1][self.first[level]]

    def slots(self, width: int) -> int:
        """Token slots the levels and a tail of ``width`` columns compute (``width * B`` reads each row once)."""
        rows = int(self.owner[0].shape[0])
        start, total = 0, 0
        for cut, first in zip(self.cuts, self.first, strict=True):
            total += len(first) * (cut - start)
            start = cut
        return total + rows * (width - start)


def _sorted_lcp(input_ids: Tensor, lengths: Tensor, order: list[int]) -> list[int]:
    """The common prefix length of each pair of neighbours in ``order`` (within both rows' real tokens)."""
    a, b = input_ids[order[:-1]], input_ids[order[1:]]
    real = torch.minimum(lengths[order[:-1]], lengths[order[1:]])
    columns = torch.arange(input_ids.shape[1], device=input_ids.device)
    same = (a == b) & (columns < real[:, None])
    return same.long().cumprod(dim=1).sum(dim=1).tolist()


def prefix_levels(
    input_ids: Tensor, lengths: Tensor, min_prefix: int, call_slots: float
) -> PrefixLevels | None:
    """The cuts that make the fewest token slots, each extra forward counted as ``call_slots`` more.

    Sorting the rows by their tokens puts rows with a common prefix next to each other, so the number of
    distinct prefixes ``x[:c]`` is one plus the neighbours whose common prefix is shorter than ``c``. It only
    changes at those common prefix lengths, which are the candidate cuts; a dynamic programme over them
    picks the cheapest increasing sequence: ``Σ n(c_i) (c_i - c_{i-1}) + B (width - c_k) + k call_slots``.

    Args:
        input_ids: ``(B, T)`` token ids, each row's real tokens first (right padding).
        lengths: ``(B,)`` real tokens of each row.
        min_prefix: The first cut is at least this far in (and at least 1).
        call_slots: What one more forward costs, in token slots.

    Returns:
        The plan, or ``None`` where reading every row whole is as cheap (one row; no shared prefix).
    """
    rows = int(input_ids.shape[0])
    if rows < 2:
        return None
    length = [int(n) for n in lengths.tolist()]
    tokens = input_ids.tolist()
    order = sorted(range(rows), key=lambda r: tokens[r][: length[r]])
    lcp = _sorted_lcp(input_ids, lengths, order)
    limit = min(length) - 1  # every row keeps a token of its own past the last cut
    candidates = sorted({min(c, limit) for c in lcp if min(c, limit) >= max(min_prefix, 1)})
    if not candidates:
        return None

    def distinct(cut: int) -> int:
        return 1 + sum(1 for c in lcp if c < cut)

    width = max(length)
    n = [distinct(c) for c in candidates]
    # best[b]: the cheapest levels up to candidates[b] (its own level last); back[b]: the level before it
    best: list[float] = []
    back: list[int] = []
    for b, cut in enumerate(candidates):
        options: list[tuple[float, int]] = [(float(n[b] * cut), -1)]
        options += [(best[a] + n[b] * (cut - candidates[a]) + call_slots, a) for a in range(b)]
        cost, a = min(options)
        best.append(cost)
        back.append(a)
    totals = [best[b] + rows * (width - cut) + call_slots for b, cut in enumerate(candidates)]
    last = min(range(len(candidates)), key=totals.__getitem__)
    if totals[last] >= rows * width:
        return None
    cuts: list[int] = []
    b = last
    while b >= 0:
        cuts.append(candidates[b])
        b = back[b]
    cuts.reverse()
    owner: list[Tensor] = []
    first: list[Tensor] = []
    device = input_ids.device
    for cut in cuts:
        mine = [0] * rows
        heads = [order[0]]
        for j in range(1, rows):
            new = lcp[j - 1] < cut
            mine[order[j]] = mine[order[j - 1]] + new
            if new:
                heads.append(order[j])
        owner.append(torch.tensor(mine, dtype=torch.long, device=device))
        first.append(torch.tensor(heads, dtype=torch.long, device=device))
    return PrefixLevels(cuts, owner, first)
