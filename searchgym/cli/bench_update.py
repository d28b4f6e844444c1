"""``searchgym bench update``: GRPO update tokens/s (length buckets vs plain chunks) and a step's split."""

from __future__ import annotations

import argparse
import json
import sys

from searchgym.cli.bench_all import ROWS, add_llm_arguments, print_figures, set_threads

COMMAND = ("bench", "update")
HELP = "measure GRPO update tokens/s and the split of a step into rollout, update and diagnostics"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_llm_arguments(parser)
    parser.add_argument("--repeats", type=int, default=3, help="updates per path; medians")
    parser.add_argument("--questions", type=int, default=10, help="questions per rollout batch")
    parser.add_argument("--group-size", type=int, default=5, help="responses per question")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from searchgym.bench.training import run_update_benchmark

    set_threads(args)
    figures = run_update_benchmark(
        repeats=args.repeats,
        questions=args.questions,
        group_size=args.group_size,
        init=args.init,
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        log=lambda line: print(line, file=sys.stderr),
    )
    if args.json:
        print(json.dumps(figures))
    else:
        print_figures(figures, [r for r in ROWS if r[1].startswith(("update", "padding", "step"))])
    return 0
