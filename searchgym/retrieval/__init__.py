"""Retrieval: a batched retriever interface and its backends.

Backends, by name (see :func:`make_retriever`):

* ``"bm25"`` (default): :class:`BM25Retriever`, the fast sparse-matrix BM25;
* ``"rank_bm25"``: :class:`RankBM25Retriever`, the ``rank-bm25`` reference (slow; for comparisons);
* ``"dense:INDEX_DIR"``: :class:`~searchgym.retrieval.dense.DenseRetriever` over an index folder written by
  ``searchgym index dense`` (needs the ``dense`` extra);
* ``"hybrid:INDEX_DIR"``: :class:`HybridRetriever`, BM25 and that dense index fused by reciprocal rank;
* an ``http://`` or ``https://`` URL: :class:`~searchgym.retrieval.http.HttpRetriever`, a client of a
  Search-R1-compatible ``/retrieve`` server such as ``searchgym serve``;
* ``"cassette:PATH"``: :class:`Cassette`, the searches recorded in PATH replayed with no index
  (``"cassette:PATH;record=SPEC"`` records SPEC's, ``";record-missing=SPEC"`` fills the gaps);
* ``"ablate:KIND;SPEC"``: SPEC's retriever replaced by an ablation (``empty``, ``random``, ``shuffled``:
  :mod:`searchgym.retrieval.ablation`).

:class:`FaultyRetriever` and :class:`RetrieverFaults` inject seeded retriever faults.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from searchgym.data.types import Passage
from searchgym.errors import ConfigError
from searchgym.retrieval.base import STOP_WORDS, Analyzer, Hit, Retriever, analyze
from searchgym.retrieval.bm25 import BM25Retriever
from searchgym.retrieval.cassette import Cassette, CassetteMissError, cassette_from_spec
from searchgym.retrieval.faults import FaultyRetriever, RetrieverFaults
from searchgym.retrieval.hybrid import HybridRetriever
from searchgym.retrieval.rank_bm25 import RankBM25Retriever

__all__ = [
    "BACKENDS",
    "STOP_WORDS",
    "Analyzer",
    "BM25Retriever",
    "Cassette",
    "CassetteMissError",
    "FaultyRetriever",
    "Hit",
    "HybridRetriever",
    "RankBM25Retriever",
    "Retriever",
    "RetrieverFaults",
    "analyze",
    "make_retriever",
]

#: Backend names accepted by :func:`make_retriever`; the first is the default.
BACKENDS = ("bm25", "rank_bm25")


def make_retriever(
    spec: Any,
    passages: Sequence[Passage],
    *,
    patience: float = 0.0,
    questions: Callable[[], Sequence[str]] | None = None,
) -> Retriever:
    """Resolves a retriever argument.

    Args:
        spec: A :class:`Retriever` (used as is); ``None`` or a backend name in :data:`BACKENDS` (``None``
            is ``"bm25"``); ``"dense:INDEX_DIR"``, a dense index built from ``passages`` (its query encoder
            is the one recorded in the index, on the CPU); ``"hybrid:INDEX_DIR"``, BM25 and that dense
            index fused by reciprocal rank; or the ``http(s)://`` URL of a Search-R1-compatible
            ``/retrieve`` endpoint; or ``"cassette:PATH"`` (a :class:`Cassette` replaying PATH, no index),
            ``"cassette:PATH;record=SPEC"`` or ``"cassette:PATH;record-missing=SPEC"`` (recording SPEC).
        passages: The corpus to index for named backends. A URL's server holds its own corpus; the hits'
            ids must be those of ``passages`` for the env's gold-retrieval figures to mean anything.
        patience: For a URL, seconds to wait for a server that stops answering before failing
            (:class:`~searchgym.retrieval.http.HttpRetriever`'s ``patience``); ignored by local backends.
        questions: The dataset's question texts, read on first use by the ``shuffled`` ablation
            (``"ablate:KIND;INNER"``: :mod:`searchgym.retrieval.ablation`).

    Raises:
        ConfigError: ``spec`` is none of these, or a dense index does not fit ``passages`` (see
            :meth:`~searchgym.retrieval.dense.DenseRetriever.load`).
        MissingDependencyError: a dense index without the ``dense`` extra installed.
    """
    if isinstance(spec, Retriever):
        return spec
    if spec is None or spec == "bm25":
        return BM25Retriever(passages)
    if spec == "rank_bm25":
        return RankBM25Retriever(passages)
    if isinstance(spec, str) and spec.startswith(("dense:", "hybrid:")):
        # Imported here: dense retrieval needs faiss, torch and transformers (the "dense" extra).
        from searchgym.retrieval.dense import retriever_from_spec

        found = retriever_from_spec(spec, passages)
        assert found is not None
        return found
    if isinstance(spec, str) and spec.startswith("ablate:"):
        from searchgym.retrieval.ablation import AblatedRetriever, parse_ablation_spec

        kind, inner = parse_ablation_spec(spec)
        return AblatedRetriever(kind, make_retriever(inner, passages, patience=patience), passages, questions)
    if isinstance(spec, str) and spec.startswith("cassette:"):
        return cassette_from_spec(spec, lambda inner: make_retriever(inner, passages, patience=patience))
    if isinstance(spec, str) and spec.startswith(("http://", "https://")):
        # Imported here: the client needs httpx (the "server" extra), which plain use must not require.
        from searchgym.retrieval.http import HttpRetriever

        return HttpRetriever(spec, patience=patience)
    raise ConfigError(
        f"unknown retriever {spec!r}; choose one of {list(BACKENDS)}, dense:INDEX_DIR (an index built by "
        "`searchgym index dense`), hybrid:INDEX_DIR (BM25 + that index), an http(s):// URL of a /retrieve endpoint, cassette:PATH (a "
        "recorded cassette), ablate:KIND;SPEC (empty, random or shuffled), or pass a Retriever"
    )
