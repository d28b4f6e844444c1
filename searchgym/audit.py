"""The answerability audit: whether each question of a dataset *could* be answered from its corpus, and
whether a retriever reaches the evidence at a given top-k.

Per question, three checks:

* ``gold_missing``: the question's named gold passages (the generated world's supporting passages, a
  FlashRAG folder's ``supporting_passage_ids`` or ``gold_passage_ids``) that are not in the corpus;
* ``answer_in_corpus``: whether a golden answer occurs in some passage (title or text) as whole words after
  SQuAD answer normalisation (:func:`searchgym.failures.answer_in_text`);
* ``answer_rank``: the 1-based rank of the first passage holding a golden answer among the results of the
  *oracle query* — the gold passages' titles joined, or the question itself where none are named — searched
  to :data:`DEPTH` results (``None``: not within them). The question is ``reachable`` at top-k when
  ``answer_rank <= k``.

A question is ``answerable`` when no named gold passage is missing and a golden answer is in the corpus; it
is ``unreachable`` when answerable but not reachable at top-k. The shares of both, overall and per question
kind, are what :func:`audit_shares` reports and a result card carries. Yes/no answers are audited like any
other: ``"no"`` is a word of many passages, so for them ``answer_in_corpus`` says little.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from searchgym.data.types import Dataset, Question
from searchgym.errors import ConfigError
from searchgym.failures import UNLABELLED, answer_in_text
from searchgym.retrieval.base import Retriever
from searchgym.rewards import normalize_answer

__all__ = [
    "DEPTH",
    "SHARES",
    "AnswerIndex",
    "audit_questions",
    "audit_shares",
    "audit_table",
    "oracle_query",
]

DEPTH = 100
"""How deep the oracle query's results are searched for the answer (its rank is ``None`` beyond)."""

SHARES = ("unanswerable", "answer_absent", "gold_missing", "unreachable")
"""The shares an audit reports: of the questions, those unanswerable from the corpus (either reason), those
whose golden answers occur in no passage, those with a named gold passage missing from the corpus, and those
answerable but not reached by the retriever at top-k."""


class AnswerIndex:
    """Whole-word search for an answer in a corpus: the passages' normalised text, and an inverted index
    from each normalised word to the passages holding it, so that only candidates are scanned.

    Args:
        passages: The corpus (each passage's title and text are searched together).
    """

    def __init__(self, passages: Sequence[Any]) -> None:
        self.texts = [f" {normalize_answer(f'{p.title} {p.text}')} " for p in passages]
        self.postings: dict[str, set[int]] = {}
        for i, text in enumerate(self.texts):
            for word in set(text.split()):
                self.postings.setdefault(word, set()).add(i)

    def holds(self, answers: Iterable[str]) -> bool:
        """Whether some passage holds one of ``answers`` as whole words (after normalisation)."""
        for answer in answers:
            needle = normalize_answer(answer)
            words = needle.split()
            if not words:
                continue
            candidates = set.intersection(*(self.postings.get(w, set()) for w in words))
            if any(f" {needle} " in self.texts[i] for i in candidates):
                return True
        return False


def oracle_query(question: Question, dataset: Dataset) -> str:
    """The audit's query for ``question``: its gold passages' titles (those in the corpus) joined by spaces,
    or the question itself where it names none or none is in the corpus."""
    index = dataset.passage_index
    titles = [index[pid].title for pid in question.supporting_ids if pid in index]
    return " ".join(dict.fromkeys(titles)) if titles else question.question


def audit_questions(
    dataset: Dataset,
    questions: Sequence[Question],
    retriever: Retriever,
    topk: int,
    *,
    answers: AnswerIndex | None = None,
) -> list[dict[str, Any]]:
    """One audit record per question (see the module docstring), in order.

    Args:
        dataset: The corpus and its passage index.
        questions: The questions to audit.
        retriever: The retriever the oracle queries go to.
        topk: The k at which ``reachable`` is judged.
        answers: A prebuilt :class:`AnswerIndex` of the corpus (built here when not given).

    Returns:
        Records with ``question_id``, ``kind``, ``golden_answers``, ``gold_named``, ``gold_missing`` (ids),
        ``answer_in_corpus``, ``query``, ``answer_rank``, ``answerable``, ``reachable`` and ``topk``.

    Raises:
        ConfigError: ``topk`` is not a positive integer.
    """
    if isinstance(topk, bool) or not isinstance(topk, int) or topk <= 0:
        raise ConfigError(f"--topk must be a positive integer, got {topk!r}")
    index = dataset.passage_index
    answers = answers if answers is not None else AnswerIndex(dataset.passages)
    queries = [oracle_query(q, dataset) for q in questions]
    depth = max(DEPTH, topk)
    hits = retriever.search(queries, depth) if queries else []
    records = []
    for question, query, found in zip(questions, queries, hits, strict=True):
        missing = [pid for pid in question.supporting_ids if pid not in index]
        in_corpus = answers.holds(question.golden_answers)
        rank = next(
            (
                n
                for n, hit in enumerate(found, start=1)
                if answer_in_text(question.golden_answers, f"{hit.title} {hit.text}")
            ),
            None,
        )
        answerable = in_corpus and not missing
        records.append(
            {
                "question_id": question.id,
                "kind": question.kind or UNLABELLED,
                "golden_answers": list(question.golden_answers),
                "gold_named": bool(question.supporting_ids),
                "gold_missing": missing,
                "answer_in_corpus": in_corpus,
                "query": query,
                "answer_rank": rank,
                "answerable": answerable,
                "reachable": answerable and rank is not None and rank <= topk,
                "topk": topk,
            }
        )
    return records


def _counts(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    n = len(records)
    counts = {
        "unanswerable": sum(not r["answerable"] for r in records),
        "answer_absent": sum(not r["answer_in_corpus"] for r in records),
        "gold_missing": sum(bool(r["gold_missing"]) for r in records),
        "unreachable": sum(bool(r["answerable"]) and not r["reachable"] for r in records),
    }
    return {
        "questions": n,
        **{f"{k}_count": v for k, v in counts.items()},
        **{k: (v / n if n else 0.0) for k, v in counts.items()},
    }


def audit_shares(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The audit's counts and shares (:data:`SHARES`), overall and per question kind.

    Returns:
        ``questions``, ``topk``, each share and its ``*_count``, and ``kinds``: the same per kind, in order
        of first appearance.
    """
    kinds: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        kinds.setdefault(str(r.get("kind") or UNLABELLED), []).append(r)
    topk = records[0]["topk"] if records else None
    return {
        **_counts(records),
        "topk": topk,
        "kinds": {kind: _counts(rs) for kind, rs in kinds.items()},
    }


def audit_table(shares: Mapping[str, Any]) -> list[str]:
    """Markdown lines of an :func:`audit_shares` result: one row overall, one per kind (where several)."""
    heads = [
        "kind",
        "questions",
        "unanswerable",
        "answer absent",
        "gold missing",
        f"unreachable at k={shares['topk']}",
    ]
    lines = ["| " + " | ".join(heads) + " |", "|---" * len(heads) + "|"]
    kinds = shares.get("kinds") or {}
    rows = [("all", shares), *(kinds.items() if len(kinds) > 1 or UNLABELLED not in kinds else ())]
    for kind, c in rows:
        cells = [f"{c[f'{k}_count']} ({c[k]:.1%})" for k in SHARES]
        lines.append(f"| {kind} | {c['questions']} | " + " | ".join(cells) + " |")
    return lines
