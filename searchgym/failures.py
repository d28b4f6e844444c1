"""Why answers fail: each missed episode placed at the stage where it went wrong, overall and per question
kind, and the questions two agents trade between stages.

An episode record (an ``eval --out`` line) is ``correct`` (exact match) or missed at one stage, checked in
this order:

* ``no_answer``: the episode ended without an answer (turn budget or context limit);
* ``not_retrieved``: the evidence was never in front of the agent. Where the dataset names gold passages
  (the generated world's supporting passages, a FlashRAG folder's ``supporting_passage_ids`` or
  ``gold_passage_ids``), that is "some gold passage was never retrieved" (``gold_all_retrieved`` false: a
  multi-hop question needs all of them); where it names none, "no golden answer appears, as whole words
  after SQuAD normalisation, in any tool output of the transcript";
* ``misread``: the evidence was retrieved and the answer is still wrong.

The gold-passage rule is preferred because a golden answer string also appears in passages that do not
support it (a year, a yes/no answer — "no" is a word of many passages), and may be absent from the
passage that does (an alias). Everything here is pure: records in, counts out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from searchgym.rewards import f1_score, normalize_answer

__all__ = [
    "MISSES",
    "OUTCOMES",
    "answer_in_text",
    "decompose",
    "episode_stage",
    "failure_table",
    "flip_table",
    "flips_table",
    "near_miss",
    "near_misses",
    "retrieval_rule",
    "tool_text",
]

MISSES = ("no_answer", "not_retrieved", "misread")
"""The stages a missed episode can fail at, in the order they are checked."""

OUTCOMES = ("correct", *MISSES)

LABELS = {
    "correct": "correct",
    "no_answer": "no answer",
    "not_retrieved": "gold not retrieved",
    "misread": "retrieved, misread",
}
"""How each outcome is named in a table."""

UNLABELLED = "(no kind)"
"""The kind of a question whose dataset gives none."""

# A segment ends at its closing mark only where the next segment (or the end) follows, as the transcript's
# segments are written (``Episode.render_text``): a policy that writes "[tool]" makes no tool segment.
_SEGMENT = re.compile(r"\[(prompt|policy|tool)\](.*?)\[/\1\](?=\[(?:prompt|policy|tool)\]|\Z)", re.DOTALL)


def tool_text(transcript: str) -> str:
    """The text of every tool segment of a record's ``transcript``, joined by newlines.

    >>> tool_text("[prompt]Q[/prompt][policy]<search> x </search>[/policy][tool]<information>Doc[/tool]")
    '<information>Doc'
    """
    parts, at = [], 0
    while (segment := _SEGMENT.match(transcript, at)) is not None:
        if segment.group(1) == "tool":
            parts.append(segment.group(2))
        at = segment.end()
    return "\n".join(parts)


def answer_in_text(golden_answers: Sequence[str], text: str) -> bool:
    """Whether a golden answer appears in ``text`` as whole words, both SQuAD-normalised.

    >>> answer_in_text(["The Beatles"], "formed by beatles, in 1960"), answer_in_text(["no"], "not now")
    (True, False)
    """
    haystack = f" {normalize_answer(text)} "
    return any(
        needle and f" {needle} " in haystack for needle in (normalize_answer(a) for a in golden_answers)
    )


def retrieval_rule(record: Mapping[str, Any]) -> str:
    """``"gold_passages"`` when the record's question names gold passages, else ``"answer_string"``."""
    if record.get("gold_all_retrieved") is not None or record.get("gold_retrieved") is not None:
        return "gold_passages"
    return "answer_string"


def _retrieved(record: Mapping[str, Any]) -> bool:
    if record.get("gold_all_retrieved") is not None:
        return bool(record["gold_all_retrieved"])
    if record.get("gold_retrieved") is not None:  # a record with one flag only: its question has one hop
        return bool(record["gold_retrieved"])
    return answer_in_text(record.get("golden_answers") or [], tool_text(record.get("transcript") or ""))


def episode_stage(record: Mapping[str, Any]) -> str:
    """``"correct"`` or the stage the episode failed at (see the module docstring).

    >>> episode_stage({"em": 0.0, "answer": "Paris", "gold_all_retrieved": True})
    'misread'
    """
    if float(record["em"]) >= 1.0:
        return "correct"
    if record.get("answer") is None:
        return "no_answer"
    return "misread" if _retrieved(record) else "not_retrieved"


def _counts(stages: Sequence[str]) -> dict[str, int]:
    return {"episodes": len(stages), **{o: stages.count(o) for o in OUTCOMES}}


def decompose(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The episodes' outcomes counted by stage, overall and per question kind.

    Returns:
        ``episodes``, one count per outcome (``correct``, ``no_answer``, ``not_retrieved``, ``misread``),
        ``rules`` (how many episodes' retrieval was judged by ``gold_passages`` and by ``answer_string``) and
        ``kinds``: the same counts per ``question_kind`` (:data:`UNLABELLED` for a question without one), in
        order of first appearance.
    """
    stages = [episode_stage(r) for r in records]
    kinds: dict[str, list[str]] = {}
    for record, stage in zip(records, stages, strict=True):
        kinds.setdefault(str(record.get("question_kind") or UNLABELLED), []).append(stage)
    rules = [retrieval_rule(r) for r in records]
    return {
        **_counts(stages),
        "rules": {rule: rules.count(rule) for rule in ("gold_passages", "answer_string")},
        "kinds": {kind: _counts(s) for kind, s in kinds.items()},
    }


def flip_table(baseline: Sequence[Mapping[str, Any]], agent: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The episodes two agents played on the same questions, in the same order, compared by outcome.

    Returns:
        ``gained``: per stage, the episodes the baseline missed at that stage and the agent got right;
        ``lost``: per stage, the episodes the baseline got right and the agent missed at that stage;
        ``transitions``: ``transitions[baseline's outcome][agent's outcome]``, every pair counted.

    Raises:
        ValueError: the two played different questions (ids or counts differ).
    """
    if [r.get("question_id") for r in baseline] != [r.get("question_id") for r in agent]:
        raise ValueError("a flip table needs the same questions in the same order")
    transitions = {a: dict.fromkeys(OUTCOMES, 0) for a in OUTCOMES}
    for before, after in zip(baseline, agent, strict=True):
        transitions[episode_stage(before)][episode_stage(after)] += 1
    return {
        "gained": {s: transitions[s]["correct"] for s in MISSES},
        "lost": {s: transitions["correct"][s] for s in MISSES},
        "transitions": transitions,
    }


def _share(n: int, total: int) -> str:
    return f"{n} ({n / total:.0%})" if total else "0"


def failure_table(rows: Sequence[tuple[Sequence[str], Mapping[str, Any]]], heads: Sequence[str]) -> list[str]:
    """Markdown lines of outcome counts: one row per ``(cells, counts)``, the cells under ``heads``, then the
    episodes and each outcome's count with its share of the episodes."""
    lines = [
        "| " + " | ".join([*heads, "episodes", *(LABELS[o] for o in OUTCOMES)]) + " |",
        "|---" * (len(heads) + 1 + len(OUTCOMES)) + "|",
    ]
    for cells, counts in rows:
        shares = [_share(int(counts[o]), int(counts["episodes"])) for o in OUTCOMES]
        lines.append("| " + " | ".join([*cells, str(counts["episodes"]), *shares]) + " |")
    return lines


def flips_table(
    rows: Sequence[tuple[Sequence[str], Mapping[str, Any]]], heads: Sequence[str], baseline: str
) -> list[str]:
    """Markdown lines of flip tables (:func:`flip_table`): per row and stage, the episodes gained and lost."""
    titles = [
        "stage of the miss",
        f"gained (missed by {baseline}, right here)",
        f"lost (right by {baseline}, missed here)",
    ]
    lines = ["| " + " | ".join([*heads, *titles]) + " |", "|---" * (len(heads) + 3) + "|"]
    for cells, flips in rows:
        for stage in MISSES:
            row = [*cells, LABELS[stage], str(flips["gained"][stage]), str(flips["lost"][stage])]
            lines.append("| " + " | ".join(row) + " |")
    return lines


FAILURE_COLUMNS = ("kind", "episodes", *(LABELS[o] for o in OUTCOMES))
"""The columns of :func:`failure_rows`."""


def failure_rows(decomposition: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A :func:`decompose` result as table rows: ``all`` first, then one per question kind (when the
    questions have more than one kind, or one that is named), each count with its share of the episodes."""
    kinds = decomposition.get("kinds") or {}
    named = list(kinds.items()) if len(kinds) > 1 or UNLABELLED not in kinds else []
    rows = []
    for kind, counts in [("all", decomposition), *named]:
        total = int(counts["episodes"])
        rows.append(
            {"kind": kind, "episodes": total, **{LABELS[o]: _share(int(counts[o]), total) for o in OUTCOMES}}
        )
    return rows


NEAR_F1 = 0.8
"""The token F1 against a golden answer from which an EM-0 answer counts as a near miss."""


def near_miss(record: Mapping[str, Any]) -> str | None:
    """Why an answered EM-0 episode may be right after all: ``"contains_gold"`` (a golden answer occurs in
    the answer as whole words, after SQuAD normalisation) or ``"high_f1"`` (token F1 of at least
    :data:`NEAR_F1` against a golden answer); ``None`` for a correct, unanswered or plainly wrong one.

    >>> near_miss({"em": 0.0, "answer": "the city of Paris", "golden_answers": ["Paris"]})
    'contains_gold'
    >>> near_miss({"em": 0.0, "answer": "Lyon", "golden_answers": ["Paris"]}) is None
    True
    """
    answer = record.get("answer")
    if float(record["em"]) >= 1.0 or answer is None:
        return None
    golden = list(record.get("golden_answers") or [])
    if answer_in_text(golden, str(answer)):
        return "contains_gold"
    if golden and f1_score(str(answer), golden) >= NEAR_F1:
        return "high_f1"
    return None


def near_misses(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Exact match's near misses among the episodes: of the answered EM-0 ones (``wrong``), how many hold a
    golden answer (``contains_gold``), how many more reach F1 >= :data:`NEAR_F1` (``high_f1``), both together
    (``near``) and ``share`` = ``near / wrong`` (0 with none wrong)."""
    wrong = [r for r in records if float(r["em"]) < 1.0 and r.get("answer") is not None]
    why = [near_miss(r) for r in wrong]
    near = sum(w is not None for w in why)
    return {
        "wrong": len(wrong),
        "contains_gold": why.count("contains_gold"),
        "high_f1": why.count("high_f1"),
        "near": near,
        "share": near / len(wrong) if wrong else 0.0,
    }
