"""Which rows of a scoring batch share a leading run of tokens, and how long: the plan of
:func:`searchgym.agents.llm.scoring.token_logprobs`'s grouped-prefix path.

The responses of a GRPO group share their prompt and question, and often much more (the same search, so
the same passages). :func:`prefix_groups` finds such groups in a batch of right-padded rows without being
told which rows belong together: the rows are sorted by their tokens, so rows with a long common prefix
sit next to each other, and the sorted order is cut into runs that together save the most token slots.
Pure: token ids and lengths in, a :class:`PrefixPlan` out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["PrefixPlan", "prefix_groups"]


@dataclass(frozen=True)
class PrefixPlan:
    """Groups of rows whose first tokens are read once, for the group.

    Attributes:
        group: ``(B,)`` int64: the group of each row. A row that shares no prefix is a group of its own.
        prefix: ``(G,)`` int64: how many leading tokens every row of each group shares (and reads once); a
            group of one row holds the whole row.
        first: ``(G,)`` int64: a row of each group, whose tokens stand for the group's prefix.
        row_prefix: ``(B,)`` int64: the prefix each row takes from its group (its whole length for a row
            alone, which so has no tokens left to read).
    """

    group: Tensor
    prefix: Tensor
    first: Tensor
    row_prefix: Tensor

    @property
    def groups(self) -> int:
        """How many groups (``G``)."""
        return int(self.prefix.shape[0])


def _sorted_lcp(input_ids: Tensor, lengths: Tensor, order: list[int]) -> list[int]:
    """The common prefix length of each pair of neighbours in ``order`` (within both rows' real tokens)."""
    a, b = input_ids[order[:-1]], input_ids[order[1:]]
    real = torch.minimum(lengths[order[:-1]], lengths[order[1:]])
    columns = torch.arange(input_ids.shape[1], device=input_ids.device)
    same = (a == b) & (columns < real[:, None])
    return same.long().cumprod(dim=1).sum(dim=1).tolist()


def prefix_groups(input_ids: Tensor, lengths: Tensor, min_prefix: int) -> PrefixPlan | None:
    """Groups of rows sharing at least ``min_prefix`` leading tokens, chosen to save the most token slots.

    Sorting the rows by their real tokens puts every set of rows with a common prefix in one contiguous run,
    and the common prefix of a run is the least common prefix of its neighbours. A dynamic programme over
    the sorted order picks the runs maximising ``Σ (rows of the run - 1) × its common prefix`` (the token
    slots not computed again), so a group of five whose three rows also share their first search may split
    where that saves more. A group's prefix stops one token short of its shortest row, so every row of a
    group keeps a token of its own to read (an identical pair still shares all but its last token). A row
    that shares nothing is a group of one whose prefix is the whole row.

    Args:
        input_ids: ``(B, T)`` token ids, each row's real tokens first (right padding).
        lengths: ``(B,)`` real tokens of each row.
        min_prefix: A group's shared prefix must be at least this long (and at least 1).

    Returns:
        The plan, or ``None`` if no two rows share ``min_prefix`` tokens.
    """
    rows = int(input_ids.shape[0])
    if rows < 2:
        return None
    length = [int(n) for n in lengths.tolist()]
    tokens = input_ids.tolist()
    order = sorted(range(rows), key=lambda r: tokens[r][: length[r]])
    lcp = _sorted_lcp(input_ids, lengths, order)
    floor = max(min_prefix, 1)
    # best[j]: the most slots saved by a cut of order[:j]; cut[j] = (start of its last run, that run's prefix)
    best = [0] * (rows + 1)
    cut = [(j - 1, 0) for j in range(rows + 1)]
    for j in range(1, rows + 1):
        best[j], cut[j] = best[j - 1], (j - 1, 0)  # order[j - 1] alone
        shared = length[order[j - 1]] - 1
        for i in range(j - 2, -1, -1):  # the run order[i:j]
            shared = min(shared, lcp[i], length[order[i]] - 1)
            if shared < floor:
                break
            saved = best[i] + (j - i - 1) * shared
            if saved > best[j]:
                best[j], cut[j] = saved, (i, shared)
    if best[rows] == 0:
        return None
    group = [0] * rows
    row_prefix = [0] * rows
    prefix: list[int] = []
    first: list[int] = []
    j = rows
    while j > 0:
        i, shared = cut[j]
        for r in order[i:j]:
            group[r], row_prefix[r] = len(prefix), shared or length[r]
        prefix.append(shared or length[order[i]])
        first.append(order[i])
        j = i
    device = input_ids.device

    def as_tensor(values: list[int]) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return PrefixPlan(as_tensor(group), as_tensor(prefix), as_tensor(first), as_tensor(row_prefix))
