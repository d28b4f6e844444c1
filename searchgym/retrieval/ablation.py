"""Retriever ablations: the retriever replaced by one that gives no evidence, to measure how much an agent's
score comes from search (``searchgym benchmark --ablate``).

Three kinds, each a function of the query alone (so every agent that sends a query gets the same results):

* ``empty``: no passages;
* ``random``: ``k`` passages drawn uniformly from the corpus, seeded by the query's CRC-32;
* ``shuffled``: the passages of another question — the inner retriever's top-``k`` for the text of a
  question of the dataset, the first in a query-seeded order whose results share no passage with the
  query's own top-``k`` (relevant-looking passages about something else).

A spec ``"ablate:KIND;INNER"`` (``ablate:shuffled;bm25``) names one for
:func:`~searchgym.retrieval.make_retriever`; the ablated retriever's spec is what a run's identity and result
card record, so ablated episodes never mix with real ones.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

import numpy as np

from searchgym.data.types import Passage
from searchgym.errors import ConfigError
from searchgym.retrieval.base import Hit, Retriever

__all__ = ["ABLATIONS", "AblatedRetriever", "ablation_spec", "parse_ablation_spec", "parse_ablations"]

ABLATIONS = ("empty", "random", "shuffled")
"""The ablation kinds, in the order a report lists them."""

PREFIX = "ablate:"

_CANDIDATES = 8
"""How many other questions ``shuffled`` tries before giving the last one's results."""


def parse_ablations(text: str) -> list[str]:
    """The kinds of an ``--ablate`` value (``"empty,random"``), each once, in :data:`ABLATIONS` order.

    Raises:
        ConfigError: an unknown or missing kind (the valid ones are listed).
    """
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in ABLATIONS]
    if unknown or not kinds:
        raise ConfigError(
            f"--ablate {text}: unknown ablation {', '.join(map(repr, unknown)) or '(none given)'}; "
            f"choose from {', '.join(ABLATIONS)} (comma-separated)"
        )
    return [k for k in ABLATIONS if k in kinds]


def ablation_spec(kind: str, inner: str) -> str:
    """The retriever spec of ``kind`` over the retriever spec ``inner``: ``ablate:KIND;INNER``."""
    return f"{PREFIX}{kind};{inner}"


def parse_ablation_spec(spec: str) -> tuple[str, str]:
    """``(kind, inner)`` of an ``ablate:KIND;INNER`` spec (``INNER`` defaults to ``bm25``).

    Raises:
        ConfigError: the spec does not start with ``ablate:`` or names an unknown kind.
    """
    if not spec.startswith(PREFIX):
        raise ConfigError(f"retriever {spec!r} is not an ablation (ablate:KIND;INNER)")
    kind, _, inner = spec[len(PREFIX) :].partition(";")
    if kind not in ABLATIONS:
        raise ConfigError(
            f"retriever {spec!r}: unknown ablation {kind!r}; choose from {', '.join(ABLATIONS)}"
        )
    return kind, inner or "bm25"


def _seed(query: str) -> int:
    return zlib.crc32(query.encode("utf-8"))


class AblatedRetriever(Retriever):
    """A retriever replaced by an ablation (see the module docstring).

    Args:
        kind: One of :data:`ABLATIONS`.
        inner: The real retriever (``shuffled`` searches it; closed by :meth:`close`).
        passages: The corpus ``random`` draws from.
        questions: The question texts ``shuffled`` takes other questions' results for (read on first use).
    """

    def __init__(
        self,
        kind: str,
        inner: Retriever,
        passages: Sequence[Passage],
        questions: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        if kind not in ABLATIONS:
            raise ConfigError(f"unknown ablation {kind!r}; choose from {', '.join(ABLATIONS)}")
        self.kind = kind
        self.name = f"ablate:{kind}"
        self.inner = inner
        self.passages = passages
        self._questions = questions
        self._texts: list[str] | None = None

    def _other_questions(self) -> list[str]:
        if self._texts is None:
            texts = list(dict.fromkeys(self._questions() if self._questions is not None else ()))
            if not texts:
                raise ConfigError("the shuffled ablation needs the dataset's questions, and got none")
            self._texts = texts
        return self._texts

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if self.kind == "empty":
            return [[] for _ in queries]
        if self.kind == "random":
            n = len(self.passages)
            return [
                [
                    Hit.of(self.passages[int(i)], 0.0)
                    for i in np.random.default_rng(_seed(q)).choice(n, min(k, n), replace=False)
                ]
                for q in queries
            ]
        texts = self._other_questions()
        own = self.inner.search(queries, k)
        out = []
        for query, hits in zip(queries, own, strict=True):
            taken = {h.passage_id for h in hits}
            order = np.random.default_rng(_seed(query)).permutation(len(texts))[:_CANDIDATES]
            candidates = [texts[int(i)] for i in order if texts[int(i)] != query]
            results = self.inner.search(candidates, k) if candidates else [[]]
            chosen = next((r for r in results if not taken & {h.passage_id for h in r}), results[-1])
            out.append(list(chosen))
        return out

    def close(self) -> None:
        self.inner.close()
