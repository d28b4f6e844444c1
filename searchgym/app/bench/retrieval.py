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

import functools
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from searchgym.app.bench.corpora import bench_corpus, zipf_corpus
from searchgym.app.bench.retrieval_backends import (
    Backend,
    Log,
    build_bm25s,
    build_dense,
    build_dense_encoder,
    build_ours,
    build_reference,
    kernel_warmup,
    reference_agreement,
    summary,
    time_round,
)
from searchgym.data import Passage
from searchgym.errors import ConfigError
from searchgym.retrieval.base import Analyzer
from searchgym.retrieval.bm25 import DEFAULT_ANALYZER, numba_kernel

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


def _data_dir(cfg: RetrievalBenchConfig) -> Path | None:
    if cfg.data_dir is not None:
        root = Path(cfg.data_dir)
        return root if (root / HOTPOTQA / "corpus.jsonl").is_file() else None
    from searchgym.app.bench.evaluation import default_data_dir

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


def _agreement_corpus(cfg: RetrievalBenchConfig) -> tuple[str, list[Passage], list[str]]:
    """The corpus of the top-3 agreement: the HotpotQA sample when present, else the first size's corpus."""
    real = _hotpotqa(cfg)
    if real is not None:
        return "hotpotqa", real[0], real[1][: cfg.agreement_queries]
    size = min(cfg.size_list[0], cfg.reference_max)
    kind, passages, questions = _corpus(cfg, size)
    return kind, passages, questions[: cfg.agreement_queries]


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
    built: dict[str, Backend | str] = {}
    log("  bm25: building")
    built |= build_ours(passages, analyzer, queries, cfg.k)
    if with_bm25s is not False:
        log("  bm25s: building")
        built |= build_bm25s(passages, analyzer, queries, cfg.k, log)
    else:
        built |= {name: "not requested (--no-bm25s)" for name in ("bm25s_numpy", "bm25s_numba")}
    if not with_reference:
        built["rank_bm25"] = "not requested (--no-reference)"
    elif size > cfg.reference_max:
        built["rank_bm25"] = f"corpus larger than reference_max ({cfg.reference_max} passages): too slow"
    else:
        log("  rank_bm25: building")
        built["rank_bm25"] = build_reference(passages, analyzer, queries[: cfg.reference_queries], cfg.k)
    with tempfile.TemporaryDirectory(prefix="searchgym-bench-") as workdir:
        if not with_dense:
            built["dense"] = built["dense_faiss"] = built["dense_encoder"] = "not requested (--no-dense)"
        else:
            log(f"  dense: exact search over {size} random unit vectors of dim {cfg.dense_dim} (ours, faiss)")
            built["dense"] = build_dense(size, cfg.dense_dim, len(queries), cfg.k, cfg.seed)
            built["dense_faiss"] = build_dense(size, cfg.dense_dim, len(queries), cfg.k, cfg.seed, "faiss")
            if size > cfg.encoder_max:
                built["dense_encoder"] = f"corpus larger than encoder_max ({cfg.encoder_max} passages)"
            else:
                log("  dense_encoder: encoding the corpus with the tiny encoder")
                built["dense_encoder"] = build_dense_encoder(passages, queries, cfg.k, Path(workdir))
        running = {name: b for name, b in built.items() if isinstance(b, Backend)}
        for r in range(cfg.repeats):
            log(f"  timing round {r + 1}/{cfg.repeats}: {', '.join(running)}")
            for backend in running.values():
                time_round(backend, cfg.batch)
        backends: dict[str, dict[str, Any]] = {
            name: summary(b) if isinstance(b, Backend) else {"skipped": b} for name, b in built.items()
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
        :func:`~searchgym.app.bench.retrieval_backends.kernel_warmup`; ``None`` without numba, when ``bm25`` runs numpy and has none).
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
        agreement = reference_agreement(functools.partial(_agreement_corpus, cfg), cfg.analyzer, 3, say)
        result["agreement"] = agreement
        result["top3_agreement_vs_rank_bm25"] = agreement.get("top3_agreement")
    return result
