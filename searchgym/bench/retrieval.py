"""Retrieval at corpus scale: build time, index size, peak memory and query latency of every back end.

For each corpus size the benchmark builds one index per back end and times, from the same run:

* ``bm25``: ours (:class:`~searchgym.retrieval.BM25Retriever`), Lucene idf with k1 1.5 and b 0.75, the
  very formula ``bm25s`` computes, so the two rank alike (bm25s keeps float32 scores, so near-ties may
  differ). It runs its compiled kernel when numba is installed (``engine``: ``"numba"``), else numpy. The
  kernel's cost before the first query of a process is timed in fresh processes, apart from the latencies:
  ``warmup_s`` with numba's cache filled (what every process pays: importing numba and loading the
  machine code) and ``compile_s`` with an empty cache (paid once per machine);
* ``bm25_numpy``: the same index queried by its numpy engine (what runs without numba);
* ``bm25s_numpy`` and ``bm25s_numba``: one ``bm25s`` index (Lucene, same k1 and b) queried by its numpy
  back end and by its numba back end. numba compiles on the first query of each process: that warm-up is
  timed on its own (``warmup_s``) and left out of the latencies;
* ``rank_bm25`` (sizes up to ``reference_max`` only: it scores every passage in Python): its
  ``BM25Okapi``; it has no batch mode, so its batch figure is its mean single-query time times the batch;
* ``dense``: the search itself of a dense retriever's default (``flat``) index: searchgym's blocked exact
  scan (:func:`~searchgym.retrieval.dense.flat_top_k`) over random unit vectors of ``dense_dim``; and
  ``dense_faiss``, faiss ``IndexFlatIP`` on the same vectors and queries, for comparison (``dense_dim`` is
  384 by default, e5-small's width). Exhaustive search
  costs the same whatever the vectors hold, so this is the honest figure for the search;
* ``dense_encoder`` (sizes up to ``encoder_max``): the whole :class:`~searchgym.retrieval.DenseRetriever`
  with the tiny offline encoder, query encoding included (a plumbing check of the code path; a real
  encoder costs far more per query).

Every BM25 back end gets the same tokens: one :class:`~searchgym.retrieval.base.Analyzer` (``"plain"``:
``\\w+`` lower case, exactly rank-bm25's analysis; or ``"default"``: ours) is applied to passages and
queries. Latencies include the query analysis and the top-k selection (what a caller of ``search`` pays).
Each figure is the median over ``repeats`` timing rounds of one index per back end; the rounds visit the
back ends in turn, so a burst of load from other processes hits them alike.

Corpora (``corpus="auto"``): the HotpotQA sample of ``../shared/data`` (10,787 real passages and their
questions) for sizes it covers, and above that a seeded synthetic corpus (:func:`zipf_corpus`). ``"zipf"``
uses the synthetic corpus at every size, ``"worlds"`` concatenated generated worlds (:func:`bench_corpus`).

The top-3 agreement with rank-bm25 is measured on the HotpotQA sample when it is present (otherwise on the
first size's corpus): ours in Okapi mode with rank-bm25's parameters against ``BM25Okapi``, tie-aware.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from searchgym.data import Passage, generate_world
from searchgym.errors import ConfigError
from searchgym.retrieval.base import STOP_WORDS, Analyzer
from searchgym.retrieval.bm25 import DEFAULT_ANALYZER, BM25Retriever, numba_kernel
from searchgym.retrieval.rank_bm25 import top_k_indices

__all__ = [
    "BM25_BACKENDS",
    "RetrievalBenchConfig",
    "bench_corpus",
    "run_retrieval_benchmark",
    "zipf_corpus",
]

#: The back ends every report names (each one either has figures or says why it was skipped).
BM25_BACKENDS = ("bm25", "bm25_numpy", "bm25s_numpy", "bm25s_numba", "rank_bm25")
HOTPOTQA = "hotpotqa_dev_distractor_1100"
Log = Callable[[str], None]


@dataclass(frozen=True)
class RetrievalBenchConfig:
    """What to measure.

    Attributes:
        passages: Corpus size when ``sizes`` is empty.
        repeats: Timing rounds; figures are medians over them.
        queries: Queries timed one at a time for the fast back ends (also split into batches).
        reference_queries: Queries answered by ``rank_bm25`` (it is slow): its latency sample.
        batch: Batch size of the batch latency.
        k: Passages per query.
        analysis: ``"plain"`` (rank-bm25's analysis) or ``"default"`` (ours).
        seed: Seed of the corpora and query samples.
        sizes: Corpus sizes, measured one after the other (default: ``(passages,)``).
        corpus: ``"auto"`` (HotpotQA sample where it is large enough, synthetic above), ``"zipf"``
            (synthetic at every size) or ``"worlds"`` (generated worlds).
        reference_max: Largest size at which ``rank_bm25`` runs.
        agreement_queries: Questions of the top-3 agreement with rank-bm25.
        dense_dim: Vector width of the dense search.
        encoder_max: Largest size at which the full dense retriever with the tiny encoder runs.
        data_dir: Folder holding the shared data (default: ``../shared/data`` when present).
    """

    passages: int = 100_000
    repeats: int = 3
    queries: int = 512
    reference_queries: int = 64
    batch: int = 64
    k: int = 3
    analysis: Literal["plain", "default"] = "plain"
    seed: int = 0
    sizes: tuple[int, ...] = ()
    corpus: Literal["auto", "zipf", "worlds"] = "auto"
    reference_max: int = 20_000
    agreement_queries: int = 256
    dense_dim: int = 384
    encoder_max: int = 10_000
    data_dir: str | None = field(default=None)

    def __post_init__(self) -> None:
        for name in ("passages", "repeats", "queries", "reference_queries", "batch", "k", "dense_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.queries < self.batch:
            raise ConfigError(f"queries ({self.queries}) must be >= batch ({self.batch})")
        if self.analysis not in ("plain", "default"):
            raise ConfigError(f"analysis must be 'plain' or 'default', got {self.analysis!r}")
        if self.corpus not in ("auto", "zipf", "worlds"):
            raise ConfigError(f"corpus must be 'auto', 'zipf' or 'worlds', got {self.corpus!r}")
        if any(not isinstance(s, int) or s < 1 for s in self.sizes):
            raise ConfigError(f"sizes must be positive passage counts, got {self.sizes!r}")

    @property
    def analyzer(self) -> Analyzer:
        return Analyzer() if self.analysis == "plain" else DEFAULT_ANALYZER

    @property
    def size_list(self) -> tuple[int, ...]:
        return self.sizes or (self.passages,)


# -- corpora -----------------------------------------------------------------------------------------------


def bench_corpus(n_passages: int, n_queries: int, seed: int = 0) -> tuple[list[Passage], list[str]]:
    """``n_passages`` passages from consecutive generated worlds and ``n_queries`` of their test questions."""
    passages: list[Passage] = []
    questions: list[str] = []
    world_seed = 0
    while len(passages) < n_passages:
        world = generate_world(seed=world_seed)
        passages += [Passage(f"{world_seed}:{p.id}", p.title, p.text) for p in world.passages]
        questions += [q.question for q in world.questions("test")]
        world_seed += 1
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(questions), size=min(n_queries, len(questions)), replace=False)
    return passages[:n_passages], [questions[i] for i in picks]


_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def _zipf_words(n: int) -> list[str]:
    """``n`` distinct words: the stop words first (the most frequent ranks), then made-up words.

    Made-up words are syllables spelling the rank in base 70, ending in ``n`` so that no stemmer folds two
    of them together.
    """
    words = sorted(STOP_WORDS)
    rank = 0
    while len(words) < n:
        parts, rest = [], rank
        while True:
            parts.append(_SYLLABLES[rest % len(_SYLLABLES)])
            rest //= len(_SYLLABLES)
            if rest == 0:
                break
        words.append("".join(parts) + "n")
        rank += 1
    return words[:n]


def zipf_corpus(
    n_passages: int,
    n_queries: int,
    seed: int = 0,
    *,
    mean_words: int = 50,
    exponent: float = 1.0,
    vocab: int | None = None,
) -> tuple[list[Passage], list[str]]:
    """A seeded synthetic corpus whose word frequencies follow Zipf's law, and queries drawn from it.

    Word ranks are drawn with probability proportional to ``1 / rank ** exponent`` from a vocabulary that
    grows with the square root of the corpus's token count (Heaps' law; 50,000 words at least), the stop
    words taking the top ranks as in English text. Passages have 50% to 150% of ``mean_words`` words; the
    first two form the title. Each query is 3 to 8 words drawn from one random passage, so it has an
    answer and carries common words in their natural share.

    Returns:
        ``(passages, queries)``; passage ids are ``"0"``, ``"1"``, ….
    """
    rng = np.random.default_rng(seed)
    lengths = rng.integers(mean_words // 2, mean_words * 3 // 2 + 1, size=n_passages)
    total = int(lengths.sum())
    size = vocab or max(50_000, int(200 * total**0.5))
    words = np.array(_zipf_words(size), dtype=object)
    cdf = np.cumsum(1.0 / np.arange(1, size + 1) ** exponent)
    ranks = np.searchsorted(cdf, rng.random(total) * cdf[-1]).clip(max=size - 1)
    bounds = np.concatenate(([0], np.cumsum(lengths)))
    passages = []
    for i in range(n_passages):
        text = words[ranks[bounds[i] : bounds[i + 1]]]
        passages.append(Passage(str(i), " ".join(text[:2]), " ".join(text[2:])))
    queries = []
    for doc in rng.choice(n_passages, size=n_queries, replace=n_queries > n_passages):
        text = words[ranks[bounds[doc] : bounds[doc + 1]]]
        picks = rng.choice(text.shape[0], size=min(int(rng.integers(3, 9)), text.shape[0]), replace=False)
        queries.append(" ".join(text[np.sort(picks)]))
    return passages, queries


def _data_dir(cfg: RetrievalBenchConfig) -> Path | None:
    if cfg.data_dir is not None:
        root = Path(cfg.data_dir)
        return root if (root / HOTPOTQA / "corpus.jsonl").is_file() else None
    from searchgym.bench.evaluation import default_data_dir

    return default_data_dir()


def _hotpotqa(cfg: RetrievalBenchConfig) -> tuple[list[Passage], list[str]] | None:
    root = _data_dir(cfg)
    if root is None:
        return None
    from searchgym.data import load_flashrag

    dataset = load_flashrag(root / HOTPOTQA)
    return list(dataset.passages), [q.question for q in dataset.questions("test")]


def _corpus(cfg: RetrievalBenchConfig, size: int) -> tuple[str, list[Passage], list[str]]:
    """``(kind, passages, queries)`` of one size."""
    if cfg.corpus == "worlds":
        passages, queries = bench_corpus(size, cfg.queries, cfg.seed)
        return "worlds", passages, queries
    if cfg.corpus == "auto":
        real = _hotpotqa(cfg)
        if real is not None and len(real[0]) >= size:
            rng = np.random.default_rng(cfg.seed)
            picks = rng.choice(len(real[1]), size=min(cfg.queries, len(real[1])), replace=False)
            return "hotpotqa", real[0][:size], [real[1][i] for i in picks]
    passages, queries = zipf_corpus(size, cfg.queries, cfg.seed)
    return "zipf", passages, queries


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
class _Backend:
    """One built back end: how to search, which queries to time, and its build figures."""

    search: Callable[[Sequence[Any]], Any]
    queries: Sequence[Any]
    figures: dict[str, Any]
    one_by_one: bool = False  # no batch mode: the batch figure is the mean latency times the batch
    rounds: list[dict[str, float]] = field(default_factory=list)


def _time_round(backend: _Backend, batch: int) -> None:
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


def _summary(backend: _Backend) -> dict[str, Any]:
    out = dict(backend.figures)
    for key in backend.rounds[0]:
        out[key] = statistics.median(r[key] for r in backend.rounds)
    return out


# -- back ends ---------------------------------------------------------------------------------------------


def _missing(module: str) -> str | None:
    """Why a back end cannot run (``None`` when ``module`` imports)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        extra = "bench" if module != "faiss" else "dense"
        return f"{module} is not installed (pip install 'searchgym[{extra}]')"
    return None


def _build_ours(
    passages: list[Passage], analyzer: Analyzer, queries: list[str], k: int
) -> dict[str, _Backend]:
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
        "bm25": _Backend(lambda qs: ours.search(qs, k), queries, {**figures, "engine": engine}),
        "bm25_numpy": _Backend(lambda qs: plain.search(qs, k), queries, {**figures, "engine": "numpy"}),
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


def _build_bm25s(
    passages: list[Passage], analyzer: Analyzer, queries: list[str], k: int, log: Log
) -> dict[str, _Backend | str]:
    """``bm25s_numpy`` and ``bm25s_numba`` over one bm25s index, or the reason each is skipped."""
    reason = _missing("bm25s")
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

    out: dict[str, _Backend | str] = {"bm25s_numpy": _Backend(searcher("numpy"), queries, dict(figures))}
    reason = _missing("numba")
    if reason is not None:
        out["bm25s_numba"] = reason
        return out
    log("  bm25s_numba: first query (JIT warm-up)")
    numba_search = searcher("numba")
    start = time.perf_counter()
    numba_search(queries[:1])
    out["bm25s_numba"] = _Backend(numba_search, queries, {**figures, "warmup_s": time.perf_counter() - start})
    return out


def _build_reference(
    passages: list[Passage], analyzer: Analyzer, queries: list[str], k: int
) -> _Backend | str:
    reason = _missing("rank_bm25")
    if reason is not None:
        return reason
    from rank_bm25 import BM25Okapi

    reference, figures = _build(
        lambda: BM25Okapi([analyzer(f"{p.title} {p.text}") for p in passages], k1=1.5, b=0.75)
    )
    figures["index_mb"] = None

    def search(qs: Sequence[str]) -> Any:
        return [top_k_indices(np.asarray(reference.get_scores(analyzer(q))), k) for q in qs]

    return _Backend(search, queries, figures, one_by_one=True)


def _unit_vectors(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 65_536):  # in chunks: the float64 draw would double the peak
        block = rng.standard_normal((min(65_536, n - start), dim))
        out[start : start + block.shape[0]] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


def _build_dense(n: int, dim: int, n_queries: int, k: int, seed: int, engine: str = "flat") -> _Backend | str:
    """Exact inner-product search over ``n`` random unit vectors: searchgym's own blocked scan
    (:func:`~searchgym.retrieval.dense.flat_top_k`, what a ``flat`` dense index runs) or faiss's
    ``IndexFlatIP`` (``engine="faiss"``), on the same vectors and queries for a given seed."""
    if engine == "faiss":
        reason = _missing("faiss")
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
    return _Backend(search, queries, figures)


def _build_dense_encoder(
    passages: list[Passage], queries: list[str], k: int, workdir: Path
) -> _Backend | str:
    reason = _missing("faiss")
    if reason is not None:
        return reason
    try:
        from searchgym.retrieval.dense import DenseRetriever, build_dense_index, load_encoder
    except ImportError as e:  # pragma: no cover - the dense module ships with this package
        return f"the dense retriever is not available ({e})"
    for module in ("torch", "transformers"):
        reason = _missing(module)
        if reason is not None:
            return reason.replace("[bench]", "[dense]")
    encoder = load_encoder("tiny")

    def build() -> Any:
        folder = build_dense_index(passages, encoder, workdir / "dense", progress=False)
        return DenseRetriever.load(folder, passages, encoder)

    retriever, figures = _build(build)
    figures["index_mb"] = retriever.nbytes / 2**20
    figures["encoder"] = "tiny"
    return _Backend(lambda qs: retriever.search(qs, k), queries, figures)


def _agreement(
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


def _reference_agreement(cfg: RetrievalBenchConfig, log: Log) -> dict[str, Any]:
    """Top-3 agreement of ours (Okapi, rank-bm25's parameters) with ``BM25Okapi`` on real passages."""
    reason = _missing("rank_bm25")
    if reason is not None:
        return {"skipped": reason}
    from rank_bm25 import BM25Okapi

    real = _hotpotqa(cfg)
    if real is not None:
        kind, passages, questions = "hotpotqa", real[0], real[1][: cfg.agreement_queries]
    else:
        size = min(cfg.size_list[0], cfg.reference_max)
        kind, passages, questions = _corpus(cfg, size)
        questions = questions[: cfg.agreement_queries]
    log(f"top-3 agreement with rank_bm25 on {kind} ({len(passages)} passages, {len(questions)} questions)")
    analyzer = cfg.analyzer
    ours = BM25Retriever(passages, k1=1.5, b=0.75, idf="okapi", analyzer=analyzer, progress=False)
    reference = BM25Okapi([analyzer(f"{p.title} {p.text}") for p in passages], k1=1.5, b=0.75)
    return {
        "corpus": kind,
        "passages": len(passages),
        "queries": len(questions),
        "top3_agreement": _agreement(ours, reference, questions, analyzer, 3),
    }


def _ratios(backends: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """``speedup_{p50,batch64}_vs_X``: X's time over ours (``None`` where X was skipped)."""
    ours = backends["bm25"]
    out: dict[str, float | None] = {}
    for other in ("bm25s_numba", "bm25s_numpy", "rank_bm25", "dense"):
        figures = backends.get(other, {})
        ran = "p50_ms" in figures
        out[f"speedup_p50_vs_{other}"] = figures["p50_ms"] / ours["p50_ms"] if ran else None
        out[f"speedup_batch64_vs_{other}"] = figures["batch_ms"] / ours["batch_ms"] if ran else None
    plain = backends.get("bm25_numpy", {})
    numba = backends.get("bm25s_numba", {})
    both = "batch_ms" in plain and "batch_ms" in numba
    out["speedup_batch64_numpy_engine_vs_bm25s_numba"] = (
        numba["batch_ms"] / plain["batch_ms"] if both else None
    )
    return out


def _warmup_ratios(size: dict[str, Any], warmup: dict[str, Any], numba_warmup_s: float | None) -> None:
    """Adds the figures that count warm-ups to one size's results (see :func:`run_retrieval_benchmark`)."""
    ours, theirs = size["backends"]["bm25"], size["backends"]["bm25s_numba"]
    ours_warmup = warmup.get("warmup_s", 0.0) if ours.get("engine") == "numba" else 0.0
    first = gain = None
    if "batch_ms" in theirs and numba_warmup_s is not None:
        first = (numba_warmup_s + theirs["batch_ms"] / 1e3) / (ours_warmup + ours["batch_ms"] / 1e3)
        saved = (theirs["batch_ms"] - ours["batch_ms"]) / 1e3
        gain = ours_warmup / saved if saved > 0 else None
    size["speedup_first_batch64_vs_bm25s_numba"] = first
    size["bm25_warmup_batches"] = gain


def _run_size(
    cfg: RetrievalBenchConfig,
    size: int,
    *,
    with_bm25s: bool | None,
    with_reference: bool,
    with_dense: bool,
    log: Log,
) -> dict[str, Any]:
    start = time.perf_counter()
    kind, passages, queries = _corpus(cfg, size)
    log(f"{len(passages)} passages ({kind}), {len(queries)} queries ({time.perf_counter() - start:.1f}s)")
    analyzer = cfg.analyzer
    built: dict[str, _Backend | str] = {}
    log("  bm25: building")
    built |= _build_ours(passages, analyzer, queries, cfg.k)
    if with_bm25s is not False:
        log("  bm25s: building")
        built |= _build_bm25s(passages, analyzer, queries, cfg.k, log)
    else:
        built |= {name: "not requested (--no-bm25s)" for name in ("bm25s_numpy", "bm25s_numba")}
    if not with_reference:
        built["rank_bm25"] = "not requested (--no-reference)"
    elif size > cfg.reference_max:
        built["rank_bm25"] = f"corpus larger than reference_max ({cfg.reference_max} passages): too slow"
    else:
        log("  rank_bm25: building")
        built["rank_bm25"] = _build_reference(passages, analyzer, queries[: cfg.reference_queries], cfg.k)
    with tempfile.TemporaryDirectory(prefix="searchgym-bench-") as workdir:
        if not with_dense:
            built["dense"] = built["dense_faiss"] = built["dense_encoder"] = "not requested (--no-dense)"
        else:
            log(f"  dense: exact search over {size} random unit vectors of dim {cfg.dense_dim} (ours, faiss)")
            built["dense"] = _build_dense(size, cfg.dense_dim, len(queries), cfg.k, cfg.seed)
            built["dense_faiss"] = _build_dense(size, cfg.dense_dim, len(queries), cfg.k, cfg.seed, "faiss")
            if size > cfg.encoder_max:
                built["dense_encoder"] = f"corpus larger than encoder_max ({cfg.encoder_max} passages)"
            else:
                log("  dense_encoder: encoding the corpus with the tiny encoder")
                built["dense_encoder"] = _build_dense_encoder(passages, queries, cfg.k, Path(workdir))
        running = {name: b for name, b in built.items() if isinstance(b, _Backend)}
        for r in range(cfg.repeats):
            log(f"  timing round {r + 1}/{cfg.repeats}: {', '.join(running)}")
            for backend in running.values():
                _time_round(backend, cfg.batch)
        backends: dict[str, dict[str, Any]] = {
            name: _summary(b) if isinstance(b, _Backend) else {"skipped": b} for name, b in built.items()
        }
    words = float(np.mean([len(p.text.split()) + len(p.title.split()) for p in passages]))
    return {
        "passages": len(passages),
        "corpus": {"kind": kind, "passages": len(passages), "mean_words": words, "queries": len(queries)},
        "backends": backends,
        **_ratios(backends),
    }


def run_retrieval_benchmark(
    cfg: RetrievalBenchConfig,
    *,
    with_bm25s: bool | None = None,
    with_reference: bool = True,
    with_dense: bool = False,
    log: Log | None = None,
) -> dict[str, Any]:
    """Runs the benchmark at every size of ``cfg``; returns figures per size and the headline ratios.

    Args:
        cfg: What to measure.
        with_bm25s: Include bm25s (numpy and numba back ends); ``None`` or ``True``: when installed (else
            they are reported skipped, with the reason).
        with_reference: Include ``rank_bm25`` (sizes up to ``cfg.reference_max``) and the top-3 agreement.
        with_dense: Include the dense search (faiss) and, at small sizes, the tiny-encoder retriever.
        log: Receives progress lines.

    Returns:
        ``{"config", "sizes": [per size: {"passages", "corpus", "backends", "speedup_…"}], "corpus",
        "backends", "speedup_p50_vs_bm25s_numba", "speedup_batch64_vs_bm25s_numba", …,
        "numba_warmup_s", "bm25_warmup_s", "bm25_compile_s", "bm25_kernel_warmup",
        "speedup_first_batch64_vs_bm25s_numba", "bm25_warmup_batches",
        "top3_agreement_vs_rank_bm25", "agreement"}``. The top-level ``corpus``, ``backends`` and ratios
        are those of the largest size. ``backends`` always names ``bm25``, ``bm25_numpy``,
        ``bm25s_numpy``, ``bm25s_numba``, ``rank_bm25``, ``dense``, ``dense_faiss`` and ``dense_encoder``;
        a back end that did not run holds ``{"skipped": reason}`` and its ratios are ``None``. ``batch64``
        in a key stands for the configured batch size.

        Warm-ups, each timed apart from the latencies: ``numba_warmup_s``, bm25s-numba's first query in
        this process (it compiles in every process); ``bm25_warmup_s`` and ``bm25_compile_s``, our kernel's
        cost before the first query of a fresh process with numba's cache filled and empty (see
        :func:`kernel_warmup`; ``None`` without numba, when ``bm25`` runs numpy and has none).
        ``speedup_first_batch64_vs_bm25s_numba`` counts them: bm25s-numba's warm-up plus one batch over
        ours plus one batch, a fresh process's first batch. ``bm25_warmup_batches``: after how many
        batches our warm-up is repaid by the time each batch saves against bm25s-numba's steady speed
        (``None`` when none is saved). ``speedup_batch64_numpy_engine_vs_bm25s_numba``: the same ratio
        as ``speedup_batch64_vs_bm25s_numba`` for ``bm25_numpy``.
    """
    say = log or (lambda _: None)
    say("bm25: timing the compiled kernel's warm-up in fresh processes (empty numba cache, then filled)")
    warmup = kernel_warmup() if numba_kernel() is not None else kernel_warmup.__wrapped__()
    sizes = [
        _run_size(
            cfg, size, with_bm25s=with_bm25s, with_reference=with_reference, with_dense=with_dense, log=say
        )
        for size in cfg.size_list
    ]
    largest = max(sizes, key=lambda s: s["passages"])
    result: dict[str, Any] = {"config": {**asdict(cfg), "sizes": list(cfg.size_list)}, "sizes": sizes}
    result |= {key: value for key, value in largest.items() if key != "passages"}
    # numba compiles once per process: the first size's warm-up is the one a process pays.
    warmups = [s["backends"]["bm25s_numba"].get("warmup_s") for s in sizes]
    result["numba_warmup_s"] = next((w for w in warmups if w is not None), None)
    result["bm25_kernel_warmup"] = warmup
    result["bm25_warmup_s"] = warmup.get("warmup_s")
    result["bm25_compile_s"] = warmup.get("compile_s")
    for size in sizes:
        _warmup_ratios(size, warmup, result["numba_warmup_s"])
        size["backends"]["bm25"] |= {k: warmup[k] for k in ("warmup_s", "compile_s") if k in warmup}
    for key in ("speedup_first_batch64_vs_bm25s_numba", "bm25_warmup_batches"):
        result[key] = largest[key]
    if with_reference:
        agreement = _reference_agreement(cfg, say)
        result["agreement"] = agreement
        result["top3_agreement_vs_rank_bm25"] = agreement.get("top3_agreement")
    return result
