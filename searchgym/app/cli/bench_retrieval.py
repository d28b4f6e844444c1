"""``searchgym bench retrieval``: BM25 and dense retrieval at 10k to 1M passages, ratios from one run."""

from __future__ import annotations

import argparse
import json
import sys

from searchgym.app.cli._common import format_table

COMMAND = ("bench", "retrieval")
HELP = (
    "benchmark our BM25 against bm25s (numpy and numba), rank-bm25 and faiss dense search at one or more "
    "corpus sizes"
)
#: Sizes without --sizes/--passages, and with --quick.
DEFAULT_SIZES = "10000,100000"
QUICK_SIZES = "10000"


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--sizes takes comma-separated passage counts, got {text!r}"
        ) from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--sizes takes positive passage counts, got {text!r}")
    return sizes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=None,
        help=f"comma-separated corpus sizes (default {DEFAULT_SIZES}; the 1M run: 10000,100000,1000000)",
    )
    parser.add_argument(
        "--passages", dest="sizes", type=_sizes, default=None, help="one corpus size (same as --sizes N)"
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"sizes {QUICK_SIZES}, 1 round, 128 queries (a smoke run)"
    )
    parser.add_argument("--repeats", type=int, default=None, help="timing rounds; figures are medians (3)")
    parser.add_argument("--queries", type=int, default=None, help="queries timed per back end (512)")
    parser.add_argument(
        "--reference-queries",
        type=int,
        default=64,
        help="queries answered by rank-bm25 (a sample: it is slow)",
    )
    parser.add_argument("--reference-max", type=int, default=20_000, help="largest corpus rank-bm25 runs on")
    parser.add_argument(
        "--batch", type=int, default=None, help="batch size of the batch latency (64, at most --queries)"
    )
    parser.add_argument(
        "--analysis",
        choices=("plain", "default"),
        default="plain",
        help="text analysis for every BM25 back end: plain (rank-bm25's) or default (ours)",
    )
    parser.add_argument(
        "--corpus",
        choices=("auto", "zipf", "worlds"),
        default="auto",
        help="auto: the HotpotQA sample of ../shared/data where large enough, synthetic Zipf text above",
    )
    parser.add_argument(
        "--data", default=None, help="folder holding the shared data (default ../shared/data)"
    )
    parser.add_argument("--dense-dim", type=int, default=384, help="vector width of the dense search")
    parser.add_argument(
        "--encoder-max",
        type=int,
        default=10_000,
        help="largest corpus the full dense retriever (tiny encoder) runs on",
    )
    parser.add_argument("--no-bm25s", action="store_true", help="skip bm25s even when installed")
    parser.add_argument("--no-reference", action="store_true", help="skip rank-bm25 and the agreement check")
    parser.add_argument("--no-dense", action="store_true", help="skip the dense search")
    parser.add_argument("--seed", type=int, default=0, help="seed of the corpora and query samples")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")


def run(args: argparse.Namespace) -> int:
    from searchgym.app.bench.retrieval import BM25_BACKENDS, RetrievalBenchConfig, run_retrieval_benchmark

    sizes = args.sizes if args.sizes is not None else _sizes(QUICK_SIZES if args.quick else DEFAULT_SIZES)
    queries = args.queries if args.queries is not None else (128 if args.quick else 512)
    cfg = RetrievalBenchConfig(
        passages=sizes[0],
        sizes=sizes,
        repeats=args.repeats if args.repeats is not None else (1 if args.quick else 3),
        queries=queries,
        reference_queries=min(args.reference_queries, queries),
        reference_max=args.reference_max,
        batch=args.batch if args.batch is not None else min(64, queries),
        analysis=args.analysis,
        corpus=args.corpus,
        data_dir=args.data,
        dense_dim=args.dense_dim,
        encoder_max=args.encoder_max,
        seed=args.seed,
    )
    result = run_retrieval_benchmark(
        cfg,
        with_bm25s=False if args.no_bm25s else None,
        with_reference=not args.no_reference,
        with_dense=not args.no_dense,
        log=lambda line: print(line, file=sys.stderr),
    )
    if args.json:
        print(json.dumps(result))
        return 0
    columns = ["backend", "build_s", "index_mb", "peak_mb", "p50_ms", "p90_ms", "batch_ms", "warmup_s"]
    order = [*BM25_BACKENDS, "dense", "dense_encoder"]
    for size in result["sizes"]:
        corpus = size["corpus"]
        print(
            f"\n{corpus['passages']} passages ({corpus['kind']}, {corpus['mean_words']:.0f} words each), "
            f"medians of {cfg.repeats} rounds; batch = {cfg.batch} queries"
        )
        rows, skipped = [], []
        for name in order:
            figures = size["backends"][name]
            if "skipped" in figures:
                skipped.append(f"  {name}: skipped, {figures['skipped']}")
            else:
                rows.append({"backend": name, **figures})
        print(format_table(rows, columns))
        print("\n".join(skipped))
        for key, value in size.items():
            if (key.startswith("speedup_") or key == "bm25_warmup_batches") and value is not None:
                print(f"{key}: {value:.3f}")
    if result.get("numba_warmup_s") is not None:
        print(f"\nnumba_warmup_s (bm25s, first query in this process): {result['numba_warmup_s']:.2f}")
    for key, what in (
        ("bm25_warmup_s", "our kernel's load in a fresh process, numba's cache filled"),
        ("bm25_compile_s", "our kernel's compile in a fresh process, numba's cache empty: once per machine"),
    ):
        if result.get(key) is not None:
            print(f"{key} ({what}): {result[key]:.2f}")
    if result.get("top3_agreement_vs_rank_bm25") is not None:
        agreement = result["agreement"]
        print(
            f"top3_agreement_vs_rank_bm25: {agreement['top3_agreement']:.3f} "
            f"({agreement['corpus']}, {agreement['passages']} passages, {agreement['queries']} questions)"
        )
    return 0
