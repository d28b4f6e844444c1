"""The retrieval benchmark's back ends: how each is built and timed, and what is measured of it.

Each ``build_*`` function builds one back end's index and returns a :class:`Backend` (how to search, the
queries to time, the build figures: seconds, RSS growth and peak), or the reason it is skipped (a package
not installed). :func:`time_round` times one round of single-query and batch latencies;
:func:`kernel_warmup` times the compiled BM25 kernel's start-up in fresh processes.
"""

from __future__ import annotations

import copy
import functools
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from searchgym.data import Passage
from searchgym.retrieval.base import Analyzer
from searchgym.retrieval.bm25 import BM25Retriever, numba_kernel
from searchgym.retrieval.rank_bm25 import top_k_indices

__all__ = [
    "Backend",
    "Log",
    "build_bm25s",
    "build_dense",
    "build_dense_encoder",
    "build_ours",
    "build_reference",
    "kernel_warmup",
    "missing",
    "reference_agreement",
    "summary",
    "time_round",
    "top_k_agreement",
]

Log = Callable[[str], None]


# -- measuring ---------------------------------------------------------------------------------------------


def _proc_kib(field_name: str) -> int | None:
    """A ``/proc/self/status`` memory field in KiB (Linux; ``None`` elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _reset_peak() -> bool:
    """Resets the process's peak RSS (Linux ``clear_refs``); ``False`` when it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _build(fn: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
    """Builds an index; returns it and ``build_s``, ``rss_mb`` (RSS growth) and ``peak_mb`` (peak growth)."""
    gc.collect()
    before = _proc_kib("VmRSS")
    peak_ok = _reset_peak()
    start = time.perf_counter()
    index = fn()
    seconds = time.perf_counter() - start
    peak = _proc_kib("VmHWM") if peak_ok else None
    gc.collect()
    after = _proc_kib("VmRSS")
    known = before is not None and after is not None
    return index, {
        "build_s": seconds,
        "rss_mb": (after - before) / 1024 if known else None,  # type: ignore[operator]
        "peak_mb": (peak - before) / 1024 if peak is not None and before is not None else None,
    }


def _latencies(search: Callable[[Sequence[Any]], Any], queries: Sequence[Any]) -> list[float]:
    """Seconds of each query answered alone."""
    out = []
    for q in queries:
        start = time.perf_counter()
        search([q])
        out.append(time.perf_counter() - start)
    return out


def _batch_seconds(search: Callable[[Sequence[Any]], Any], queries: Sequence[Any], batch: int) -> float:
    """Median seconds per batch over the full batches of ``queries``."""
    times = []
    for start in range(0, len(queries) - batch + 1, batch):
        chunk = queries[start : start + batch]
        begin = time.perf_counter()
        search(chunk)
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


@dataclass
class Backend:
    """One built back end: how to search, which queries to time, and its build figures."""

    search: Callable[[Sequence[Any]], Any]
    queries: Sequence[Any]
    figures: dict[str, Any]
    one_by_one: bool = False  # no batch mode: the batch figure is the mean latency times the batch
    rounds: list[dict[str, float]] = field(default_factory=list)


def time_round(backend: Backend, batch: int) -> None:
    lat = _latencies(backend.search, backend.queries)
    batch_s = (
        batch * float(np.mean(lat))
        if backend.one_by_one
        else _batch_seconds(backend.search, backend.queries, batch)
    )
    backend.rounds.append(
        {
            "p50_ms": 1e3 * float(np.percentile(lat, 50)),
            "p90_ms": 1e3 * float(np.percentile(lat, 90)),
            "batch_ms": 1e3 * batch_s,
        }
    )


def summary(backend: Backend) -> dict[str, Any]:
    out = dict(backend.figures)
    for key in backend.rounds[0]:
        out[key] = statistics.median(r[key] for r in backend.rounds)
    return out


# -- back ends ---------------------------------------------------------------------------------------------


def missing(module: str) -> str | None:
    """Why a back end cannot run (``None`` when ``module`` imports)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        extra = "bench" if module != "faiss" else "dense"
        return f"{module} is not installed (pip install 'searchgym[{extra}]')"
    return None


def build_ours(passages: list[Passage], analyzer: Analyzer, queries: list[str], k: int) -> dict[str, Backend]:
    """``bm25`` (the compiled kernel when numba loads, else numpy) and ``bm25_numpy`` over one index."""
    ours, figures = _build(
        lambda: BM25Retriever(passages, k1=1.5, b=0.75, idf="lucene", analyzer=analyzer, progress=False)
    )
    figures["index_mb"] = ours.nbytes / 2**20
    ours.top_k(queries[:1], k)  # loads the kernel in this process (timed apart: kernel_warmup)
    plain = copy.copy(ours)  # the same arrays, queried by numpy
    plain.engine = "numpy"
    engine = "numba" if numba_kernel() is not None else "numpy"
    return {
        "bm25": Backend(lambda qs: ours.search(qs, k), queries, {**figures, "engine": engine}),
        "bm25_numpy": Backend(lambda qs: plain.search(qs, k), queries, {**figures, "engine": "numpy"}),
    }


#: Run in a fresh process: the seconds from nothing loaded to the first query answered by the kernel.
_WARMUP_PROBE = """
import json, sys, time
from searchgym.data import Passage
from searchgym.retrieval.bm25 import BM25Retriever, numba_kernel
index = BM25Retriever([Passage(str(i), "", f"w{i % 7} w{i % 3} x") for i in range(64)])
for name in ("indptr", "indices"):  # the dtypes of the benchmarked index: one compiled version each
    setattr(index.weights, name, getattr(index.weights, name).astype(sys.argv[1 if name == "indptr" else 2]))
start = time.perf_counter()
kernel = numba_kernel()
index.top_k(["w1 x", "w2"], 3)
print(json.dumps({"seconds": time.perf_counter() - start, "compiled": kernel is not None}))
"""


@functools.cache
def kernel_warmup(index_dtypes: tuple[str, str] = ("int32", "int32")) -> dict[str, Any]:
    """The compiled BM25 kernel's cost before a process's first query, timed in fresh processes (once per
    process: the answer is kept).

    Args:
        index_dtypes: The dtypes of the weight matrix's ``indptr`` and ``indices`` (numba compiles one
            version of the kernel per dtype).

    Returns:
        ``{"compile_s": ..., "warmup_s": ...}``: an empty numba cache (the first process on a machine:
        import, compilation, writing the cache), then the same cache filled (every later process: import
        and load), each from ``import numba`` to the first batch answered; or ``{"skipped": reason}``.
    """
    if numba_kernel() is None:
        return {"skipped": "numba is not installed or the kernel does not load: bm25 runs numpy"}
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="searchgym-numba-cache-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}  # numba reads its cache from there, and only there
        for key in ("compile_s", "warmup_s"):
            done = subprocess.run(
                [sys.executable, "-c", _WARMUP_PROBE, *index_dtypes],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            try:
                probe = json.loads(done.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                return {"skipped": f"the warm-up probe failed: {done.stderr.strip()[-500:]}"}
            if not probe["compiled"]:
                return {"skipped": "the kernel did not load in a fresh process"}
            out[key] = probe["seconds"]
    return out


def build_bm25s(
    passages: list[Passage], analyzer: Analyzer, queries: list[str], k: int, log: Log
) -> dict[str, Backend | str]:
    """``bm25s_numpy`` and ``bm25s_numba`` over one bm25s index, or the reason each is skipped."""
    reason = missing("bm25s")
    if reason is not None:
        return {"bm25s_numpy": reason, "bm25s_numba": reason}
    import bm25s

    interned: dict[str, str] = {}  # one string object per distinct token keeps the token lists small
    tokens = [[interned.setdefault(t, t) for t in analyzer(f"{p.title} {p.text}")] for p in passages]

    def build() -> Any:
        index = bm25s.BM25(k1=1.5, b=0.75, method="lucene", backend="numpy")
        index.index(tokens, show_progress=False)
        return index

    index, figures = _build(build)
    scores = index.scores
    figures["index_mb"] = sum(scores[n].nbytes for n in ("data", "indices", "indptr")) / 2**20

    def searcher(backend: str) -> Callable[[Sequence[str]], Any]:
        def search(qs: Sequence[str]) -> Any:
            index.backend = backend
            return index.retrieve([analyzer(q) for q in qs], k=k, show_progress=False)

        return search

    out: dict[str, Backend | str] = {"bm25s_numpy": Backend(searcher("numpy"), queries, dict(figures))}
    reason = missing("numba")
    if reason is not None:
        out["bm25s_numba"] = reason
        return out
    log("  bm25s_numba: first query (JIT warm-up)")
    numba_search = searcher("numba")
    start = time.perf_counter()
    numba_search(queries[:1])
    out["bm25s_numba"] = Backend(numba_search, queries, {**figures, "warmup_s": time.perf_counter() - start})
    return out


def build_reference(passages: list[Passage], analyzer: Analyzer, queries: list[str], k: int) -> Backend | str:
    reason = missing("rank_bm25")
    if reason is not None:
        return reason
    from rank_bm25 import BM25Okapi

    reference, figures = _build(
        lambda: BM25Okapi([analyzer(f"{p.title} {p.text}") for p in passages], k1=1.5, b=0.75)
    )
    figures["index_mb"] = None

    def search(qs: Sequence[str]) -> Any:
        return [top_k_indices(np.asarray(reference.get_scores(analyzer(q))), k) for q in qs]

    return Backend(search, queries, figures, one_by_one=True)


def _unit_vectors(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 65_536):  # in chunks: the float64 draw would double the peak
        block = rng.standard_normal((min(65_536, n - start), dim))
        out[start : start + block.shape[0]] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


def build_dense(n: int, dim: int, n_queries: int, k: int, seed: int, engine: str = "flat") -> Backend | str:
    """Exact inner-product search over ``n`` random unit vectors: searchgym's own blocked scan
    (:func:`~searchgym.retrieval.dense.flat_top_k`, what a ``flat`` dense index runs) or faiss's
    ``IndexFlatIP`` (``engine="faiss"``), on the same vectors and queries for a given seed."""
    if engine == "faiss":
        reason = missing("faiss")
        if reason is not None:
            return reason
    rng = np.random.default_rng(seed)
    vectors = _unit_vectors(rng, n, dim)
    queries = list(_unit_vectors(rng, n_queries, dim))
    if engine == "faiss":
        import faiss

        def build() -> Any:
            index = faiss.IndexFlatIP(dim)
            index.add(vectors)
            return index

        index, figures = _build(build)
        search: Callable[[Sequence[Any]], Any] = lambda qs: index.search(np.stack(qs), k)  # noqa: E731
    else:
        from searchgym.retrieval.dense import flat_top_k

        _, figures = _build(lambda: vectors)  # nothing to build: the scan reads the vectors as stored
        search = lambda qs: flat_top_k(np.stack(qs), vectors, k)  # noqa: E731
    figures["index_mb"] = n * dim * 4 / 2**20
    figures["dim"] = dim
    return Backend(search, queries, figures)


def build_dense_encoder(passages: list[Passage], queries: list[str], k: int, workdir: Path) -> Backend | str:
    reason = missing("faiss")
    if reason is not None:
        return reason
    try:
        from searchgym.retrieval.dense import DenseRetriever, build_dense_index, load_encoder
    except ImportError as e:  # pragma: no cover - the dense module ships with this package
        return f"the dense retriever is not available ({e})"
    for module in ("torch", "transformers"):
        reason = missing(module)
        if reason is not None:
            return reason.replace("[bench]", "[dense]")
    encoder = load_encoder("tiny")

    def build() -> Any:
        folder = build_dense_index(passages, encoder, workdir / "dense", progress=False)
        return DenseRetriever.load(folder, passages, encoder)

    retriever, figures = _build(build)
    figures["index_mb"] = retriever.nbytes / 2**20
    figures["encoder"] = "tiny"
    return Backend(lambda qs: retriever.search(qs, k), queries, figures)


def top_k_agreement(
    ours: BM25Retriever, reference: Any, queries: Sequence[str], analyzer: Analyzer, k: int
) -> float:
    """Share of queries whose top-k equals the reference's, up to reordering among tied reference scores.

    A list counts as equal when our passages have, rank by rank, the same reference scores (within 1e-9
    relative) as the reference's own top-k: any difference is then a choice among exact ties.
    """
    agree = 0
    for query, (positions, _) in zip(queries, ours.top_k(queries, k), strict=True):
        scores = np.asarray(reference.get_scores(analyzer(query)), dtype=np.float64)
        expected = top_k_indices(scores, k)
        agree += positions.tolist() == expected.tolist() or bool(
            np.allclose(scores[positions], scores[expected], rtol=1e-9, atol=0)
        )
    return agree / len(queries)


def reference_agreement(
    corpus: Callable[[], tuple[str, list[Passage], list[str]]], analyzer: Analyzer, k: int, log: Log
) -> dict[str, Any]:
    """Top-``k`` agreement of ours (Okapi, rank-bm25's parameters) with ``BM25Okapi``.

    Args:
        corpus: Gives ``(kind, passages, questions)``; called only when rank_bm25 is installed.
        analyzer: The analysis both apply.
        k: Passages compared per question.
        log: Receives a progress line.

    Returns:
        ``{"corpus", "passages", "queries", "top3_agreement"}`` (``k`` is 3 in every report), or
        ``{"skipped": reason}``.
    """
    reason = missing("rank_bm25")
    if reason is not None:
        return {"skipped": reason}
    from rank_bm25 import BM25Okapi

    kind, passages, questions = corpus()
    log(f"top-{k} agreement with rank_bm25 on {kind} ({len(passages)} passages, {len(questions)} questions)")
    ours = BM25Retriever(passages, k1=1.5, b=0.75, idf="okapi", analyzer=analyzer, progress=False)
    reference = BM25Okapi([analyzer(f"{p.title} {p.text}") for p in passages], k1=1.5, b=0.75)
    return {
        "corpus": kind,
        "passages": len(passages),
        "queries": len(questions),
        "top3_agreement": top_k_agreement(ours, reference, questions, analyzer, k),
    }
