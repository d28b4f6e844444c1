"""``searchgym bench retrieval``: build time, latency, batch latency and memory of the BM25 backends."""

from __future__ import annotations

import argparse
import json
import sys

from searchgym.cli._common import format_table

COMMAND = ("bench", "retrieval")
HELP = "benchmark our BM25 against rank-bm25 (and bm25s when installed) on a generated corpus"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--passages", type=int, default=100_000, help="corpus size")
    parser.add_argument("--repeats", type=int, default=3, help="runs; figures are medians")
    parser.add_argument("--queries", type=int, default=512, help="queries timed for the fast backends")
    parser.add_argument(
        "--reference-queries",
        type=int,
        default=64,
        help="queries answered by rank-bm25 (a sample: it is slow)",
    )
    parser.add_argument("--batch", type=int, default=64, help="batch size of the batch latency")
    parser.add_argument(
        "--analysis",
        choices=("plain", "default"),
        default="plain",
        help="text analysis for every backend: plain (rank-bm25's) or default (ours)",
    )
    parser.add_argument("--no-bm25s", action="store_true", help="skip bm25s even when installed")
    parser.add_argument("--no-reference", action="store_true", help="skip rank-bm25")
    parser.add_argument("--seed", type=int, default=0, help="seed of the query sample")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")


def run(args: argparse.Namespace) -> int:
    from searchgym.bench.retrieval import RetrievalBenchConfig, run_retrieval_benchmark

    cfg = RetrievalBenchConfig(
        passages=args.passages,
        repeats=args.repeats,
        queries=args.queries,
        reference_queries=args.reference_queries,
        batch=args.batch,
        analysis=args.analysis,
        seed=args.seed,
    )
    result = run_retrieval_benchmark(
        cfg,
        with_bm25s=False if args.no_bm25s else None,
        with_reference=not args.no_reference,
        log=lambda line: print(line, file=sys.stderr),
    )
    if args.json:
        print(json.dumps(result))
        return 0
    rows = [{"backend": name, **figures} for name, figures in result["backends"].items()]
    columns = ["backend", "build_s", "p50_ms", "p90_ms", "batch_ms", "index_mb", "rss_mb", "top3_agreement"]
    print(
        f"{result['corpus']['passages']} passages, medians of {cfg.repeats} runs; batch = {cfg.batch} queries"
    )
    print(format_table(rows, columns))
    for key, value in result.items():
        if key.startswith(("speedup_", "top3_")):
            print(f"{key}: {value:.3f}")
    return 0
