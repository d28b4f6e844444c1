"""``searchgym bench eval``: oracle episodes/s on the generated world and on HotpotQA."""

from __future__ import annotations

import argparse
import sys

from searchgym.app.cli._common import positive_int
from searchgym.app.cli.bench_all import ROWS, report

COMMAND = ("bench", "eval")
HELP = "measure oracle episodes/s on the generated world and on HotpotQA (when ../shared/data is present)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=positive_int, default=500, help="episodes per run")
    parser.add_argument("--repeats", type=positive_int, default=3, help="runs (fresh envs); medians")
    parser.add_argument("--data", default=None, help="folder holding hotpotqa_dev_distractor_1100")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from searchgym.app.bench.evaluation import run_eval_benchmark

    figures = run_eval_benchmark(
        episodes=args.episodes,
        repeats=args.repeats,
        data_dir=args.data,
        log=lambda line: print(line, file=sys.stderr),
    )
    report(figures, args.json, [r for r in ROWS if r[1].startswith(("eval", "hotpotqa"))])
    return 0
