"""How one rollout step's responses are cut into optimizer updates (mini-batches) and forward/backward calls
(micro-batches), and the seeds of a step's random streams: pure functions of sizes, lengths and seeds."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from searchgym.errors import ConfigError

from ..training.rollout import RolloutBatch, concat_batches

__all__ = [
    "call_overhead_tokens",
    "filter_groups",
    "group_rows",
    "informative_groups",
    "length_buckets",
    "minibatch_plan",
    "step_seed",
]


def minibatch_plan(
    n: int, group_size: int, minibatch_size: int, epochs: int, plan: str, generator: torch.Generator
) -> list[Tensor]:
    """The mini-batches of one rollout step: response indices, one tensor per optimizer update.

    * ``"groups"`` (default, the reference recipe with groups kept whole): every epoch shuffles the order of
      the ``n / group_size`` groups and cuts it into mini-batches of ``minibatch_size / group_size`` whole
      groups, so each trajectory is used exactly once per epoch and a group's responses — whose advantages
      are relative to each other — are always updated together.
    * ``"shuffle"``: every epoch shuffles the responses themselves, across groups.

    Args:
        n: Responses in the batch (consecutive blocks of ``group_size`` share a question).
        group_size: G.
        minibatch_size: Responses per update (a multiple of ``group_size`` for ``"groups"``).
        epochs: Passes over the batch.
        plan: ``"groups"`` or ``"shuffle"``.
        generator: Seeded RNG of the shuffles.

    Returns:
        ``epochs * n / minibatch_size`` int64 tensors.

    Raises:
        ConfigError: an unknown plan, or sizes that do not divide.
    """
    if n % minibatch_size or (plan == "groups" and (n % group_size or minibatch_size % group_size)):
        raise ConfigError(
            f"cannot cut {n} responses in groups of {group_size} into mini-batches of {minibatch_size}"
        )
    out: list[Tensor] = []
    for _ in range(epochs):
        if plan == "groups":
            groups = torch.randperm(n // group_size, generator=generator)
            order = (groups[:, None] * group_size + torch.arange(group_size)).flatten()
        elif plan == "shuffle":
            order = torch.randperm(n, generator=generator)
        else:
            raise ConfigError(f"unknown minibatch plan {plan!r}; choose one of ['groups', 'shuffle']")
        out.extend(order[i : i + minibatch_size] for i in range(0, n, minibatch_size))
    return out


def length_buckets(index: Tensor, lengths: Tensor, max_size: int, overhead: float) -> list[Tensor]:
    """Cuts the responses ``index`` into micro-batches of similar lengths, at most ``max_size`` each.

    The responses are sorted by length (longest first) and split into contiguous runs minimising the
    padded slots computed, ``Σ (run size × its longest length)``, plus ``overhead`` slots per micro-batch
    (what one more forward/backward call costs, in token slots): an exact dynamic programme, quadratic in
    ``len(index)`` (a mini-batch).

    Args:
        index: ``(n,)`` int64 response indices of one mini-batch.
        lengths: ``(B,)`` transcript length of every response of the batch.
        max_size: The most responses per micro-batch (the memory bound, ``micro_batch_size``).
        overhead: Cost of one micro-batch in token slots (0: one response per micro-batch when lengths
            differ; large: as few micro-batches as ``max_size`` allows).

    Returns:
        Index tensors, longest responses first; together a permutation of ``index``.
    """
    n = len(index)
    if n == 0:
        return []
    order = index[torch.argsort(lengths[index], descending=True, stable=True)]
    size = lengths[order].tolist()
    best = [0.0] + [math.inf] * n  # best[j]: the cheapest cut of the first j responses
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(max(0, j - max_size), j):  # the last run is order[i:j]; its width is size[i]
            cost = best[i] + (j - i) * size[i] + overhead
            if cost < best[j]:
                best[j], cut[j] = cost, i
    runs = []
    j = n
    while j > 0:
        runs.append(order[cut[j] : j])
        j = cut[j]
    return runs[::-1]


def call_overhead_tokens(device: str) -> float:
    """One micro-batch's fixed cost in token slots: small on a CPU, where compute grows with the slots, large
    on an accelerator, where a call's latency hides thousands of slots."""
    return 256.0 if str(device).startswith("cpu") else 4096.0


def step_seed(seed: int, step: int, stream: int | None = None) -> int:
    """The seed of one random stream of a run's step: ``(seed, step)`` for the step's questions, sampling
    and mini-batch plan; ``stream`` for a sub-stream of the step (an update's ledger rows are ``update``;
    the further draws of ``--filter-groups`` are ``500 + draw``). A resumed run and every arm of a seed
    so draw the same values."""
    base = seed * 1_000_003 + step
    return base if stream is None else base * 1_009 + stream


def informative_groups(rewards: Tensor, group_size: int) -> list[int]:
    """The indices of the groups (consecutive runs of ``group_size``) whose rewards are not all equal."""
    groups = rewards.view(-1, group_size)
    return [int(g) for g in torch.nonzero(groups.max(dim=1).values > groups.min(dim=1).values).flatten()]


def group_rows(groups: list[int], group_size: int) -> list[int]:
    """The response rows of ``groups``, in order."""
    return [g * group_size + j for g in groups for j in range(group_size)]


def filter_groups(
    first: RolloutBatch,
    draw: Callable[[int], RolloutBatch],
    group_size: int,
    questions: int,
    max_draws: int,
    pad_id: int,
) -> tuple[RolloutBatch, int]:
    """DAPO's dynamic sampling: ``questions`` groups whose rewards are not all equal, from ``first`` and
    further draws (``draw(n)``, the ``n``-th), at most ``max_draws`` in all; a batch still short is topped
    up with ``first``'s uninformative groups, so it keeps its shape. Returns the batch and the draws made."""
    informative = informative_groups(first.rewards, group_size)
    kept = [(first, informative)]
    count, draws = len(informative), 1
    while count < questions and draws < max_draws:
        more = draw(draws)
        draws += 1
        found = informative_groups(more.rewards, group_size)[: questions - count]
        kept.append((more, found))
        count += len(found)
    spare = [g for g in range(questions) if g not in set(informative)]
    kept.append((first, spare[: max(questions - count, 0)]))
    batch = concat_batches([b.select(group_rows(groups, group_size)) for b, groups in kept if groups], pad_id)
    return batch, draws
