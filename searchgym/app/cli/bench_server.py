"""``searchgym bench server``: the retrieval server under a large-response load (/health latency, memory)."""

from __future__ import annotations

import argparse
import json

COMMAND = ("bench", "server")
HELP = "load the /retrieve server with large requests; report /health latency, throughput and memory"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", default=None, help="FlashRAG folder (default: the generated world)")
    parser.add_argument("--clients", type=int, default=4, help="clients sending large requests")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of the load")
    parser.add_argument("--topk", type=int, default=100, help="topk of the load requests")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from searchgym.app.bench.server import run_server_benchmark

    result = run_server_benchmark(args.corpus, args.clients, args.seconds, args.topk)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28s} {value}")
    return 0
