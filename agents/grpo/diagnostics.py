"""Reading LLD off a run's metrics: the early-warning rule, the collapse rule, the precursor's lead time.

Pure functions over the per-step metric dicts a trainer logs (``metrics.jsonl`` records, or any dicts with
the same keys), torch-free, with no dependence on :class:`GRPOTrainer`: another trainer (TRL, verl, your
own) that logs ``lld/delta_adv_pos`` and ``rollout/reward`` can call them as a callback every step.

The rules are the ones pre-registered in ``docs/experiments/lld.md``:

* **warning** (the precursor): ``lld/delta_adv_pos <= 0`` on ``window`` consecutive steps — the step's
  positively rewarded responses failed to gain likelihood from the step's own updates, again and again.
* **collapse**: the moving average of ``rollout/reward`` (over ``smooth`` steps) falls below ``fraction``
  of its running peak, once the peak is at least ``min_peak``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["behaviour_collapse_step", "collapse_step", "drop_step", "lld_warning", "warning_steps"]

Metrics = Mapping[str, Any]


def _value(record: Metrics, key: str) -> float:
    value = record.get(key)
    return float(value) if value is not None else math.nan


def lld_warning(history: Sequence[Metrics], window: int = 3, key: str = "lld/delta_adv_pos") -> bool:
    """Whether the early-warning rule fires at the last step of ``history``.

    It fires when the last ``window`` records all hold ``key <= 0``. A step without a value (no response
    with A > 0 that step: ``None`` or NaN) breaks the run, so the rule never fires on missing data.

    Args:
        history: The run's per-step metrics, oldest first, the current step last.
        window: Consecutive steps required (``k``).
        key: The displacement metric to watch.

    Returns:
        ``True`` when the rule fires.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if len(history) < window:
        return False
    return all(_value(r, key) <= 0 for r in history[-window:])  # NaN <= 0 is False


def warning_steps(history: Sequence[Metrics], window: int = 3, key: str = "lld/delta_adv_pos") -> list[int]:
    """The steps (``record["step"]``, else the index + 1) at which :func:`lld_warning` fires."""
    return [
        int(history[i].get("step", i + 1))
        for i in range(len(history))
        if lld_warning(history[: i + 1], window, key)
    ]


def collapse_step(
    history: Sequence[Metrics],
    *,
    key: str = "rollout/reward",
    fraction: float = 0.5,
    smooth: int = 5,
    min_peak: float = 0.0,
) -> int | None:
    """The first step at which the smoothed reward falls below ``fraction`` of its running peak.

    Args:
        history: The run's per-step metrics, oldest first (records without ``key`` are skipped).
        key: The reward metric.
        fraction: Collapse threshold relative to the running peak.
        smooth: Trailing moving-average window, in steps (1: raw values); the rule starts at the first
            full window.
        min_peak: The rule is armed only once the running peak reaches this value.

    Returns:
        The step (``record["step"]``, else the index + 1), or ``None`` if the run never collapses.
    """
    if smooth < 1 or not 0 < fraction < 1:
        raise ValueError(f"need smooth >= 1 and 0 < fraction < 1, got {smooth}, {fraction}")
    points = [
        (int(r.get("step", i + 1)), _value(r, key)) for i, r in enumerate(history) if r.get(key) is not None
    ]
    peak = -math.inf
    for j in range(smooth - 1, len(points)):  # full windows only: a lone early step is too noisy
        step = points[j][0]
        average = sum(v for _, v in points[j - smooth + 1 : j + 1]) / smooth
        peak = max(peak, average)
        if peak >= min_peak and peak > 0 and average < fraction * peak:
            return step
    return None


def _trailing_first(
    history: Sequence[Metrics], key: str, smooth: int, below: float
) -> tuple[int, float] | None:
    """The first (step, average) at which the ``smooth``-step trailing mean of ``key`` is below ``below``."""
    points = [(_step(r, i), _value(r, key)) for i, r in enumerate(history) if r.get(key) is not None]
    for j in range(smooth - 1, len(points)):  # full windows only
        average = sum(v for _, v in points[j - smooth + 1 : j + 1]) / smooth
        if average < below:
            return points[j][0], average
    return None


def _step(record: Metrics, index: int) -> int:
    return int(record.get("step", index + 1))


def behaviour_collapse_step(
    history: Sequence[Metrics],
    *,
    warm_searches: float | None = None,
    smooth: int = 5,
    answered_below: float = 0.5,
    searches_fraction: float = 0.5,
) -> int | None:
    """The first step at which the policy stops answering or stops searching (reward-independent).

    Collapse is the first step at which the ``smooth``-step trailing mean of ``rollout/answered`` is below
    ``answered_below``, or that of ``rollout/searches`` is below ``searches_fraction`` × the warm-start's
    searches per episode (full windows only; training steps are the records with ``step > 0``).

    Args:
        history: The run's per-step metrics, oldest first; a step-0 record may carry ``warmstart/searches``
            (the initial policy's sampled searches per episode, logged by the trainer).
        warm_searches: The warm-start's searches per episode; default the step-0 record's
            ``warmstart/searches``, else the mean ``rollout/searches`` of the first ``smooth`` steps.
        smooth: Trailing window, in steps.
        answered_below: Threshold on the share of episodes that end with an answer.
        searches_fraction: Threshold on searches, relative to the warm-start's.

    Returns:
        The step, or ``None`` if the run never collapses.
    """
    if smooth < 1:
        raise ValueError(f"smooth must be >= 1, got {smooth}")
    steps = [r for i, r in enumerate(history) if _step(r, i) > 0]
    if warm_searches is None:
        start = next((r for i, r in enumerate(history) if _step(r, i) == 0), {})
        warm_searches = _value(start, "warmstart/searches")
        if math.isnan(warm_searches):
            first = [
                _value(r, "rollout/searches") for r in steps[:smooth] if r.get("rollout/searches") is not None
            ]
            warm_searches = sum(first) / len(first) if first else math.nan
    hits = [
        _trailing_first(steps, "rollout/answered", smooth, answered_below),
        _trailing_first(steps, "rollout/searches", smooth, searches_fraction * warm_searches)
        if math.isfinite(warm_searches) and warm_searches > 0
        else None,
    ]
    found = [h[0] for h in hits if h is not None]
    return min(found) if found else None


def drop_step(history: Sequence[Metrics], key: str, drop: float) -> int | None:
    """The first training step at which ``key`` is more than ``drop`` below its step-0 value.

    Args:
        history: The run's per-step metrics, oldest first, with a step-0 record holding ``key``.
        key: A likelihood metric, e.g. ``lld/probe_onpolicy_train`` (nats per token).
        drop: The fall that counts, e.g. 0.3 (the precursor) or 1.0 (the secondary collapse).

    Returns:
        The step, or ``None`` (also when step 0 has no finite value of ``key``).
    """
    start = next((r for i, r in enumerate(history) if _step(r, i) == 0), None)
    base = _value(start, key) if start is not None else math.nan
    if not math.isfinite(base):
        return None
    for i, r in enumerate(history):
        step = _step(r, i)
        if step > 0 and _value(r, key) < base - drop:  # NaN < x is False
            return step
    return None
