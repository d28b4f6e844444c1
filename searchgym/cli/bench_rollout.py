"""``searchgym bench rollout``: GRPO rollout tokens/s against ``generate`` on the same model and batch."""

from __future__ import annotations

import argparse
import json
import sys

from searchgym.cli.bench_all import ROWS, add_llm_arguments, print_figures, set_threads

COMMAND = ("bench", "rollout")
HELP = "measure rollout tokens/s (cached tool turns) against Hugging Face generate on the same batch"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_llm_arguments(parser)
    parser.add_argument("--repeats", type=int, default=3, help="rollout batches per path; medians")
    parser.add_argument("--questions", type=int, default=10, help="questions per batch")
    parser.add_argument("--group-size", type=int, default=5, help="responses per question")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from searchgym.bench.training import run_rollout_benchmark

    set_threads(args)
    figures = run_rollout_benchmark(
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
        print_figures(figures, [r for r in ROWS if r[1].startswith(("rollout", "generate"))])
    return 0
