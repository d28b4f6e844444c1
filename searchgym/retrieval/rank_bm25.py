"""BM25 through the ``rank-bm25`` package: the reference implementation."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from searchgym.data.types import Passage
from searchgym.retrieval.base import Hit, Retriever, analyze

__all__ = ["RankBM25Retriever"]


def top_k_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest scores, by decreasing score, ties broken by lower index.

    Args:
        scores: ``(N,)`` scores.
        k: How many to keep (clipped to ``N``).
    """
    k = min(k, scores.shape[0])
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    # lexsort sorts by the last key first: descending score, then ascending index.
    candidates = np.argpartition(-scores, k - 1)[:k] if k < scores.shape[0] else np.arange(scores.shape[0])
    threshold = scores[candidates].min()
    pool = np.flatnonzero(scores >= threshold)  # every index tied with the k-th score competes
    order = np.lexsort((pool, -scores[pool]))
    return pool[order[:k]]


class RankBM25Retriever(Retriever):
    """BM25 (Okapi) over a passage list, with ``rank_bm25.BM25Okapi``; queries are scored one by one.

    Args:
        passages: The corpus. Each passage is indexed as ``title + " " + text``.
        k1: Term-frequency saturation.
        b: Length normalisation.
    """

    name = "rank_bm25"

    def __init__(self, passages: Sequence[Passage], k1: float = 1.5, b: float = 0.75) -> None:
        from rank_bm25 import BM25Okapi

        self.passages = list(passages)
        self._bm25 = BM25Okapi([analyze(f"{p.title} {p.text}") for p in self.passages], k1=k1, b=b)

    def scores(self, query: str) -> np.ndarray:
        """``(N,)`` BM25 scores of every passage for ``query``."""
        return np.asarray(self._bm25.get_scores(analyze(query)), dtype=np.float64)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        results = []
        for query in queries:
            scores = self.scores(query)
            results.append([Hit.of(self.passages[i], scores[i]) for i in top_k_indices(scores, k)])
        return results
