"""Answer normalisation and answer metrics (exact match, sub-exact match, token F1).

SQuAD-style normalisation, as Search-R1 and FlashRAG use it: lower case, drop punctuation, drop the
articles *a*, *an*, *the*, collapse white space. Every function here is pure and deterministic.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Literal

__all__ = [
    "METRICS",
    "AnswerMetric",
    "exact_match",
    "f1_score",
    "get_metric",
    "normalize_answer",
    "sub_exact_match",
]

AnswerMetric = Literal["em", "subem", "f1"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Normalises an answer string the SQuAD way: lower case, no punctuation, no articles, single spaces."""
    text = text.lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golden_answers: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals any normalised golden answer, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golden_answers))


def sub_exact_match(prediction: str, golden_answers: Sequence[str]) -> float:
    """1.0 when any normalised golden answer is a substring of the normalised prediction, else 0.0.

    An empty golden answer never matches (every string would contain it).
    """
    pred = normalize_answer(prediction)
    return float(any((g_norm := normalize_answer(g)) and g_norm in pred for g in golden_answers))


def f1_score(prediction: str, golden_answers: Sequence[str]) -> float:
    """Best token-level F1 between the normalised prediction and any normalised golden answer."""
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for gold in golden_answers:
        gold_tokens = normalize_answer(gold).split()
        common = Counter(pred_tokens) & Counter(gold_tokens)
        overlap = sum(common.values())
        if overlap == 0:
            continue
        precision = overlap / len(pred_tokens)
        recall = overlap / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


METRICS: dict[str, Callable[[str, Sequence[str]], float]] = {
    "em": exact_match,
    "subem": sub_exact_match,
    "f1": f1_score,
}


def get_metric(name: str) -> Callable[[str, Sequence[str]], float]:
    """Returns the answer metric called ``name``; an unknown name lists the valid ones."""
    from searchgym.errors import ConfigError

    try:
        return METRICS[name]
    except KeyError:
        raise ConfigError(f"unknown reward {name!r}; choose one of {sorted(METRICS)}") from None
