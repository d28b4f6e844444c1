"""Hybrid retrieval: several retrievers' rankings fused by reciprocal rank (RRF).

Each retriever ranks its top ``depth`` passages; a passage's fused score is the sum over the retrievers of
``1 / (k0 + rank)`` (rank 1 is the best; a retriever that did not return the passage adds nothing). RRF
needs no score calibration between, say, BM25 scores and cosine similarities, which live on unrelated
scales (Cormack, Clarke and Büttcher, SIGIR 2009, with ``k0 = 60``).
"""

from __future__ import annotations

from collections.abc import Sequence

from searchgym.data.types import Passage
from searchgym.errors import ConfigError
from searchgym.retrieval.base import Hit, Retriever

__all__ = ["HybridRetriever"]


class HybridRetriever(Retriever):
    """Reciprocal-rank fusion of several retrievers over the same corpus.

    Every part answers the whole batch in one call, so a batch stays a batch. Fused results are by
    decreasing fused score, ties broken by corpus position.

    Args:
        retrievers: The parts (e.g. BM25 and dense), all over ``passages``.
        passages: The corpus (to break ties by position and to render hits).
        depth: Hits taken from each part per query (at least the ``k`` asked).
        k0: The RRF constant: larger values flatten the difference between the first ranks.

    Raises:
        ConfigError: no retriever, or a non-positive ``depth`` or negative ``k0``.
    """

    name = "hybrid"

    def __init__(
        self, retrievers: Sequence[Retriever], passages: Sequence[Passage], depth: int = 50, k0: float = 60.0
    ) -> None:
        if not retrievers:
            raise ConfigError("a hybrid retriever needs at least one retriever to fuse")
        if not isinstance(depth, int) or depth < 1:
            raise ConfigError(f"depth must be a positive integer, got {depth!r}")
        if not (isinstance(k0, int | float) and k0 >= 0):
            raise ConfigError(f"k0 must be a number >= 0, got {k0!r}")
        self.retrievers = list(retrievers)
        self.passages = list(passages)
        self.position = {p.id: i for i, p in enumerate(self.passages)}
        self.depth = depth
        self.k0 = float(k0)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if isinstance(queries, str):
            raise TypeError("queries must be a sequence of strings, not one string")
        if not queries:
            return []
        if k <= 0:
            return [[] for _ in queries]
        depth = max(k, self.depth)
        fused: list[dict[int, float]] = [{} for _ in queries]
        for retriever in self.retrievers:
            for scores, hits in zip(fused, retriever.search(queries, depth), strict=True):
                for rank, hit in enumerate(hits, start=1):
                    at = self.position.get(hit.passage_id)
                    if at is None:
                        raise ConfigError(
                            f"{retriever.name} returned passage {hit.passage_id!r}, which is not in the "
                            "hybrid retriever's corpus; fuse retrievers over the same corpus"
                        )
                    scores[at] = scores.get(at, 0.0) + 1.0 / (self.k0 + rank)
        out = []
        for scores in fused:
            best = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:k]
            out.append([Hit.of(self.passages[at], score) for at, score in best])
        return out

    @property
    def nbytes(self) -> int:
        """The parts' index bytes (those that report them)."""
        return sum(int(getattr(r, "nbytes", 0)) for r in self.retrievers)

    def close(self) -> None:
        for retriever in self.retrievers:
            retriever.close()
