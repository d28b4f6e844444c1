"""Dense retrieval: the retriever over a saved index, exact or approximate (faiss), and its exact search.

The index folder, its format and the resumable build that writes it are
:mod:`searchgym.retrieval.dense_index`'s (re-exported here). ``flat`` indexes are searched by
:func:`flat_top_k`, an exact inner-product scan of the memory-mapped embeddings by BLAS matrix products;
``ivf`` and ``hnsw`` by faiss.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from searchgym.data.types import Passage, Question
from searchgym.errors import ConfigError, DataFormatError
from searchgym.integrity import check_sealed_file
from searchgym.retrieval.base import Hit, Retriever
from searchgym.retrieval.bm25_index import check_same_corpus
from searchgym.retrieval.dense_index import (
    EMBEDDINGS,
    FAISS_FILE,
    INDEX_FORMAT,
    INDEX_TYPES,
    MANIFEST,
    IndexType,
    build_dense_index,
    build_faiss,
    check_index_params,
    check_index_type,
    default_params,
    encoder_difference,
    finite_float32,
    import_faiss,
    open_embeddings,
    read_faiss,
    read_manifest,
)
from searchgym.retrieval.encoders import (
    DEFAULT_PREFIXES,
    POOLINGS,
    TINY,
    Encoder,
    Pooling,
    load_encoder,
    tiny_encoder,
)

__all__ = [
    "DEFAULT_PREFIXES",
    "INDEX_FORMAT",
    "INDEX_TYPES",
    "POOLINGS",
    "DenseRetriever",
    "Encoder",
    "IndexType",
    "Pooling",
    "build_dense_index",
    "flat_top_k",
    "gold_recall",
    "load_encoder",
    "read_manifest",
    "retriever_from_spec",
    "tiny_encoder",
]

# -- exact search ----------------------------------------------------------------------------------------

#: Score entries (queries x passages) computed at once by :func:`flat_top_k`: 64 MiB of float32.
_FLAT_BLOCK_ENTRIES = 1 << 24


def flat_top_k(vectors: np.ndarray, embeddings: np.ndarray, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Exact top ``k`` by inner product, ties broken by lower position, for each query vector.

    The passages are scanned in blocks (a memory map is read block by block, never copied whole); each
    block's scores are one BLAS matrix product, and only the entries at or above the block's k-th best
    score (ties included) are kept as candidates.

    Args:
        vectors: ``(B, dim)`` float32 query vectors.
        embeddings: ``(N, dim)`` float32 passage vectors.
        k: How many to keep per query (``1 <= k <= N``).

    Returns:
        For each query, ``(positions, scores)``, each ``(k,)``, best first.
    """
    n, batch = embeddings.shape[0], vectors.shape[0]
    block = max(1024, _FLAT_BLOCK_ENTRIES // max(batch, 1))
    rows, positions, scores = [], [], []
    for start in range(0, n, block):
        part = vectors @ embeddings[start : start + block].T  # (B, m)
        m = part.shape[1]
        if k < m:
            kth = np.partition(part, m - k, axis=1)[:, m - k : m - k + 1]
            row, col = np.nonzero(part >= kth)
        else:
            row, col = np.divmod(np.arange(batch * m), m)
        rows.append(row)
        positions.append(col + start)
        scores.append(part[row, col])
    row, position, score = np.concatenate(rows), np.concatenate(positions), np.concatenate(scores)
    order = np.lexsort((position, -score, row))  # by query, then best score, then lowest position
    starts = np.searchsorted(row[order], np.arange(batch))
    out = []
    for b in range(batch):
        taken = order[starts[b] : starts[b] + k]
        out.append((position[taken].astype(np.int64), score[taken]))
    return out


# -- the retriever -----------------------------------------------------------------------------------------


class DenseRetriever(Retriever):
    """Top-k passages by inner product of normalised embeddings (cosine similarity).

    A batch of queries is encoded in batches of the encoder's ``batch_size`` and searched at once: by
    :func:`flat_top_k` for ``flat`` (exact), by one faiss call for ``ivf``/``hnsw`` (approximate).
    Results are by decreasing score, ties broken by corpus position (exactly, for ``flat``; among the
    candidates the approximate index returns, for ``ivf``/``hnsw``).

    Build one with :meth:`load` (an index folder written by :func:`build_dense_index`), or directly from
    embeddings held in memory (e.g. for a benchmark).

    Args:
        passages: The corpus, in the order of ``embeddings``.
        encoder: Encodes the queries; must produce ``dim``-dimensional vectors.
        embeddings: ``(N, dim)`` float32 unit vectors (may be a memory map).
        index: A faiss index over the embeddings for ``ivf``/``hnsw``; ``None`` for ``flat``.
        index_type: ``"flat"``, ``"ivf"`` or ``"hnsw"``.

    Raises:
        ConfigError: the shapes of the corpus, the embeddings and the encoder disagree.
    """

    name = "dense"

    def __init__(
        self,
        passages: Sequence[Passage],
        encoder: Encoder,
        embeddings: np.ndarray,
        *,
        index: Any = None,
        index_type: str = "flat",
    ) -> None:
        check_index_type(index_type)
        if index_type != "flat":
            import_faiss()  # fail now, naming the extra, rather than at the first search
        self.passages = list(passages)
        if embeddings.ndim != 2 or embeddings.shape[0] != len(self.passages):
            raise ConfigError(
                f"{embeddings.shape} embeddings for {len(self.passages)} passages: one row per passage needed"
            )
        if embeddings.shape[1] != encoder.dim:
            raise ConfigError(
                f"dimension mismatch: the index holds {embeddings.shape[1]}-dimensional vectors but encoder "
                f"{encoder.name!r} produces {encoder.dim}; pass the encoder the index was built with, or "
                "rebuild the index with this one"
            )
        if index_type != "flat" and index is None:
            params = default_params(index_type, len(self.passages))
            index = build_faiss(embeddings, index_type, params, progress=False)
        self.encoder = encoder
        self.embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        self.index = index
        self.index_type = index_type
        self.index_dir: Path | None = None

    @classmethod
    def load(
        cls,
        index_dir: str | Path,
        passages: Sequence[Passage],
        encoder: Encoder | str | None = None,
        device: str = "cpu",
    ) -> DenseRetriever:
        """Opens an index written by :func:`build_dense_index` (embeddings memory-mapped).

        Args:
            index_dir: The index folder.
            passages: The corpus the index was built from (hits are read from it).
            encoder: The query encoder: ``None`` loads the one recorded in the index (``"tiny"`` or its
                checkpoint folder); a name or folder is loaded with the recorded pooling, prefixes and
                length; an :class:`Encoder` is used as it is (and must match them).
            device: Torch device of the query encoder (not used for an :class:`Encoder`).

        Raises:
            ConfigError: no finished index in ``index_dir`` (a half-built one says how to finish it); it
                was built from another corpus; the encoder is another one or of another dimension; the
                recorded encoder's folder is gone.
            DataFormatError: an index file is truncated or corrupt.
            MissingDependencyError: faiss (for ``ivf``/``hnsw``), torch or transformers is not installed.
        """
        root = Path(index_dir)
        meta = read_manifest(root)
        fix = f"rebuild it with `searchgym index dense ... --out {root} --overwrite`"
        passages = check_same_corpus(meta, passages, kind="dense", root=root, count_key="count", fix=fix)
        try:
            count, dim, index_type = meta["count"], meta["dim"], meta["index_type"]
            for name, value in (("count", count), ("dim", dim)):
                if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 40:
                    raise TypeError(f"{name} must be a positive integer, got {value!r:.40}")
            if not isinstance(index_type, str):
                raise TypeError(f"index_type must be a string, got {index_type!r:.40}")
            if not isinstance(meta["encoder"], dict):
                raise TypeError("encoder must be an object")
            built = dict(meta["encoder"])
            check_index_type(index_type)
        except (KeyError, TypeError, ValueError, ConfigError) as e:
            raise DataFormatError(str(root / MANIFEST), None, f"corrupt dense index manifest ({e})") from None
        check_index_params(index_type, meta.get("index_params"), root / MANIFEST)
        embeddings = open_embeddings(root / EMBEDDINGS, count, dim)
        check_sealed_file(
            meta, root / MANIFEST, root / EMBEDDINGS, finite_float32(root / EMBEDDINGS), record=True
        )
        index = read_faiss(root / FAISS_FILE, meta) if index_type != "flat" else None
        # A name or path is loaded with the recorded pooling, prefixes and length; an Encoder is used as is.
        options = {
            k: built[k] for k in ("pooling", "query_prefix", "passage_prefix", "max_length") if k in built
        }
        if encoder is None:
            name = str(built.get("name"))
            if name != TINY and not Path(name).is_dir():
                raise ConfigError(
                    f"the index in {root} was built with the encoder in {name}, which is gone; pass "
                    "encoder=PATH to DenseRetriever.load (the same checkpoint, moved), or rebuild the index"
                )
            encoder = load_encoder(name, device=device, **options)
        elif not isinstance(encoder, Encoder):
            encoder = load_encoder(encoder, device=device, **options)
        if encoder.dim != dim:
            raise ConfigError(
                f"dimension mismatch: the index in {root} holds {dim}-dimensional vectors but encoder "
                f"{encoder.name!r} produces {encoder.dim}; pass the encoder the index was built with "
                f"({built.get('name')!r}), or rebuild the index with this one"
            )
        difference = encoder_difference(built, encoder.identity())
        if difference is not None:
            raise ConfigError(
                f"the index in {root} was built with another encoder than the one given ({difference}); "
                f"pass the encoder it was built with ({built.get('name')!r}), or rebuild the index with "
                "`searchgym index dense ... --overwrite`"
            )
        self = cls(passages, encoder, embeddings, index=index, index_type=index_type)
        self.index_dir = root
        return self

    @property
    def dim(self) -> int:
        """Embedding size."""
        return int(self.embeddings.shape[1])

    @property
    def nbytes(self) -> int:
        """Bytes of the embeddings (memory-mapped when loaded) plus, for ``ivf``/``hnsw``, the faiss index."""
        size = int(self.embeddings.nbytes)
        if self.index is not None:
            if self.index_dir is not None and (self.index_dir / FAISS_FILE).is_file():
                size += (self.index_dir / FAISS_FILE).stat().st_size
            else:
                size += int(import_faiss().serialize_index(self.index).nbytes)
        return size

    def search_vectors(self, vectors: np.ndarray, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """For each ``(B, dim)`` query vector, ``(positions, scores)`` of its top ``k`` passages."""
        n = len(self.passages)
        k = min(k, n)
        if k <= 0 or vectors.shape[0] == 0:
            empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
            return [empty for _ in range(vectors.shape[0])]
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if self.index is None:
            return flat_top_k(vectors, self.embeddings, k)
        scores, positions = self.index.search(vectors, k)
        # faiss marks a missing result with -1; any other id outside [0, n) is damage.
        bad = positions[(positions >= n) | (positions < -1)] if positions.size else positions
        if bad.size:
            where = self.index_dir / FAISS_FILE if self.index_dir is not None else "the faiss index"
            raise DataFormatError(
                str(where),
                None,
                f"returned passage id {int(bad.flat[0])}, but the corpus holds {n} passages: the index is "
                "corrupt or of another corpus; rebuild it",
            )
        out = []
        for row_scores, row_positions in zip(scores, positions, strict=True):
            valid = row_positions >= 0
            row_scores, row_positions = row_scores[valid], row_positions[valid]
            order = np.lexsort((row_positions, -row_scores))[:k]
            out.append((row_positions[order].astype(np.int64), row_scores[order]))
        return out

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if isinstance(queries, str):
            raise TypeError("queries must be a sequence of strings, not one string")
        if not queries:
            return []
        if k <= 0:
            return [[] for _ in queries]
        passages = self.passages
        found = self.search_vectors(self.encoder.encode_queries(queries), k)
        return [
            [Hit.of(passages[int(i)], float(s)) for i, s in zip(positions, scores, strict=True)]
            for positions, scores in found
        ]


# -- evaluation --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recall:
    """Gold-passage recall of a retriever on a question set.

    Attributes:
        k: Passages retrieved per question.
        any_gold: Share of the questions whose top ``k`` holds at least one gold passage.
        all_gold: Share whose top ``k`` holds every gold passage.
        questions: Questions counted (those with gold passage ids).
    """

    k: int
    any_gold: float
    all_gold: float
    questions: int


def gold_recall(
    retriever: Retriever,
    questions: Sequence[Question],
    k: int = 3,
    *,
    batch_size: int = 256,
    progress: bool = False,
) -> Recall:
    """Recall@k of the gold passages: each question is the query, its ``supporting_ids`` the gold ids.

    Raises:
        ConfigError: no question carries gold passage ids.
    """
    scored = [q for q in questions if q.supporting_ids]
    if not scored:
        raise ConfigError(
            "no question carries gold passage ids (metadata.gold_passage_ids); cannot measure recall"
        )
    any_hits = all_hits = 0
    starts: Iterator[int] | Any = range(0, len(scored), batch_size)
    if progress:
        from tqdm import tqdm

        starts = tqdm(starts, desc=f"recall@{k}", unit="batch")
    for start in starts:
        batch = scored[start : start + batch_size]
        for q, hits in zip(batch, retriever.search([q.question for q in batch], k), strict=True):
            ids = {h.passage_id for h in hits}
            gold = set(q.supporting_ids)
            any_hits += bool(ids & gold)
            all_hits += gold <= ids
    return Recall(k, any_hits / len(scored), all_hits / len(scored), len(scored))


def retriever_from_spec(spec: Any, passages: Sequence[Passage], device: str = "cpu") -> Retriever | None:
    """The retriever of a ``"dense:INDEX_DIR"`` or ``"hybrid:INDEX_DIR"`` spec; ``None`` for other specs.

    ``hybrid`` fuses :class:`~searchgym.retrieval.bm25.BM25Retriever` over ``passages`` and the dense
    index by reciprocal rank (:class:`~searchgym.retrieval.hybrid.HybridRetriever`).

    Args:
        spec: The retriever argument.
        passages: The corpus the index was built from.
        device: Torch device of the query encoder.

    Raises:
        ConfigError: the spec names no folder, or the index does not fit (see :meth:`DenseRetriever.load`).
    """
    if not isinstance(spec, str) or not spec.startswith(("dense:", "hybrid:")):
        return None
    kind, _, folder = spec.partition(":")
    if not folder:
        raise ConfigError(f"retriever {spec!r} names no index folder; use {kind}:INDEX_DIR")
    dense = DenseRetriever.load(Path(folder).expanduser(), passages, device=device)
    if kind == "dense":
        return dense
    from searchgym.retrieval.bm25 import BM25Retriever
    from searchgym.retrieval.hybrid import HybridRetriever

    return HybridRetriever([BM25Retriever(passages), dense], passages)
