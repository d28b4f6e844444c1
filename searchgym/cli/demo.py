"""``searchgym demo``: the main job on the embedded default world."""

from __future__ import annotations

import argparse
from typing import Any

from searchgym.cli._common import format_table, load_agent

COMMAND = ("demo",)
HELP = "generate the default world and evaluate the baseline agents on it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=200, help="test episodes per agent")
    parser.add_argument("--seed", type=int, default=0, help="base seed")


def run(args: argparse.Namespace) -> int:
    import time

    import gymnasium as gym

    import searchgym  # noqa: F401
    from searchgym.agents import evaluate

    start = time.perf_counter()
    env = gym.make("SearchQA-v0", split="test")
    base: Any = env.unwrapped
    print(
        f"world {base.dataset.name}: {len(base.dataset.passages)} passages, "
        + ", ".join(f"{k} {len(v)}" for k, v in base.dataset.splits.items())
        + f" questions ({time.perf_counter() - start:.2f}s); tokenizer vocab {base.tokenizer.vocab_size}"
    )
    rows = []
    for name in ("random", "oracle"):
        summary = evaluate(
            env, load_agent(name, env, seed=args.seed), args.episodes, seed=args.seed, progress=True
        )
        rows.append({"agent": name, **summary.metrics()})
    print(
        format_table(
            rows,
            [
                "agent",
                "em",
                "f1",
                "valid_format",
                "searches",
                "retrieval_recall",
                "tokens",
                "episodes",
                "episodes_per_s",
            ],
        )
    )
    return 0
