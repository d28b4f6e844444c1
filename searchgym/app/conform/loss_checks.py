"""The checks of :func:`~searchgym.app.conform.runner.run_conformance` that read the loss's
numbers rather than its tokens: each row's advantage against the declared estimator, and the weight the
loss gives each trained token against the declared aggregation. Each returns one
:class:`~searchgym.app.conform.runner.Result`, as :mod:`.checks`' do.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from .adapter import AGGREGATIONS, ESTIMATORS, Built, Result
from .checks import (
    RATIO_WINDOW,
    WEIGHT_TOLERANCE,
    by_position,
    failed_build,
    failed_loss,
    row_advantage,
)
from .episodes import Episode

__all__ = ["check_advantages", "check_aggregation"]

ADVANTAGE_FIX = "compute each group's advantages from its own rewards, as the declared estimator does"
AGGREGATION_FIX = "declare the aggregation the loss uses, or aggregate the per-token loss as declared"


def _failed_declaration(name: str, built: Built, field: str, valid: Iterable[str]) -> Result | None:
    """The check's failure when the build failed (:func:`.failed_build`), or when its ``TrainBatch``
    declares a ``field`` value that is not one of ``valid``; ``None`` when there is something to check."""
    failed = failed_build(name, built)
    if failed or built.batch is None:
        return failed
    value = getattr(built.batch, field)
    if value in valid:
        return None
    return Result(
        name,
        "fail",
        f"unknown {field} {value!r}; valid: {', '.join(valid)}",
        f"declare one of them in TrainBatch.{field}",
    )


def check_advantages(built: Built, episodes: Sequence[Episode]) -> Result:
    """Each row's advantage equals the declared estimator's on its episode's group rewards."""
    name = "advantages"
    failed = _failed_declaration(name, built, "estimator", ESTIMATORS)
    if failed:
        return failed
    batch = built.batch
    assert batch is not None
    ordered = sorted(episodes, key=lambda ep: ep.index)
    group_size = Counter(ep.group for ep in ordered).most_common(1)[0][1]
    rewards = torch.tensor([ep.reward for ep in ordered], dtype=torch.float32)
    reference = ESTIMATORS[batch.estimator](rewards, group_size).tolist()
    position = {ep.index: k for k, ep in enumerate(ordered)}
    compared = 0
    for i, index in enumerate(batch.episodes):
        if index not in position:
            continue
        ep, want = ordered[position[index]], reference[position[index]]
        got = row_advantage(batch, i)
        if got is None:
            continue
        group = [f"{ordered[k].reward:g}" for k in range(len(ordered)) if ordered[k].group == ep.group]
        if math.isnan(got):
            return Result(
                name, "fail", f"row {i} ({ep.label}): the advantages vary inside the response", ADVANTAGE_FIX
            )
        if abs(got - want) > 1e-5 + 1e-3 * abs(want):
            return Result(
                name,
                "fail",
                f"row {i} ({ep.label}, group {ep.group} with rewards {', '.join(group)}): advantage {got:.4g}, "
                f"{batch.estimator} gives {want:.4g}",
                ADVANTAGE_FIX,
            )
        compared += 1
    if not compared:
        return Result(name, "fail", "no row has a trained token to read an advantage from", ADVANTAGE_FIX)
    groups = sorted({ep.group for ep in ordered})
    spread = "; ".join(
        f"group {g} (rewards {', '.join(f'{ep.reward:g}' for ep in ordered if ep.group == g)}): "
        + ", ".join(f"{reference[k]:.3g}" for k, ep in enumerate(ordered) if ep.group == g)
        for g in groups
    )
    return Result(name, "ok", f"{batch.estimator} on {compared} rows: {spread}")


def check_aggregation(built: Built, clip_eps: float) -> Result:
    """The loss weighs trained tokens as the declared aggregation does, relative to each other.

    At the first update (ratio within the clip range) the policy term of token ``t`` of response ``i`` has
    gradient ``-A_i * ratio_t * w_t`` with respect to its log-prob; ``w_t`` is the aggregation's weight.
    """
    name = "aggregation"
    failed = _failed_declaration(name, built, "aggregation", AGGREGATIONS)
    if failed:
        return failed
    batch = built.batch
    assert batch is not None
    failed = failed_loss(name, built)
    if failed:
        return failed
    assert built.loss is not None and built.logp_grad is not None
    lengths = [len(r) for r in batch.tokens]
    logp, _ = by_position(built.loss.logp, built.loss.offset, lengths)
    grad, _ = by_position(built.logp_grad, built.loss.offset, lengths)
    window = min(RATIO_WINDOW, clip_eps / 2)
    weights, sizes = [], []
    for i in range(len(batch.tokens)):
        advantage = row_advantage(batch, i)
        if advantage is None or math.isnan(advantage) or abs(advantage) < 1e-6:
            continue
        count = sum(1 for m in batch.loss_mask[i] if m)
        for p, m in enumerate(batch.loss_mask[i]):
            log_ratio = logp[i][p] - batch.old_logp[i][p]
            # A trained token the loss ignores (zero gradient) is the masks check's finding, not a weight.
            if m and not np.isnan(log_ratio) and abs(log_ratio) < window and grad[i][p] != 0.0:
                weights.append(-grad[i][p] / (advantage * math.exp(log_ratio)))
                sizes.append(count)
    if len(set(sizes)) < 2:
        return Result(name, "skip", "fewer than two trained responses of different lengths with A != 0")
    w, n = np.array(weights), np.array(sizes, dtype=float)
    spread = {}
    for pattern, expected in (("token", np.ones_like(n)), ("sequence", 1.0 / n)):
        scale = w / expected
        centre = float(np.median(scale))
        spread[pattern] = float(np.abs(scale / centre - 1).max()) if centre > 0 else math.inf
    declared = AGGREGATIONS[batch.aggregation]
    if spread[declared] <= WEIGHT_TOLERANCE:
        shape = (
            "every trained token weighs the same" if declared == "token" else "every response weighs the same"
        )
        return Result(name, "ok", f"{batch.aggregation}: {shape} ({len(w)} tokens of responses with A != 0)")
    short, long_ = int(n.min()), int(n.max())
    ratio = float(np.median(w[n == short]) / np.median(w[n == long_]))
    found = min(spread, key=lambda k: spread[k])
    if spread[found] <= WEIGHT_TOLERANCE:
        measured = (
            "every trained token weighs the same"
            if found == "token"
            else "each response weighs the same whatever its length (seq-mean-token-mean)"
        )
    else:
        measured = "neither token nor sequence weights"
    return Result(
        name,
        "fail",
        f"declared {batch.aggregation}, but {measured}: a token of the shortest response ({short} tokens) "
        f"weighs {ratio:.3g}x one of the longest ({long_} tokens)",
        AGGREGATION_FIX,
    )
