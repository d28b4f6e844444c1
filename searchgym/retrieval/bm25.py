"""A fast BM25: a term-by-passage matrix of precomputed weights, queried term at a time, pruned exactly.

The weights ``w(t, d)`` (Lucene or Okapi idf), the ``(V, N)`` CSR matrix that holds them, and its saved
form are :mod:`searchgym.retrieval.bm25_index`'s. The full scores of a batch (:meth:`BM25Retriever.scores`)
are one sparse product ``(B, V) @ (V, N)``. The top k (:meth:`BM25Retriever.top_k`) needs far less: posting
lists are added shortest first into a dense accumulator until the k-th best passage touched beats any
passage not touched yet (MaxScore), the long lists of common terms are then only looked up for the few
candidates left, and those are scored exactly. The result is the full scores' ranking, to the last bit.

Two engines run that search. When numba is installed (``pip install numba``; the ``bench`` extra has it),
a compiled kernel (:mod:`searchgym.retrieval._bm25_kernels`) answers a whole batch in one call; it is
compiled once per machine and cached on disk (``cache=True``), so later processes only load it. Without
numba, or when it fails to load, the same algorithm runs in numpy. Both return identical results.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, get_args

import numpy as np
import scipy.sparse as sp

from searchgym.data.types import Passage
from searchgym.errors import ConfigError, MissingDependencyError
from searchgym.retrieval.base import STOP_WORDS, Analyzer, Hit, Retriever
from searchgym.retrieval.bm25_index import (
    INDEX_FORMAT,
    BM25Params,
    IdfVariant,
    corpus_hash,
    count_terms,
    read_index,
    weigh,
    write_index,
)

__all__ = [
    "DEFAULT_ANALYZER",
    "INDEX_FORMAT",
    "BM25Params",
    "BM25Retriever",
    "Engine",
    "IdfVariant",
    "corpus_hash",
    "numba_kernel",
    "top_k_sparse",
]

#: How :meth:`BM25Retriever.top_k` runs: ``"auto"`` (numba when it loads, else numpy), ``"numba"``, ``"numpy"``.
Engine = Literal["auto", "numba", "numpy"]

#: The default analysis: lower case, ``\w+`` tokens, :data:`~searchgym.retrieval.base.STOP_WORDS` removed,
#: plural folding by :func:`~searchgym.retrieval.base.s_stem` (it lifts HotpotQA top-3 recall from 0.914 to
#: 0.926, see docs/retrieval.md).
DEFAULT_ANALYZER = Analyzer(stopwords=STOP_WORDS, stem=True)

#: Corpora at least this large show a progress bar while indexing (when ``progress`` is left to ``None``).
_PROGRESS_THRESHOLD = 50_000
#: Size of the strided sample that bounds the k-th best score of a long row (see :func:`top_k_sparse`).
_SAMPLE = 1024
#: :meth:`BM25Retriever.top_k` adds posting lists this short without checking the bound first.
_CHECK_MIN = 1024
#: Relative margin of the pruning comparisons: far above the rounding of sums of a query's weights.
_MARGIN = 1e-9


_kernel_lock = threading.Lock()
_kernel: ModuleType | None = None
_kernel_failure: str | None = None  # why the kernel is unavailable, once tried


def numba_kernel() -> ModuleType | None:
    """The compiled top-k (:mod:`searchgym.retrieval._bm25_kernels`), or ``None`` when numba is unavailable.

    Imported on first use, once per process: importing numba takes about half a second, and the kernel's
    machine code is then read from numba's cache (compiled on the first call of the first process on a
    machine). numba missing is silent (the numpy path runs); numba present but failing to load the kernel
    warns once, with the reason, and falls back to numpy too.
    """
    global _kernel, _kernel_failure
    if _kernel is not None or _kernel_failure is not None:
        return _kernel
    with _kernel_lock:
        if _kernel is None and _kernel_failure is None:
            import importlib
            import importlib.util

            if importlib.util.find_spec("numba") is None:
                _kernel_failure = "numba is not installed"
                return None
            try:
                _kernel = importlib.import_module("searchgym.retrieval._bm25_kernels")
            except Exception as e:  # numba's import or its cache setup: any failure means numpy
                _kernel_failure = f"{type(e).__name__}: {e}"
                warnings.warn(
                    f"the compiled BM25 kernel could not be loaded ({_kernel_failure}); BM25 runs in numpy. "
                    "If numba cannot write its cache next to searchgym, set NUMBA_CACHE_DIR to a writable "
                    "folder.",
                    RuntimeWarning,
                    stacklevel=2,
                )
    return _kernel


def _check_engine(engine: Any) -> Engine:
    """``engine`` when it is valid and, for ``"numba"``, when the kernel loads."""
    if engine not in get_args(Engine):
        raise ConfigError(f"engine must be one of {list(get_args(Engine))}, got {engine!r}")
    if engine == "numba" and numba_kernel() is None:
        if _kernel_failure == "numba is not installed":
            raise MissingDependencyError("numba", "bench", "the compiled BM25 kernel (engine='numba')")
        raise ConfigError(
            f"engine='numba': the compiled BM25 kernel could not be loaded ({_kernel_failure}); use "
            "engine='auto' or 'numpy', or set NUMBA_CACHE_DIR to a writable folder"
        )
    return engine


def top_k_sparse(scores: np.ndarray, positions: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best of some scored positions, by decreasing score, ties broken by lower position.

    The sparse counterpart of :func:`~searchgym.retrieval.rank_bm25.top_k_indices`, for the stored entries
    of one row of a sparse score matrix (unordered).

    Args:
        scores: ``(M,)`` scores.
        positions: ``(M,)`` distinct corpus positions of those scores.
        k: How many to keep (clipped to ``M``).

    Returns:
        ``(positions, scores)`` of the kept entries, each ``(min(k, M),)``, best first.
    """
    m = scores.shape[0]
    k = min(k, m)
    if k <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    pool = np.arange(m)
    if k < m and m > 4 * _SAMPLE and k <= m // (m // _SAMPLE) // 2:
        # The k-th best of a strided sample is a lower bound of the k-th best of all (a subset's k-th
        # largest never exceeds the whole's), so entries below it can be dropped before selecting: a
        # full-corpus row shrinks to a few hundred entries for the price of one comparison pass.
        sample = scores[:: m // _SAMPLE]
        bound = np.partition(sample, sample.shape[0] - k)[sample.shape[0] - k]
        pool = np.flatnonzero(scores >= bound)
    if k < pool.shape[0]:
        sub = scores[pool]
        threshold = sub[np.argpartition(-sub, k - 1)[:k]].min()
        pool = pool[sub >= threshold]  # every entry tied with the k-th score competes
    # lexsort sorts by its last key first: descending score, then ascending corpus position.
    order = np.lexsort((positions[pool], -scores[pool]))[:k]
    kept = pool[order]
    return positions[kept].astype(np.int64), scores[kept]


class BM25Retriever(Retriever):
    """BM25 over a passage list as a sparse matrix of weights, queried term at a time with exact pruning.

    Each passage is indexed as ``title + " " + text`` (as :class:`RankBM25Retriever` does). Rankings are
    deterministic: ties are broken by corpus position. The index is read-only after construction and each
    thread queries with its own scratch arrays (of ``N`` entries each, made on its first query), so one
    instance can serve several threads; the compiled kernel releases the interpreter lock while it runs.

    Args:
        passages: The corpus.
        k1: Term-frequency saturation.
        b: Length normalisation.
        idf: ``"lucene"`` (default) or ``"okapi"`` (reproduces ``rank_bm25.BM25Okapi`` scores).
        epsilon: Okapi idf floor factor.
        analyzer: Text analysis for passages and queries (default :data:`DEFAULT_ANALYZER`). To reproduce
            :class:`RankBM25Retriever`, pass ``Analyzer()``.
        progress: Show a progress bar while indexing; ``None`` shows one for corpora of 50,000 passages
            or more.
        engine: How queries run (same results either way): ``"auto"`` uses the compiled kernel when numba
            is installed and loads (see :func:`numba_kernel`), else numpy; ``"numba"`` requires it;
            ``"numpy"`` never uses it.

    Raises:
        ConfigError: a parameter is out of range.
        MissingDependencyError: ``engine="numba"`` without numba installed.
    """

    name = "bm25"

    def __init__(
        self,
        passages: Sequence[Passage],
        k1: float = 0.9,
        b: float = 0.4,
        idf: IdfVariant = "lucene",
        epsilon: float = 0.25,
        analyzer: Analyzer | None = None,
        progress: bool | None = None,
        engine: Engine = "auto",
    ) -> None:
        self.engine = _check_engine(engine)
        self.params = BM25Params(k1=k1, b=b, idf=idf, epsilon=epsilon)
        self.analyzer = analyzer if analyzer is not None else DEFAULT_ANALYZER
        self.passages = list(passages)
        self.corpus_hash = corpus_hash(self.passages)
        if progress is None:
            progress = len(self.passages) >= _PROGRESS_THRESHOLD
        tf, self.vocab = count_terms(self.passages, self.analyzer, progress)
        self.weights = weigh(tf, self.params)
        self._prepare()

    def _prepare(self) -> None:
        """Per-term statistics for pruning: posting-list lengths and the largest weight of each term."""
        w = self.weights
        self._df = np.diff(w.indptr)
        upper = np.zeros(w.shape[0], dtype=np.float64)
        filled = self._df > 0
        if filled.any():  # reduceat over the starts of non-empty rows: each segment is one row's postings
            upper[filled] = np.maximum.reduceat(w.data, w.indptr[:-1][filled])
        self._upper = np.maximum(upper, 0.0)  # a passage without the term gets 0 from it, never less
        # Bounds prune only when no weight is negative (Okapi's floor can be, on a tiny vocabulary).
        self._nonnegative = bool(w.data.shape[0] == 0 or w.data.min() >= 0)
        self._local = threading.local()  # per-thread scratch arrays (see _scratch)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_local"]  # scratch is per thread and per process
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("engine", "auto")  # pickled before engines existed
        self._local = threading.local()

    # -- querying ----------------------------------------------------------------------------------------

    def query_matrix(self, queries: Sequence[str]) -> sp.csr_matrix:
        """The ``(B, V)`` matrix of query terms (terms outside the vocabulary are dropped).

        Each query token is its own entry of value 1, in query order, duplicates kept: the sparse product
        then adds a repeated term once per occurrence, in the same order as ``rank_bm25`` sums, so Okapi
        scores agree with it to the last bit instead of merely to rounding.
        """
        vocab = self.vocab
        cols: list[int] = []
        indptr = np.zeros(len(queries) + 1, dtype=np.int64)
        for i, query in enumerate(queries):
            cols.extend([vocab[t] for t in self.analyzer(query) if t in vocab])
            indptr[i + 1] = len(cols)
        indices = np.asarray(cols, dtype=self.weights.indices.dtype)
        data = np.ones(indices.shape[0], dtype=np.float64)
        return sp.csr_matrix((data, indices, indptr), shape=(len(queries), self.weights.shape[0]))

    def score_matrix(self, queries: Sequence[str]) -> sp.csr_matrix:
        """``(B, N)`` sparse scores of every passage for each query; absent entries score 0."""
        return (self.query_matrix(queries) @ self.weights).tocsr()

    def scores(self, query: str) -> np.ndarray:
        """``(N,)`` dense BM25 scores of every passage for ``query``."""
        return np.asarray(self.score_matrix([query]).toarray()).ravel()

    def query_terms(self, queries: Sequence[str]) -> list[np.ndarray]:
        """Each query's term ids in query order, repeats kept, terms outside the vocabulary dropped."""
        vocab = self.vocab
        return [
            np.fromiter((vocab[t] for t in self.analyzer(q) if t in vocab), dtype=np.int64) for q in queries
        ]

    def top_k(self, queries: Sequence[str], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """For each query, ``(positions, scores)`` of its top ``k`` passages (fewer when ``N < k``).

        The ranking is that of the full scores (:meth:`scores`, to the last bit), ties broken by lower corpus
        position as :func:`~searchgym.retrieval.rank_bm25.top_k_indices` does on the dense scores.

        Term at a time with exact pruning (MaxScore). A query's distinct terms are taken by decreasing bound
        (count × the term's largest weight; rare terms first) and their posting lists added into a dense
        accumulator; only the touched passages are candidates. Once the k-th best candidate beats the sum of
        the bounds of the terms not yet added, no passage outside the candidates can enter the top k, and a
        candidate whose partial score plus that sum falls short of the k-th best cannot either. The few
        candidates left are then scored exactly, in query order (as the full product adds them), by looking
        their weights up in each term's sorted posting list. A query made only of common terms ends up
        adding every term, which is full scoring. Nothing in this is approximate: the pruning compares
        bounds with a relative margin that covers rounding, and the final scores are the full scores.
        """
        if isinstance(queries, str):
            raise TypeError("queries must be a sequence of strings, not one string")
        if k <= 0:
            return [(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)) for _ in queries]
        terms = self.query_terms(queries)
        kernel = numba_kernel() if self.engine != "numpy" and len(self.passages) else None
        if kernel is not None:
            return self._top_k_compiled(kernel, terms, k)
        return [self._top_k_terms(t, k) for t in terms]

    def _thread_array(self, name: str, dtype: type) -> np.ndarray:
        """This thread's ``(N,)`` scratch array ``name``, zeros when made on its first use."""
        array = getattr(self._local, name, None)
        if array is None:
            array = np.zeros(len(self.passages), dtype=dtype)
            setattr(self._local, name, array)
        return array

    def _accumulator(self) -> np.ndarray:
        """This thread's ``(N,)`` float64 accumulator (kept zeroed between queries, by both engines)."""
        return self._thread_array("acc", np.float64)

    def _scratch(self) -> tuple[np.ndarray, np.ndarray]:
        """This thread's accumulator and first-touch stamps over the corpus (kept zeroed between queries)."""
        return self._accumulator(), self._thread_array("mark", np.int64)

    def _top_k_compiled(
        self, kernel: ModuleType, terms: list[np.ndarray], k: int
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """:meth:`top_k` of a batch by the compiled kernel, in one call (same results as the numpy path)."""
        n_docs = len(self.passages)
        k = min(k, n_docs)
        touched = self._thread_array("touched", np.int64)  # the kernel's list of the passages a query touches
        pointers = np.zeros(len(terms) + 1, dtype=np.int64)
        np.cumsum([t.shape[0] for t in terms], out=pointers[1:])
        flat = np.concatenate(terms) if terms else np.zeros(0, dtype=np.int64)
        positions = np.empty((len(terms), k), dtype=np.int64)
        scores = np.empty((len(terms), k), dtype=np.float64)
        w = self.weights
        # asarray: a memory-mapped index's np.memmap arrays are passed as plain (read-only) views.
        kernel.top_k_batch(
            np.asarray(w.indptr),
            np.asarray(w.indices),
            np.asarray(w.data),
            self._upper,
            self._nonnegative,
            pointers,
            flat,
            k,
            self._accumulator(),
            touched,
            positions,
            scores,
        )
        return list(zip(positions, scores, strict=True))

    def _top_k_terms(self, terms: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top ``k`` of one query given as term ids in query order (see :meth:`top_k`)."""
        n_docs = len(self.passages)
        k = min(k, n_docs)
        if terms.size == 0:  # every passage scores 0: the first k
            return np.arange(k, dtype=np.int64), np.zeros(k, dtype=np.float64)
        if not self._nonnegative:  # negative weights void the bounds: score the query in full
            return top_k_sparse(self._dense_scores(terms), np.arange(n_docs), k)
        unique, counts = np.unique(terms, return_counts=True)
        df = self._df[unique]
        order = np.lexsort((-counts * self._upper[unique], df))  # short posting lists first
        unique, counts, df = unique[order], counts[order], df[order]
        bounds = counts * self._upper[unique]
        survivors, partial, kth, added = self._gather_candidates(unique, counts, df, bounds, k)
        # The terms not added are looked up for the candidates only, largest bound first; after each,
        # candidates that can no longer reach the k-th best partial score are dropped.
        left = list(range(added, unique.shape[0]))
        left.sort(key=lambda i: -bounds[i])
        rest = float(bounds[left].sum()) if left else 0.0
        for i in left:
            if survivors.shape[0] <= k:
                break  # every survivor is in the top k: only their exact scores are left to compute
            partial = partial + counts[i] * self._lookup(int(unique[i]), survivors)
            rest -= float(bounds[i])
            kth = max(kth, float(np.partition(partial, partial.shape[0] - k)[partial.shape[0] - k]))
            keep = partial + max(rest, 0.0) >= kth * (1 - _MARGIN) - _MARGIN
            survivors, partial = survivors[keep], partial[keep]
        survivors = np.sort(survivors)
        scores = self._exact_scores(terms, survivors)
        positive = scores > 0
        n_positive = int(np.count_nonzero(positive))
        if n_positive >= k:
            return top_k_sparse(scores[positive], survivors[positive], k)
        # Fewer than k passages score above 0 (then every term was added and the survivors are all of
        # them): the rest of the top k are passages scoring 0, by position.
        top, top_scores = top_k_sparse(scores[positive], survivors[positive], n_positive)
        taken = np.zeros(k + n_positive, dtype=np.bool_)
        taken[top[top < taken.shape[0]]] = True
        zeros = np.flatnonzero(~taken)[: k - n_positive]
        return (
            np.concatenate((top, zeros)).astype(np.int64),
            np.concatenate((top_scores, np.zeros(zeros.shape[0], dtype=np.float64))),
        )

    def _gather_candidates(
        self, unique: np.ndarray, counts: np.ndarray, df: np.ndarray, bounds: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray, float, int]:
        """Adds whole posting lists, shortest first, until no passage outside them can reach the top k.

        Returns:
            ``(candidates, partial scores, k-th best partial score or -inf, number of terms added)``:
            the candidates whose partial score plus the bounds of the terms not added reaches the k-th
            best partial score (all touched passages when every term was added and fewer than k were).
        """
        w = self.weights
        rest = np.concatenate((np.cumsum(bounds[::-1])[::-1], [0.0]))  # rest[i]: bounds of terms i, i+1, …
        acc, mark = self._scratch()
        chunks: list[np.ndarray] = []
        kth = -np.inf
        added = stamp = 0
        n_terms = unique.shape[0]
        try:
            while added < n_terms:
                # One step adds the next term and the following ones while each list is no longer than
                # all the lists before it (or than _CHECK_MIN): a check reads every candidate, so it is
                # worth making only before a list longer than the candidates are many.
                step, total = added + 1, int(df[added])
                while step < n_terms and df[step] <= max(total, _CHECK_MIN):
                    total += int(df[step])
                    step += 1
                starts, ends = w.indptr[unique[added:step]], w.indptr[unique[added:step] + 1]
                if step - added == 1:
                    postings = w.indices[starts[0] : ends[0]].astype(np.intp)
                    weights = counts[added] * w.data[starts[0] : ends[0]]
                else:
                    spans = list(zip(starts.tolist(), ends.tolist(), strict=True))
                    postings = np.concatenate([w.indices[a:b] for a, b in spans]).astype(np.intp)
                    weights = np.concatenate([w.data[a:b] for a, b in spans])
                    weights *= np.repeat(counts[added:step], ends - starts)
                np.add.at(acc, postings, weights)  # a passage may be in several of the step's lists
                # The passages touched for the first time, each once: stamp them with distinct numbers;
                # where a passage got several stamps, exactly one survives the write and is kept.
                new = postings[mark.take(postings) == 0]
                stamps = np.arange(stamp + 1, stamp + 1 + new.shape[0], dtype=np.int64)
                mark[new] = stamps
                chunks.append(new[mark.take(new) == stamps])
                stamp += new.shape[0]
                added = step
                candidates = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
                chunks = [candidates]
                if candidates.shape[0] >= k:
                    partial = acc.take(candidates)
                    kth = float(np.partition(partial, partial.shape[0] - k)[partial.shape[0] - k])
                    # A relative margin absorbs rounding: bounds and partial scores are sums in other orders.
                    if kth > rest[added] * (1 + _MARGIN) + _MARGIN:
                        break
            candidates = chunks[0]
            partial = acc.take(candidates)
            if kth > -np.inf:
                keep = partial + rest[added] >= kth * (1 - _MARGIN) - _MARGIN
                candidates, partial = candidates[keep], partial[keep]
        finally:
            for chunk in chunks:  # leave the scratch zeroed for the next query
                acc[chunk] = 0.0
                mark[chunk] = 0
        return candidates, partial, kth, added

    def _lookup(self, term: int, positions: np.ndarray) -> np.ndarray:
        """``w(term, d)`` for the passages at ``positions`` (0 where the term is absent).

        A binary search per position in the posting list, or, when the positions are many, a scatter of
        the whole list into the scratch accumulator and one gather (whichever reads less memory).
        """
        w = self.weights
        start, end = int(w.indptr[term]), int(w.indptr[term + 1])
        postings, data = w.indices[start:end], w.data[start:end]
        length = end - start
        if positions.shape[0] * max(length.bit_length(), 1) * 4 < length:
            at = np.searchsorted(postings, positions).clip(max=length - 1)
            return np.where(postings[at] == positions, data[at], 0.0)
        acc, _ = self._scratch()
        postings = postings.astype(np.intp)
        acc[postings] = data
        try:
            return acc.take(positions)
        finally:
            acc[postings] = 0.0

    def _exact_scores(self, terms: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Scores of the passages at sorted ``positions``, summed in query order as the full product does."""
        w = self.weights
        scores = np.zeros(positions.shape[0], dtype=np.float64)
        if positions.shape[0] == 0:
            return scores
        found: dict[int, np.ndarray] = {}
        indptr = w.indptr
        for term in terms.tolist():
            weights = found.get(term)
            if weights is None:
                start, end = int(indptr[term]), int(indptr[term + 1])
                postings = w.indices[start:end]  # sorted: the index is built with sort_indices()
                at = postings.searchsorted(positions)
                np.minimum(at, end - start - 1, out=at)
                weights = w.data[start:end].take(at)
                weights[postings.take(at) != positions] = 0.0
                found[term] = weights
            scores += weights
        return scores

    def _dense_scores(self, terms: np.ndarray) -> np.ndarray:
        """``(N,)`` scores of one query by adding its terms' posting lists in query order."""
        w = self.weights
        dense = np.zeros(len(self.passages), dtype=np.float64)
        for term in terms.tolist():
            start, end = w.indptr[term], w.indptr[term + 1]
            dense[w.indices[start:end]] += w.data[start:end]
        return dense

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        passages = self.passages
        return [
            [Hit.of(passages[int(i)], float(s)) for i, s in zip(positions, scores, strict=True)]
            for positions, scores in self.top_k(queries, k)
        ]

    @property
    def nbytes(self) -> int:
        """Bytes held by the weight matrix (the bulk of the index; the vocabulary dict is extra)."""
        w = self.weights
        return int(w.data.nbytes + w.indices.nbytes + w.indptr.nbytes)

    # -- persistence -------------------------------------------------------------------------------------

    def save(self, folder: str | Path) -> Path:
        """Writes the index to ``folder`` (created if needed): ``bm25.npz`` (weights) and ``bm25.json``.

        The JSON holds the format version, parameters, analyzer, vocabulary and the corpus hash, so
        :meth:`load` can refuse an index built from another corpus, the SHA-256 of ``bm25.npz``, so the two
        files are only ever used together, and the SHA-256 of its own content, so an edited or damaged JSON
        is refused. Both files are written to temporary names, flushed to disk and renamed into place, the
        JSON last: a write killed before the last rename leaves the previous JSON beside (perhaps) the new
        arrays, which :meth:`load` then refuses by their hash, never mixes. Temporary files of killed
        writes are removed first.

        Returns:
            The folder.
        """
        return write_index(
            folder, self.weights, self.vocab, self.params, self.analyzer, self.corpus_hash, len(self.passages)
        )

    @classmethod
    def load(
        cls, folder: str | Path, passages: Sequence[Passage], *, mmap: bool = False, engine: Engine = "auto"
    ) -> BM25Retriever:
        """Loads an index written by :meth:`save` for ``passages``.

        Args:
            folder: The index folder.
            passages: The corpus the index was built from (the hits are read from it).
            mmap: Map the weight arrays from ``bm25.npz`` (read-only) instead of copying them into memory:
                processes that load the same file share one copy in the page cache. Every check below runs
                all the same (it reads the file once).
            engine: How queries run (see :class:`BM25Retriever`).

        Raises:
            ConfigError: no index in ``folder``, or it was built from a different corpus (stale) or by
                another format version; the message says how to rebuild.
            DataFormatError: the index files are corrupt, fail their checksums (``bm25.json`` its own,
                ``bm25.npz`` the one ``bm25.json`` records), or come from two different builds.
            MissingDependencyError: ``engine="numba"`` without numba installed.
        """
        engine = _check_engine(engine)
        index = read_index(folder, passages, mmap)
        self = cls.__new__(cls)
        self.engine = engine
        self.params, self.analyzer, self.passages = index.params, index.analyzer, index.passages
        self.corpus_hash, self.vocab, self.weights = index.corpus_hash, index.vocab, index.weights
        self._prepare()
        return self
