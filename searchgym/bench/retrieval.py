"""Retrieval benchmark: build time, query latency, batch latency and memory of the BM25 backends.

The corpus is made of generated worlds: ``generate_world(seed=s)`` for ``s = 0, 1, …`` (about 840
passages of ~17 words each per world; ids prefixed ``"{s}:"``) until ``passages`` are reached, cut to that
number. Queries are test questions of those worlds, drawn with a fixed seed, so a run is reproducible.

Every backend sees the same token streams: one :class:`~searchgym.retrieval.base.Analyzer` (``"plain"``:
``\\w+`` lower case, exactly what :class:`~searchgym.retrieval.RankBM25Retriever` uses; or ``"default"``:
our default analysis) is applied to passages and queries and its tokens are handed to ``rank_bm25.BM25Okapi``
and to ``bm25s``. Ours runs in Okapi mode with ``rank_bm25``'s parameters (k1 1.5, b 0.75), so its rankings
can be compared with the reference; bm25s runs its Lucene variant with the same k1 and b.

Latencies include the query analysis and the top-k selection (what a caller of ``search`` pays).
``rank_bm25`` has no batch mode: its "batch of 64" is those 64 queries answered one by one, and its single
query latencies are measured on the same 64 queries (a sample, because each takes ~0.1 s at 100k passages).
Each figure is the median over ``repeats`` runs.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from searchgym.data import Passage, generate_world
from searchgym.errors import ConfigError
from searchgym.retrieval.base import Analyzer
from searchgym.retrieval.bm25 import DEFAULT_ANALYZER, BM25Retriever
from searchgym.retrieval.rank_bm25 import top_k_indices

__all__ = ["RetrievalBenchConfig", "bench_corpus", "run_retrieval_benchmark"]


@dataclass(frozen=True)
class RetrievalBenchConfig:
    """What to measure.

    Attributes:
        passages: Corpus size.
        repeats: Independent runs (fresh indexes); figures are medians over them.
        queries: Queries timed one at a time for the fast backends (also split into batches).
        reference_queries: Queries answered by ``rank_bm25`` (it is slow): its latency sample, and its
            "batch" answered one by one. Also the sample for the top-3 agreement.
        batch: Batch size of the batch latency.
        k: Passages per query.
        analysis: ``"plain"`` (the reference's analysis) or ``"default"`` (ours).
        seed: Seed of the query sample.
    """

    passages: int = 100_000
    repeats: int = 3
    queries: int = 512
    reference_queries: int = 64
    batch: int = 64
    k: int = 3
    analysis: Literal["plain", "default"] = "plain"
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("passages", "repeats", "queries", "reference_queries", "batch", "k"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.queries < self.batch:
            raise ConfigError(f"queries ({self.queries}) must be >= batch ({self.batch})")
        if self.analysis not in ("plain", "default"):
            raise ConfigError(f"analysis must be 'plain' or 'default', got {self.analysis!r}")

    @property
    def analyzer(self) -> Analyzer:
        return Analyzer() if self.analysis == "plain" else DEFAULT_ANALYZER


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


def _rss_bytes() -> int | None:
    """Resident set size of this process (Linux ``/proc``; ``None`` elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def _build(fn: Callable[[], Any]) -> tuple[Any, float, float | None]:
    """Builds an index; returns it, the seconds taken, and the RSS growth in MB (``None`` if unknown)."""
    gc.collect()
    before = _rss_bytes()
    index, seconds = _timed(fn)
    gc.collect()
    after = _rss_bytes()
    grown = (after - before) / 2**20 if before is not None and after is not None else None
    return index, seconds, grown


def _latencies(search: Callable[[Sequence[str]], Any], queries: Sequence[str]) -> list[float]:
    """Seconds of each query answered alone."""
    out = []
    for q in queries:
        start = time.perf_counter()
        search([q])
        out.append(time.perf_counter() - start)
    return out


def _figures(
    build_s: float, rss_mb: float | None, latencies: Sequence[float], batch_s: float
) -> dict[str, Any]:
    """One backend's figures: build time, memory, single-query p50/p90 and batch latency (ms)."""
    return {
        "build_s": build_s,
        "rss_mb": rss_mb,
        "p50_ms": 1e3 * float(np.percentile(latencies, 50)),
        "p90_ms": 1e3 * float(np.percentile(latencies, 90)),
        "batch_ms": 1e3 * batch_s,
    }


def _batch_seconds(search: Callable[[Sequence[str]], Any], queries: Sequence[str], batch: int) -> float:
    """Median seconds per batch over the full batches of ``queries``."""
    times = []
    for start in range(0, len(queries) - batch + 1, batch):
        chunk = queries[start : start + batch]
        begin = time.perf_counter()
        search(chunk)
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


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


def _run_once(
    cfg: RetrievalBenchConfig,
    passages: list[Passage],
    queries: list[str],
    with_bm25s: bool,
    with_reference: bool,
    log: Callable[[str], None],
) -> dict[str, dict[str, Any]]:
    analyzer = cfg.analyzer
    fast_queries, ref_queries = queries[: cfg.queries], queries[: cfg.reference_queries]
    figures: dict[str, dict[str, Any]] = {}

    log("  ours: building")
    ours, seconds, rss = _build(
        lambda: BM25Retriever(passages, k1=1.5, b=0.75, idf="okapi", analyzer=analyzer, progress=False)
    )
    lat = _latencies(lambda qs: ours.search(qs, cfg.k), fast_queries)
    batch = _batch_seconds(lambda qs: ours.search(qs, cfg.k), fast_queries, cfg.batch)
    figures["bm25"] = {**_figures(seconds, rss, lat, batch), "index_mb": ours.nbytes / 2**20}

    if with_bm25s:
        import bm25s

        log("  bm25s: building")
        tokens = [analyzer(f"{p.title} {p.text}") for p in passages]  # analysis is outside bm25s' timing

        def build_bm25s() -> Any:
            index = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
            index.index(tokens, show_progress=False)
            return index

        other, seconds, rss = _build(build_bm25s)
        del tokens

        def search_bm25s(qs: Sequence[str]) -> Any:
            return other.retrieve([analyzer(q) for q in qs], k=cfg.k, show_progress=False)

        lat = _latencies(search_bm25s, fast_queries)
        figures["bm25s"] = _figures(seconds, rss, lat, _batch_seconds(search_bm25s, fast_queries, cfg.batch))
        del other

    if with_reference:
        from rank_bm25 import BM25Okapi

        log(f"  rank_bm25: building, then {len(ref_queries)} queries one by one")
        reference, seconds, rss = _build(
            lambda: BM25Okapi([analyzer(f"{p.title} {p.text}") for p in passages], k1=1.5, b=0.75)
        )

        def search_reference(qs: Sequence[str]) -> Any:
            return [top_k_indices(np.asarray(reference.get_scores(analyzer(q))), cfg.k) for q in qs]

        lat = _latencies(search_reference, ref_queries)
        # No batch mode: a batch is its queries one by one (mean per query times the batch size).
        figures["rank_bm25"] = {
            **_figures(seconds, rss, lat, cfg.batch * float(np.mean(lat))),
            "top3_agreement": _agreement(ours, reference, ref_queries, analyzer, 3),
        }
    return figures


def run_retrieval_benchmark(
    cfg: RetrievalBenchConfig,
    *,
    with_bm25s: bool | None = None,
    with_reference: bool = True,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Runs the benchmark; returns medians per backend, the speed-up ratios and the top-3 agreement.

    Args:
        cfg: What to measure.
        with_bm25s: Include bm25s; ``None`` includes it when it is installed.
        with_reference: Include ``rank_bm25`` (the slowest part).
        log: Receives progress lines.

    Returns:
        ``{"config", "corpus", "backends": {name: {figure: median}}, "speedup_p50_vs_rank_bm25",
        "speedup_batch64_vs_rank_bm25", "top3_agreement_vs_rank_bm25", "speedup_p50_vs_bm25s",
        "speedup_batch64_vs_bm25s"}`` (ratio keys present when both backends ran; ``batch64`` stands for
        the configured batch size).
    """
    if with_bm25s is None:
        try:
            import bm25s  # noqa: F401
        except ImportError:
            with_bm25s = False
        else:
            with_bm25s = True
    say = log or (lambda _: None)
    start = time.perf_counter()
    passages, queries = bench_corpus(cfg.passages, cfg.queries, cfg.seed)
    say(f"corpus: {len(passages)} passages, {len(queries)} queries ({time.perf_counter() - start:.1f}s)")
    runs = []
    for r in range(cfg.repeats):
        say(f"repeat {r + 1}/{cfg.repeats}")
        runs.append(_run_once(cfg, passages, queries, with_bm25s, with_reference, say))
    backends: dict[str, dict[str, Any]] = {}
    for name in runs[0]:
        backends[name] = {}
        for key in runs[0][name]:
            values = [run[name][key] for run in runs]
            backends[name][key] = None if None in values else statistics.median(values)
    words = float(np.mean([len(p.text.split()) + len(p.title.split()) for p in passages]))
    result: dict[str, Any] = {
        "config": asdict(cfg),
        "corpus": {"passages": len(passages), "mean_words": words, "queries": len(queries)},
        "backends": backends,
    }
    ours = backends["bm25"]
    for other in ("rank_bm25", "bm25s"):
        if other in backends:
            result[f"speedup_p50_vs_{other}"] = backends[other]["p50_ms"] / ours["p50_ms"]
            result[f"speedup_batch64_vs_{other}"] = backends[other]["batch_ms"] / ours["batch_ms"]
    if "rank_bm25" in backends:
        result["top3_agreement_vs_rank_bm25"] = backends["rank_bm25"]["top3_agreement"]
    return result
