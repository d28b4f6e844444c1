"""The answerability audit: whether each question of a dataset *could* be answered from its corpus, and
whether a retriever reaches the evidence at a given top-k.

Per question, three checks:

* ``gold_missing``: the question's named gold passages (the generated world's supporting passages, a
  FlashRAG folder's ``supporting_passage_ids`` or ``gold_passage_ids``) that are not in the corpus;
* ``answer_in_corpus``: whether a golden answer occurs in some passage (title or text) as whole words after
  SQuAD answer normalisation — with punctuation deleted, as exact match does, or made a word break, so
  that ``Warhol's`` holds ``Andy Warhol`` (:func:`holds_answer`);
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

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from searchgym.data.types import Dataset, Question
from searchgym.errors import ConfigError
from searchgym.failures import UNLABELLED
from searchgym.retrieval.base import Retriever
from searchgym.rewards import normalize_answer

__all__ = [
    "DEPTH",
    "NORMALISATIONS",
    "SHARES",
    "AnswerIndex",
    "audit_questions",
    "audit_shares",
    "audit_table",
    "holds_answer",
    "oracle_query",
]

DEPTH = 100
"""How deep the oracle query's results are searched for the answer (its rank is ``None`` beyond)."""

SHARES = ("unanswerable", "answer_absent", "gold_missing", "unreachable")
"""The shares an audit reports: of the questions, those unanswerable from the corpus (either reason), those
whose golden answers occur in no passage, those with a named gold passage missing from the corpus, and those
answerable but not reached by the retriever at top-k."""


_PUNCTUATION = re.compile(r"[^\w\s]")
"""Any character neither a word character nor white space: ASCII punctuation, dashes, quotes of any script."""


def _spaced(text: str) -> str:
    """SQuAD normalisation with punctuation made a word break first: ``Warhol's`` gives ``warhol s``, where
    the plain normalisation's deletion gives ``warhols``, a word the answer ``Andy Warhol`` is not in."""
    return normalize_answer(_PUNCTUATION.sub(" ", text))


NORMALISATIONS = (normalize_answer, _spaced)
"""The two ways text and answers are normalised before they are matched (the same one on both sides): SQuAD's
(ASCII punctuation deleted, as exact match does) and SQuAD's after every punctuation mark, dashes and
quotes included, becomes a space (so a possessive, a hyphen or a dash does not hide a name)."""


def holds_answer(golden_answers: Iterable[str], text: str) -> bool:
    """Whether ``text`` holds a golden answer as whole words under either of :data:`NORMALISATIONS`.

    >>> holds_answer(["Andy Warhol"], "a print of Andy Warhol's"), holds_answer(["no"], "not now")
    (True, False)
    """
    answers = list(golden_answers)
    for normalise in NORMALISATIONS:
        haystack = f" {normalise(text)} "
        if any(needle and f" {needle} " in haystack for needle in (normalise(a) for a in answers)):
            return True
    return False


class AnswerIndex:
    """Whole-word search for an answer in a corpus: the passages' text under each of
    :data:`NORMALISATIONS`, with an inverted index from each word to the passages holding it, so that only
    candidates are scanned.

    Args:
        passages: The corpus (each passage's title and text are searched together).
    """

    def __init__(self, passages: Sequence[Any]) -> None:
        self.texts: list[list[str]] = []
        self.postings: list[dict[str, set[int]]] = []
        for normalise in NORMALISATIONS:
            texts = [f" {normalise(f'{p.title} {p.text}')} " for p in passages]
            postings: dict[str, set[int]] = {}
            for i, text in enumerate(texts):
                for word in set(text.split()):
                    postings.setdefault(word, set()).add(i)
            self.texts.append(texts)
            self.postings.append(postings)

    def holds(self, answers: Iterable[str]) -> bool:
        """Whether some passage holds one of ``answers`` as whole words (:func:`holds_answer`)."""
        answers = list(answers)
        for normalise, texts, postings in zip(NORMALISATIONS, self.texts, self.postings, strict=True):
            for answer in answers:
                needle = normalise(answer)
                words = needle.split()
                if not words:
                    continue
                candidates = set.intersection(*(postings.get(w, set()) for w in words))
                if any(f" {needle} " in texts[i] for i in candidates):
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
                if holds_answer(question.golden_answers, f"{hit.title} {hit.text}")
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
