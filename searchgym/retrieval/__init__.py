"""Retrieval: a batched retriever interface and its backends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from searchgym.data.types import Passage
from searchgym.errors import ConfigError
from searchgym.retrieval.base import Hit, Retriever, analyze
from searchgym.retrieval.rank_bm25 import RankBM25Retriever

__all__ = ["BACKENDS", "Hit", "RankBM25Retriever", "Retriever", "analyze", "make_retriever"]

BACKENDS = ("rank_bm25",)


def make_retriever(spec: Any, passages: Sequence[Passage]) -> Retriever:
    """Resolves a retriever argument.

    Args:
        spec: A :class:`Retriever` (used as is), or the name of a backend in :data:`BACKENDS`
            (``"bm25"`` is the default backend's alias).
        passages: The corpus to index for named backends.
    """
    if isinstance(spec, Retriever):
        return spec
    if spec in ("bm25", "rank_bm25", None):
        return RankBM25Retriever(passages)
    raise ConfigError(f"unknown retriever {spec!r}; choose one of {['bm25', *BACKENDS]} or pass a Retriever")
