"""``searchgym demo``: the main job on the embedded default world, end to end on a laptop CPU.

Generate the default world → warm-start a tiny model on oracle demonstrations (SFT) → train it further
with GRPO and with GRPO+LLDS (action gate) for the same short budget → print a comparison table (test EM
…) and write the curves under ``RUN_DIR``. About ten minutes on two CPU cores.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from searchgym.cli._common import format_table

COMMAND = ("demo",)
HELP = "generate the default world, warm-start a tiny model, train GRPO vs GRPO+LLDS, compare on test"

# Short turns and contexts: the oracle's turns are < 20 tokens and its transcripts < 500.
_ENV: dict[str, Any] = {"max_turn_tokens": 48, "max_context_tokens": 1024}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", default="runs/demo", help="where the runs, metrics and plots go")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0, help="seed of every stage")
    parser.add_argument(
        "--extra-worlds",
        type=int,
        default=1,
        help="also warm up on every question of this many other generated worlds (seeds 1, 2, …): other "
        "names and facts, so more copying practice without touching world 0's test questions",
    )
    parser.add_argument("--sft-epochs", type=int, default=2, help="passes over the demonstrations")
    parser.add_argument("--layers", type=int, default=3, help="layers of the tiny model")
    parser.add_argument("--grpo-steps", type=int, default=12, help="rollout batches per GRPO variant")
    parser.add_argument("--lr", type=float, default=1e-4, help="GRPO learning rate")
    parser.add_argument("--eval-questions", type=int, default=200, help="test questions scored greedily")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def run(args: argparse.Namespace) -> int:
    import torch

    from searchgym.agents.grpo.config import GRPOConfig, SFTConfig
    from searchgym.agents.grpo.sft import train_sft
    from searchgym.agents.grpo.trainer import train_grpo
    from searchgym.cli import plot

    torch.set_num_threads(args.threads)
    root = Path(args.run_dir)
    start = time.perf_counter()
    common: dict[str, Any] = {
        **_ENV,
        "threads": args.threads,
        "seed": args.seed,
        "eval_questions": args.eval_questions,
        "progress": not args.no_progress,
    }

    demos = _write_demonstrations(root / "demos.jsonl", args.extra_worlds, args.seed)
    print(f"[1/4] supervised warm-start on {demos} oracle demonstrations ({args.sft_epochs} epochs)")
    sft = SFTConfig(
        run_dir=str(root / "sft"),
        demos=str(root / "demos.jsonl"),
        epochs=args.sft_epochs,
        tiny_layers=args.layers,
        **common,
    )
    sft_metrics = train_sft(sft)
    rows = [_row("SFT warm-start", sft_metrics, time.perf_counter() - start)]
    print(f"      test EM {sft_metrics.get('eval/em', float('nan')):.3f}")

    runs = []
    for i, (name, llds) in enumerate((("GRPO", "none"), ("GRPO+LLDS (action)", "action")), start=2):
        print(f"[{i}/4] {name}: {args.grpo_steps} steps from the warm-start")
        t0 = time.perf_counter()
        cfg = GRPOConfig(
            run_dir=str(root / ("grpo" if llds == "none" else "grpo_llds")),
            init=str(root / "sft" / "checkpoint.pt"),
            llds=llds,  # type: ignore[arg-type]
            steps=args.grpo_steps,
            questions_per_step=4,
            group_size=5,
            minibatch_size=5,
            epochs=2,
            lr=args.lr,
            save_every=0,
            **common,
        )
        metrics = train_grpo(cfg)
        rows.append(_row(name, metrics, time.perf_counter() - t0))
        runs.append(cfg.run_dir)

    print("[4/4] curves")
    plot.run(
        argparse.Namespace(
            runs=runs,
            out=str(root / "curves.png"),
            labels=["GRPO", "GRPO+LLDS"],
            smooth=1,
            title="searchgym demo",
        )
    )
    print()
    columns = ["model", "test_em", "test_f1", "searches", "answered", "last_reward", "minutes"]
    print(format_table(rows, columns))
    print(
        f"\ntotal {(time.perf_counter() - start) / 60:.1f} min; runs, metrics.jsonl and curves under {root}/"
    )
    return 0


def _write_demonstrations(path: Path, extra_worlds: int, seed: int) -> int:
    """Oracle transcripts of world 0's train split and of every split of ``extra_worlds`` other worlds."""
    import gymnasium as gym

    import searchgym  # noqa: F401 - registers the env ids
    from searchgym.agents.demonstrations import generate_demonstrations, write_demonstrations

    def transcripts() -> Any:
        sources = [(0, "train")] + [
            (w, s) for w in range(1, extra_worlds + 1) for s in ("train", "validation", "test")
        ]
        for world, split in sources:
            env: Any = gym.make("SearchQA-v0", world_seed=world, split=split, **_ENV)
            yield from generate_demonstrations(env, len(env.unwrapped.questions), seed)

    return write_demonstrations(transcripts(), path)


def _row(name: str, metrics: dict[str, float], seconds: float) -> dict[str, Any]:
    return {
        "model": name,
        "test_em": metrics.get("eval/em"),
        "test_f1": metrics.get("eval/f1"),
        "searches": metrics.get("eval/searches"),
        "answered": metrics.get("eval/answered"),
        "last_reward": metrics.get("rollout/reward"),
        "minutes": seconds / 60,
    }
