"""``searchgym bench update``: GRPO update tokens/s (length buckets vs plain chunks) and a step's split."""

from __future__ import annotations

import argparse

from searchgym.app.cli.bench_all import add_training_bench_arguments, run_training_bench

COMMAND = ("bench", "update")
HELP = "measure GRPO update tokens/s and the split of a step into rollout, update and diagnostics"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_training_bench_arguments(parser, "updates")


def run(args: argparse.Namespace) -> int:
    from searchgym.app.bench.training import run_update_benchmark

    return run_training_bench(args, run_update_benchmark, ("update", "padding", "step"))
