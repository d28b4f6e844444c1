"""``searchgym bench rollout``: GRPO rollout tokens/s against ``generate`` on the same model and batch."""

from __future__ import annotations

import argparse

from searchgym.app.cli.bench_all import add_training_bench_arguments, run_training_bench

COMMAND = ("bench", "rollout")
HELP = "measure rollout tokens/s (cached tool turns) against Hugging Face generate on the same batch"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_training_bench_arguments(parser, "rollout batches")


def run(args: argparse.Namespace) -> int:
    from searchgym.app.bench.training import run_rollout_benchmark

    return run_training_bench(args, run_rollout_benchmark, ("rollout", "generate"))
