"""A study's definitions as parameterised kinds, read off the runs' summaries (criteria: :mod:`.criteria`).

A **definition** is a per-run finding, computed for one arm and seed (with its control of the same seed and
the other arms of that seed at hand). Two sorts:

* *tests* say whether the run meets a condition (``window_gain``, ``change``, ``peak``, ``em_gain``,
  ``phases``);
* *events* give the first step at which something happens, or none (``trailing_below``, ``drawdown``,
  ``threshold``, ``departure``, ``behaviour_collapse``). An event is met when it happened. Warning signals
  are events, and a signal's *lead* over an event is the event's step minus the signal's.

Each kind, here and in :mod:`.criteria`, is one entry of a small dict with its parameters, their defaults
and checks: an unknown kind or parameter is refused when the protocol is read, naming what is accepted.

Metrics are the curves a summary keeps (``rollout/sampled_reward``, ``lld/probe_onpolicy_heldout`` …) and
``eval/em``, the greedy evaluations (step 0 is the warm-start's, from the control's evaluation when the arm
has none). ``paired = true`` takes the arm's value minus its control's at the same step.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from searchgym.errors import ConfigError

from .params import (
    COMPARISON,
    REQUIRED,
    Param,
    as_count,
    as_flag,
    as_names,
    as_real,
    as_text,
    at_step,
    choice,
    rules,
    window,
    windows,
)
from .summary import em_vector, eval_series, number, series

__all__ = [
    "DEFINITION_KINDS",
    "EVAL_EM",
    "WORDS",
    "Finding",
    "Kind",
    "Param",
    "RunView",
    "fmt",
    "level",
    "read_params",
]

EVAL_EM = "eval/em"
"""The metric name of greedy evaluations (a summary's ``eval`` section) in definitions."""
WORDS = ("MET", "NOT MET", "undecided (seeds missing)", "not applicable")
"""Every word a verdict can say."""


# -- findings --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """What one definition says of one run.

    Attributes:
        met: Whether the run meets it (an event: whether it happened); ``None`` when the summaries do not
            hold what it needs (counted as not met).
        step: An event's step (``None`` for a test, or an event that did not happen).
        values: The figures behind it (a mean and its interval, a gain …), for the tables.
        cell: How the tables print it.
    """

    met: bool | None
    step: int | None = None
    values: Mapping[str, float | None] = field(default_factory=dict)
    cell: str = "–"


@dataclass
class RunView:
    """One run's summary with what its definitions compare it with: its control and the other arms of the
    same seed. Findings are computed once, on first use."""

    arm: str
    seed: int
    summary: dict[str, Any]
    control: dict[str, Any] | None
    peers: Mapping[str, dict[str, Any]]
    definitions: Mapping[str, Any]
    cache: dict[str, Finding] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return int(self.summary["steps"])

    def find(self, name: str) -> Finding:
        """The finding of the definition (or signal) ``name`` for this run."""
        if name not in self.cache:
            d = self.definitions[name]
            self.cache[name] = DEFINITION_KINDS[d.kind].evaluate(self, d.params)
        return self.cache[name]

    def values(self, metric: str, paired: bool = False) -> dict[int, float]:
        """``metric`` by step, sorted; ``paired``: the arm's minus its control's, at the steps both have."""
        own = self._values(self.summary, metric)
        if not paired:
            return own
        if self.control is None:
            return {}
        other = self._values(self.control, metric)
        return {t: v - other[t] for t, v in own.items() if t in other}

    def _values(self, s: dict[str, Any], metric: str) -> dict[int, float]:
        if metric != EVAL_EM:
            return dict(sorted(series(s, metric).items()))
        out = eval_series(s)
        if 0 not in out and self.control is not None:  # the same warm-start: the control's step 0 stands
            start = eval_series(self.control).get(0)
            if start is not None:
                out[0] = start
        return dict(sorted(out.items()))

    def start(self, metric: str) -> float | None:
        """The warm-start's value of ``metric`` (step 0): a probe's own, or the evaluation at step 0."""
        if metric == EVAL_EM:
            return self.values(EVAL_EM).get(0)
        return number(self.summary.get("probe_step0", {}).get(metric))


def fmt(value: float | None, digits: int = 3) -> str:
    """A signed figure (a gain, a change), ``–`` when missing."""
    return "–" if value is None else f"{value:+.{digits}f}"


def level(value: float | None, digits: int = 3) -> str:
    """A level (an EM, a reward, minutes), ``–`` when missing."""
    return "–" if value is None else f"{value:.{digits}f}"


def _tick(met: bool | None) -> str:
    return "✓" if met else "✗" if met is False else "–"


def _event(step: int | None) -> Finding:
    return Finding(step is not None, step, {}, "–" if step is None else str(step))


# -- definition kinds: tests ---------------------------------------------------------------------------------


def window_gain(view: RunView, p: Mapping[str, Any]) -> Finding:
    """The mean of ``metric`` (paired by default: ``d_t``, the arm minus its control) over a window of steps is
    at least ``at_least`` and its normal 95 % interval (mean ± 1.96 · sd / √n) lies above 0."""
    d = view.values(p["metric"], p["paired"])
    window = p["steps"]
    if window == "second_half":
        xs = [v for t, v in d.items() if t > view.steps / 2]
    else:
        xs = [v for t, v in d.items() if window[0] <= t <= window[1]]
    if len(xs) < 2:
        return Finding(None, values={"mean": None, "lo": None, "hi": None})
    mean = statistics.fmean(xs)
    half = 1.96 * statistics.stdev(xs) / math.sqrt(len(xs))
    met = mean >= p["at_least"] and mean - half > 0
    cell = f"{fmt(mean)} [{fmt(mean - half)}, {fmt(mean + half)}] {_tick(met)}"
    return Finding(met, values={"mean": mean, "lo": mean - half, "hi": mean + half, "n": len(xs)}, cell=cell)


def change(view: RunView, p: Mapping[str, Any]) -> Finding:
    """``metric`` at the run's last step minus its warm-start value (step 0) is at least ``at_least``."""
    end = view.values(p["metric"]).get(view.steps)
    start = view.start(p["metric"])
    if end is None or start is None:
        return Finding(None, values={"change": None})
    delta = end - start
    met = delta >= p["at_least"]
    return Finding(met, values={"change": delta}, cell=f"{fmt(delta)} {_tick(met)}")


def peak(view: RunView, p: Mapping[str, Any]) -> Finding:
    """Rise and fall of ``metric`` (greedy EM by default) around its highest value: the peak at least
    ``rise_at_least`` above the start, the end at least ``fall_at_least`` below the peak, the end keeping at
    least ``keeps_at_least`` of the peak's gain; each condition only when given."""
    values = view.values(p["metric"])
    start = view.start(p["metric"])
    if start is None and values:
        start = values[min(values)]
    end = values.get(view.steps)
    if start is None or end is None:
        return Finding(None, values={"start": None, "peak": None, "end": None})
    top = max(values.values())
    checks = []
    if p["rise_at_least"] is not None:
        checks.append(top - start >= p["rise_at_least"])
    if p["fall_at_least"] is not None:
        checks.append(top - end >= p["fall_at_least"])
    if p["keeps_at_least"] is not None:
        checks.append(top > start and end - start >= p["keeps_at_least"] * (top - start))
    met = all(checks)
    cell = f"{level(start)} → {level(top)} → {level(end)} {_tick(met)}"
    return Finding(met, values={"start": start, "peak": top, "end": end}, cell=cell)


def em_gain(view: RunView, p: Mapping[str, Any]) -> Finding:
    """Greedy EM at ``at`` (``"end"``: the run's last step) minus the warm-start's (``against =
    "warmstart"``) or another arm's of the same seed at the same point: above ``above``, at least
    ``at_least``, or at most ``at_most`` (an arm that ends below another); with ``interval``, the paired
    bootstrap 95 % interval over questions must also lie above 0 (below 0 with ``at_most``)."""
    s = view.summary
    mine_step = view.steps if p["at"] == "end" else p["at"]
    if p["against"] == "warmstart":
        base_s = s if "0" in s["eval"] else view.control
        base_step = 0
    else:
        base_s = view.peers.get(p["against"])
        base_step = (int(base_s["steps"]) if base_s else 0) if p["at"] == "end" else p["at"]
    mine = s["eval"].get(str(mine_step), {}).get("em")
    base = base_s["eval"].get(str(base_step), {}).get("em") if base_s else None
    if mine is None or base is None:
        return Finding(None, values={"gain": None})
    gain = float(mine) - float(base)
    below = p["at_most"] is not None
    if below:
        met = gain <= p["at_most"]
    else:
        met = gain > p["above"] if p["above"] is not None else gain >= p["at_least"]
    values: dict[str, float | None] = {"gain": gain}
    if p["interval"]:
        from searchgym.stats import bootstrap_mean

        a, b = em_vector(s, mine_step), em_vector(base_s, base_step) if base_s else None
        if a is None or b is None or len(a) != len(b):
            return Finding(None, values={"gain": gain, "lo": None, "hi": None})
        interval = bootstrap_mean([x - y for x, y in zip(a, b, strict=True)])
        values |= {"lo": interval.low, "hi": interval.high}
        met = met and (interval.high < 0 if below else interval.low > 0)
        return Finding(
            met, values=values, cell=f"{fmt(gain)} [{fmt(interval.low)}, {fmt(interval.high)}] {_tick(met)}"
        )
    return Finding(met, values=values, cell=f"{fmt(gain)} {_tick(met)}")


def earlier(view: RunView, p: Mapping[str, Any]) -> Finding:
    """The run's ``event`` happens at least ``by`` steps before the same event in arm ``against`` of the same
    seed, or happens where the other arm's never does."""
    other = view.peers.get(p["against"])
    mine = view.find(p["event"]).step
    if other is None:
        return Finding(None, values={"lead": None})
    peer = RunView(p["against"], view.seed, other, view.control, view.peers, view.definitions)
    theirs = peer.find(p["event"]).step
    if mine is None:
        return Finding(
            False, values={"lead": None}, cell=f"never ({theirs if theirs is not None else 'never'}) ✗"
        )
    if theirs is None:
        return Finding(True, values={"lead": None}, cell=f"{mine} (never) ✓")
    met = theirs - mine >= p["by"]
    return Finding(met, values={"lead": float(theirs - mine)}, cell=f"{mine} ({theirs}) {_tick(met)}")


def either(view: RunView, p: Mapping[str, Any]) -> Finding:
    """Any of the definitions ``of`` is met (``None`` when none is met and one cannot be decided)."""
    found = [view.find(name) for name in p["of"]]
    if any(f.met for f in found):
        return Finding(
            True, cell="✓ (" + ", ".join(n for n, f in zip(p["of"], found, strict=True) if f.met) + ")"
        )
    if any(f.met is None for f in found):
        return Finding(None)
    return Finding(False, cell="✗")


def phases(view: RunView, p: Mapping[str, Any]) -> Finding:
    """Window means of metrics around an event, compared by ``rules`` (``"METRIC: W1 > W2 > W3"``; W1 is the
    first of ``windows``). A bound ``"event-15"`` is 15 steps before the event's step; windows are cut at the
    run's last step. Not met when the event did not happen or a mean is missing."""
    at = view.find(p["event"]).step
    if at is None:
        return Finding(None)
    bounds = [tuple(b if isinstance(b, int) else at + b[1] for b in w) for w in p["windows"]]
    bounds = [(lo, min(hi, view.steps)) for lo, hi in bounds]
    means: dict[str, list[float | None]] = {}
    met = True
    for metric, chain in p["rules"]:
        values = view.values(metric)
        means[metric] = [
            statistics.fmean(xs) if (xs := [v for t, v in values.items() if lo <= t <= hi]) else None
            for lo, hi in bounds
        ]
        for i, op, j in chain:
            a, b = means[metric][i], means[metric][j]
            met = met and a is not None and b is not None and COMPARISON[op](float(a), float(b))
    flat = {f"{m} W{i + 1}": v for m, vs in means.items() for i, v in enumerate(vs)}
    cell = "; ".join(" / ".join(fmt(v, 4) for v in vs) for vs in means.values()) + f" {_tick(met)}"
    return Finding(met, values=flat, cell=cell)


# -- definition kinds: events --------------------------------------------------------------------------------


def trailing_below(view: RunView, p: Mapping[str, Any]) -> Finding:
    """The first step ``t >= from_step`` whose trailing ``width``-step mean of ``metric`` (paired by default),
    over steps ``t-width+1 … t`` all logged, is at or below ``at_most``."""
    d = view.values(p["metric"], p["paired"])
    width = p["width"]
    start = p["from_step"] if p["from_step"] is not None else width
    for t in d:
        window = range(t - width + 1, t + 1)
        if (
            t >= start
            and all(s in d for s in window)
            and statistics.fmean(d[s] for s in window) <= p["at_most"]
        ):
            return _event(t)
    return _event(None)


def drawdown(view: RunView, p: Mapping[str, Any]) -> Finding:
    """The first step at which ``metric`` is ``drop`` below the highest value it had at any earlier step, the
    warm-start's included (``direction = "up"``: ``drop`` above the lowest)."""
    best = view.start(p["metric"]) if not p["paired"] else None
    up = p["direction"] == "up"
    for t, v in view.values(p["metric"], p["paired"]).items():
        if best is not None and (v >= best + p["drop"] if up else v <= best - p["drop"]):
            return _event(t)
        best = v if best is None else (min(best, v) if up else max(best, v))
    return _event(None)


def threshold(view: RunView, p: Mapping[str, Any]) -> Finding:
    """The first step ``>= from_step`` with ``metric`` at or below ``at_most`` (or at or above ``at_least``)."""
    for t, v in view.values(p["metric"], p["paired"]).items():
        if t < p["from_step"]:
            continue
        if (p["at_most"] is not None and v <= p["at_most"]) or (
            p["at_least"] is not None and v >= p["at_least"]
        ):
            return _event(t)
    return _event(None)


def departure(view: RunView, p: Mapping[str, Any]) -> Finding:
    """The first step after the ``baseline`` window whose trailing ``width``-step mean of ``metric`` has moved
    by at least ``fraction`` of the baseline's mean (``direction``: up, down or either)."""
    values = view.values(p["metric"], p["paired"])
    lo, hi = p["baseline"]
    base = [v for t, v in values.items() if lo <= t <= hi]
    if not base:
        return _event(None)
    mean = statistics.fmean(base)
    for t in values:
        window = range(t - p["width"] + 1, t + 1)
        if t <= hi or not all(s in values for s in window):
            continue
        moved = statistics.fmean(values[s] for s in window) - mean
        size = p["fraction"] * abs(mean)
        if (
            (p["direction"] in ("up", "either") and moved >= size)
            or (p["direction"] in ("down", "either") and -moved >= size)
        ) and size > 0:
            return _event(t)
    return _event(None)


def behaviour_collapse(view: RunView, p: Mapping[str, Any]) -> Finding:
    """:func:`searchgym.agents.grpo.diagnostics.behaviour_collapse_step` on the run's curves: answers below
    half, or searches below half the warm-start's (5-step trailing means)."""
    from searchgym.agents.grpo.diagnostics import behaviour_collapse_step

    answered, searches = view.values("rollout/answered"), view.values("rollout/searches")
    history = [
        {"step": t, "rollout/answered": a, "rollout/searches": searches[t]}
        for t, a in answered.items()
        if t in searches
    ]
    return _event(behaviour_collapse_step(history) if history else None)


@dataclass(frozen=True)
class Kind:
    """A definition or criterion kind: its parameters and what evaluates it."""

    evaluate: Callable[..., Any]
    params: Mapping[str, Param]
    event: bool = False


_METRIC = Param(as_text, "rollout/sampled_reward", "the metric (a curve, or eval/em)")
_PAIRED = Param(as_flag, True, "the arm's value minus its control's at the same step")

DEFINITION_KINDS: dict[str, Kind] = {
    "window_gain": Kind(
        window_gain,
        {"metric": _METRIC, "paired": _PAIRED, "steps": Param(window), "at_least": Param(as_real, 0.0)},
    ),
    "change": Kind(change, {"metric": Param(as_text), "at_least": Param(as_real)}),
    "peak": Kind(
        peak,
        {
            "metric": Param(as_text, EVAL_EM),
            "rise_at_least": Param(as_real, None),
            "fall_at_least": Param(as_real, None),
            "keeps_at_least": Param(as_real, None),
        },
    ),
    "em_gain": Kind(
        em_gain,
        {
            "against": Param(as_text, "warmstart"),
            "at": Param(at_step, "end"),
            "above": Param(as_real, None),
            "at_least": Param(as_real, None),
            "at_most": Param(as_real, None),
            "interval": Param(as_flag, False),
        },
    ),
    "earlier": Kind(earlier, {"event": Param(as_text), "against": Param(as_text), "by": Param(as_count, 1)}),
    "either": Kind(either, {"of": Param(as_names)}),
    "phases": Kind(phases, {"event": Param(as_text), "windows": Param(windows), "rules": Param(rules)}),
    "trailing_below": Kind(
        trailing_below,
        {
            "metric": _METRIC,
            "paired": _PAIRED,
            "width": Param(as_count, 10),
            "at_most": Param(as_real),
            "from_step": Param(as_count, None),
        },
        event=True,
    ),
    "drawdown": Kind(
        drawdown,
        {
            "metric": Param(as_text),
            "paired": Param(as_flag, False),
            "drop": Param(as_real),
            "direction": Param(choice("down", "up"), "down"),
        },
        event=True,
    ),
    "threshold": Kind(
        threshold,
        {
            "metric": Param(as_text),
            "paired": Param(as_flag, False),
            "at_most": Param(as_real, None),
            "at_least": Param(as_real, None),
            "from_step": Param(as_count, 1),
        },
        event=True,
    ),
    "departure": Kind(
        departure,
        {
            "metric": Param(as_text),
            "paired": Param(as_flag, False),
            "baseline": Param(window, (1, 10)),
            "width": Param(as_count, 5),
            "fraction": Param(as_real),
            "direction": Param(choice("up", "down", "either"), "either"),
        },
        event=True,
    ),
    "behaviour_collapse": Kind(behaviour_collapse, {}, event=True),
}
"""Every definition kind, with its parameters (see each function's docstring)."""


def check_definition(kind: str, params: Mapping[str, Any], where: str) -> None:
    """Cross-parameter checks of one definition (after each parameter's own)."""
    if kind == "threshold" and (params["at_most"] is None) == (params["at_least"] is None):
        raise ConfigError(f"{where}: a threshold needs exactly one of at_most and at_least")
    if kind == "em_gain" and sum(params[k] is not None for k in ("above", "at_least", "at_most")) != 1:
        raise ConfigError(f"{where}: em_gain needs exactly one of above, at_least and at_most")
    if kind == "peak" and all(
        params[k] is None for k in ("rise_at_least", "fall_at_least", "keeps_at_least")
    ):
        raise ConfigError(f"{where}: peak needs at least one of rise_at_least, fall_at_least, keeps_at_least")
    if kind in ("trailing_below", "departure") and params["width"] < 1:
        raise ConfigError(f"{where}: width must be >= 1")
    if kind == "phases":
        used = max(max(i, j) for _, chain in params["rules"] for i, _, j in chain)
        if used >= len(params["windows"]):
            raise ConfigError(
                f"{where}: a rule names W{used + 1}, but there are {len(params['windows'])} windows"
            )
    if kind == "departure" and params["baseline"] == "second_half":
        raise ConfigError(f"{where}: baseline must be [first, last] steps")


def read_params(
    kinds: Mapping[str, Kind], table: Mapping[str, Any], where: str, reserved: Sequence[str]
) -> tuple[str, dict[str, Any]]:
    """A definition's or criterion's kind and its checked parameters, defaults filled in.

    Raises:
        ConfigError: the kind is missing or unknown, a parameter is unknown, missing or of the wrong type.
    """
    given_kind = table.get("kind")
    if given_kind not in kinds:
        raise ConfigError(f"{where}: kind must be one of {sorted(kinds)}, got {given_kind!r}")
    kind = str(given_kind)
    spec = kinds[kind].params
    given = {k: v for k, v in table.items() if k not in ("kind", *reserved)}
    if kind == "seeds" and "clauses" not in given and "when" in given:  # one clause, inline
        clause = {k: given.pop(k) for k in ("when", "at_least", "at_most") if k in given}
        given["clauses"] = [clause]
    unknown = sorted(set(given) - set(spec))
    if unknown:
        raise ConfigError(
            f"{where}: unknown parameter {unknown[0]!r} of kind {kind!r}; it takes {sorted(spec) or 'none'}"
        )
    params: dict[str, Any] = {}
    for name, param in spec.items():
        if name in given:
            params[name] = param.convert(given[name], f"{where}.{name}")
        elif param.default is REQUIRED:
            raise ConfigError(f"{where}: kind {kind!r} needs {name!r}")
        else:
            params[name] = param.default
    return kind, params
