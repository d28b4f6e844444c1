"""A study's criteria as parameterised kinds: each counts per-run findings (:mod:`.rules`) over the seeds of
the arms it judges, and says MET, NOT MET, undecided while seeds that could change it are missing, or not
applicable.

* ``seeds``: clauses "the seeds whose named findings are all met number at least (or at most) N";
* ``lead``: in every seed where an event happened, one signal turned at least N steps before it;
* ``pooled_em_gain``: greedy EM at the last step over the warm-start's, question by question, averaged over
  seeds, with its paired bootstrap interval.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from searchgym.errors import ConfigError

from .params import Param, as_count, as_names, as_real, as_text
from .rules import WORDS, Kind, fmt
from .summary import em_vector

__all__ = ["CRITERION_KINDS", "Clause", "Verdict", "count_word"]


def as_seed_count(value: Any, where: str) -> int | str:
    if value == "all":
        return "all"
    return as_count(value, where)


@dataclass(frozen=True)
class Verdict:
    """What one criterion says of one arm (``arm`` is ``None`` for a criterion about the study as a whole)."""

    id: str
    name: str
    arm: str | None
    word: str
    details: str

    def line(self) -> str:
        who = f" {self.arm}" if self.arm is not None else ""
        name = f" {self.name}" if self.name else ""
        return f"{self.id}{name}{' —' if name and who else ''}{who}: {self.word} ({self.details})"


def count_word(
    hits: int, done: int, total: int, at_least: int | None = None, at_most: int | None = None
) -> str:
    """MET / NOT MET / undecided for "at least (or at most) N of the ``total`` seeds", ``done`` of them in."""
    missing = max(total - done, 0)
    if at_least is not None:
        if hits >= at_least:
            return "MET"
        return "NOT MET" if hits + missing < at_least else WORDS[2]
    assert at_most is not None
    if hits > at_most:
        return "NOT MET"
    return "MET" if hits + missing <= at_most else WORDS[2]


@dataclass(frozen=True)
class Clause:
    """``when``'s findings all met in at least (or at most) this many seeds."""

    when: tuple[str, ...]
    at_least: int | str | None
    at_most: int | None


def _clauses(value: Any, where: str) -> tuple[Clause, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(
            f"{where}: expected a list of {{ when = [...], at_least = N }} clauses, got {value!r}"
        )
    out = []
    for i, c in enumerate(value):
        here = f"{where}[{i}]"
        if not isinstance(c, dict) or "when" not in c or set(c) - {"when", "at_least", "at_most"}:
            raise ConfigError(
                f"{here}: a clause is {{ when = [NAMES], at_least = N }} (or at_most), got {c!r}"
            )
        out.append(_clause(c, here))
    return tuple(out)


def _clause(c: Mapping[str, Any], where: str) -> Clause:
    if ("at_least" in c) == ("at_most" in c):
        raise ConfigError(f"{where}: give exactly one of at_least and at_most")
    return Clause(
        as_names(c["when"], f"{where}.when"),
        as_seed_count(c["at_least"], f"{where}.at_least") if "at_least" in c else None,
        as_count(c["at_most"], f"{where}.at_most") if "at_most" in c else None,
    )


def seeds_criterion(judge: Any, c: Any) -> list[Verdict]:
    """Per arm: each clause counts the seeds whose findings are all met; MET when every clause is, NOT MET
    when one cannot be any more, undecided otherwise."""
    out = []
    total = len(judge.seeds)
    for arm in judge.arms_of(c.params["arms"]):
        views = judge.views(arm)
        words, parts = [], []
        for clause in c.params["clauses"]:
            hits = [v.seed for v in views if all(v.find(n).met for n in clause.when)]
            need = total if clause.at_least == "all" else clause.at_least
            word = count_word(len(hits), len(views), total, need, clause.at_most)
            words.append(word)
            bound = f">= {need}" if need is not None else f"<= {clause.at_most}"
            parts.append(
                f"{' and '.join(clause.when)} in seeds {hits}: {len(hits)} of {len(views)} run, need {bound} of {total}"
            )
        word = "NOT MET" if "NOT MET" in words else "MET" if all(w == "MET" for w in words) else WORDS[2]
        out.append(Verdict(c.id, c.name, arm, word, "; ".join(parts)))
    return out


def lead_criterion(judge: Any, c: Any) -> list[Verdict]:
    """Per arm: in every seed whose ``event`` happened (at least ``min_events`` of them), the same signal
    turned at least ``lead`` steps before it. Every signal's leads are listed. While seeds are missing, a
    verdict they could change is undecided: a missing seed whose event comes without the lead undoes MET,
    and one with the event can make the criterion applicable; NOT MET stands (no seed adds a lead)."""
    out = []
    for arm in judge.arms_of(c.params["arms"]):
        missing = len(judge.seeds) - len(judge.views(arm))
        views = [v for v in judge.views(arm) if v.find(c.params["event"]).step is not None]
        seeds = [v.seed for v in views]
        if len(views) < c.params["min_events"]:
            word = WORDS[2] if len(views) + missing >= c.params["min_events"] else "not applicable"
            out.append(
                Verdict(
                    c.id,
                    c.name,
                    arm,
                    word,
                    f"{c.params['event']} in {len(views)} seed(s) {seeds}, {c.params['min_events']} needed",
                )
            )
            continue
        leads = {
            sig: [
                None if (on := v.find(sig).step) is None else int(v.find(c.params["event"]).step or 0) - on
                for v in views
            ]
            for sig in c.params["signals"]
        }
        met = [sig for sig, xs in leads.items() if all(x is not None and x >= c.params["lead"] for x in xs)]
        listed = ", ".join(f"{sig} {xs}" for sig, xs in leads.items())
        word = "NOT MET" if not met else WORDS[2] if missing else "MET"
        by = f"by {' and '.join(met)}; " if met else ""
        out.append(
            Verdict(
                c.id,
                c.name,
                arm,
                word,
                f"{by}leads >= {c.params['lead']} asked, in seeds {seeds} with {c.params['event']}: {listed}",
            )
        )
    return out


def pooled_em_gain_criterion(judge: Any, c: Any) -> list[Verdict]:
    """Per arm: greedy EM at the run's last step minus the warm-start's, question by question, averaged over
    the arm's seeds, at least ``at_least`` with its paired bootstrap 95 % interval (questions resampled) above
    0. Undecided until every seed is in."""
    from searchgym.stats import bootstrap_mean

    out = []
    warm = judge.warmstart_vector()
    for arm in judge.arms_of(c.params["arms"]):
        vectors = [em_vector(s, int(s["steps"])) for s in judge.summaries.get(arm, {}).values()]
        finals = [f for f in vectors if warm is not None and f is not None and len(f) == len(warm)]
        if not finals or warm is None:
            out.append(
                Verdict(c.id, c.name, arm, WORDS[2], "no final evaluation paired with the warm-start's")
            )
            continue
        d = [statistics.fmean(col) - w for *col, w in zip(*finals, warm, strict=True)]
        interval = bootstrap_mean(d, resamples=c.params["resamples"])
        met = interval.mean >= c.params["at_least"] and interval.low > 0
        word = WORDS[2] if len(finals) < len(judge.seeds) else "MET" if met else "NOT MET"
        out.append(
            Verdict(
                c.id,
                c.name,
                arm,
                word,
                f"EM gain {fmt(interval.mean)} [{fmt(interval.low)}, {fmt(interval.high)}] over {len(d)} questions, "
                f"{len(finals)} of {len(judge.seeds)} seeds; need >= {fmt(c.params['at_least'])} and the interval above 0",
            )
        )
    return out


_ARMS = Param(as_names, ("trained",), 'arm names, or "trained": every arm but the control')

CRITERION_KINDS: dict[str, Kind] = {
    "seeds": Kind(seeds_criterion, {"arms": _ARMS, "clauses": Param(_clauses)}),
    "lead": Kind(
        lead_criterion,
        {
            "arms": _ARMS,
            "event": Param(as_text),
            "signals": Param(as_names),
            "lead": Param(as_count),
            "min_events": Param(as_count, 2),
        },
    ),
    "pooled_em_gain": Kind(
        pooled_em_gain_criterion,
        {"arms": _ARMS, "at_least": Param(as_real), "resamples": Param(as_count, 10_000)},
    ),
}
"""Every criterion kind, with its parameters. A ``seeds`` criterion may give one clause inline: ``when``,
``at_least`` or ``at_most`` beside ``kind``."""
