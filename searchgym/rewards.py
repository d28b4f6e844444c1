"""Answer normalisation and answer metrics (exact match, sub-exact match, token F1).

SQuAD-style normalisation, as Search-R1 and FlashRAG use it: lower case, drop punctuation, drop the
articles *a*, *an*, *the*, collapse white space. Every function here is pure and deterministic.

Golden answers are a string or a sequence of strings, as in Search-R1's scorer: a lone string is one
answer (never iterated character by character). F1 follows HotpotQA's and FlashRAG's rule for the special
answers *yes*, *no* and *noanswer*: such a prediction or golden answer scores 0 unless the two are equal.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Literal

from searchgym.errors import ConfigError

__all__ = [
    "METRICS",
    "SPECIAL_ANSWERS",
    "AnswerMetric",
    "exact_match",
    "f1_score",
    "get_metric",
    "normalize_answer",
    "sub_exact_match",
]

AnswerMetric = Literal["em", "subem", "f1"]

Golden = str | Sequence[str]
"""One golden answer, or several (any of them scores)."""

#: Normalised answers that F1 scores all-or-nothing (HotpotQA's and FlashRAG's rule).
SPECIAL_ANSWERS = frozenset({"yes", "no", "noanswer"})

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Normalises an answer string the SQuAD way: lower case, no punctuation, no articles, single spaces."""
    text = text.lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _answers(golden_answers: Golden) -> list[str]:
    """The golden answers as a list: a lone string is one answer; anything but strings is refused."""
    if isinstance(golden_answers, str):
        return [golden_answers]
    if isinstance(golden_answers, bytes | bytearray):
        raise ConfigError("golden answers must be a str or a sequence of str, not bytes")
    answers = list(golden_answers)
    for answer in answers:
        if not isinstance(answer, str):
            raise ConfigError(f"golden answers must be strings, got {type(answer).__name__}: {answer!r}")
    return answers


def exact_match(prediction: str, golden_answers: Golden) -> float:
    """1.0 when the normalised prediction equals any normalised golden answer, else 0.0.

    >>> exact_match("paris.", "Paris")
    1.0
    """
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _answers(golden_answers)))


def sub_exact_match(prediction: str, golden_answers: Golden) -> float:
    """1.0 when any normalised golden answer is a substring of the normalised prediction, else 0.0.

    An empty golden answer never matches (every string would contain it).
    """
    pred = normalize_answer(prediction)
    return float(any((g_norm := normalize_answer(g)) and g_norm in pred for g in _answers(golden_answers)))


def f1_score(prediction: str, golden_answers: Golden) -> float:
    """Best token-level F1 between the normalised prediction and any normalised golden answer.

    A prediction or golden answer that normalises to ``yes``, ``no`` or ``noanswer`` scores 0 against
    that golden answer unless the two are equal (:data:`SPECIAL_ANSWERS`).
    """
    pred_norm = normalize_answer(prediction)
    pred_tokens = pred_norm.split()
    best = 0.0
    for gold in _answers(golden_answers):
        gold_norm = normalize_answer(gold)
        if (pred_norm in SPECIAL_ANSWERS or gold_norm in SPECIAL_ANSWERS) and pred_norm != gold_norm:
            continue
        gold_tokens = gold_norm.split()
        common = Counter(pred_tokens) & Counter(gold_tokens)
        overlap = sum(common.values())
        if overlap == 0:
            continue
        precision = overlap / len(pred_tokens)
        recall = overlap / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


METRICS: dict[str, Callable[[str, Golden], float]] = {
    "em": exact_match,
    "subem": sub_exact_match,
    "f1": f1_score,
}


def get_metric(name: str) -> Callable[[str, Golden], float]:
    """Returns the answer metric called ``name``; an unknown name lists the valid ones."""
    try:
        return METRICS[name]
    except KeyError:
        raise ConfigError(f"unknown reward {name!r}; choose one of {sorted(METRICS)}") from None
