"""``searchgym demo``: the main job on the embedded default world, end to end on a laptop CPU.

Generate the default world → warm-start a tiny model on oracle demonstrations (SFT) → train it further
with GRPO and with GRPO+LLDS (action gate) for the same short budget → print a comparison table (test EM
…) and write the curves under ``RUN_DIR``. About ten minutes on two CPU cores.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchgym.cli._common import format_table
from searchgym.cli.bench_headroom import command_options

if TYPE_CHECKING:
    from searchgym.agents.training.config import TrainConfig

COMMAND = ("demo",)
HELP = "generate the default world, warm-start a tiny model, train GRPO vs GRPO+LLDS, compare on test"

# Short turns and contexts: the oracle's turns are < 20 tokens and its transcripts < 500.
_ENV: dict[str, Any] = {"max_turn_tokens": 48, "max_context_tokens": 1024}
COLUMNS = ["model", "test_em", "em_95ci", "test_f1", "searches", "answered", "minutes"]
"""The columns of the comparison table the demo prints."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run-dir",
        default=None,
        help="where the runs, metrics and plots go (default: runs/demo, or runs/demo-2, -3 … when it is taken: "
        "an earlier demo is never replaced unless you name its folder and pass --overwrite)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace the runs in an existing --run-dir")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0, help="seed of every stage")
    parser.add_argument(
        "--extra-worlds",
        type=int,
        default=1,
        help="also warm up on every question of this many other generated worlds (seeds 1, 2, …): other "
        "names and facts, so more copying practice without touching world 0's test questions",
    )
    parser.add_argument(
        "--demos-per-world",
        type=int,
        default=None,
        help="cap the demonstrations per world and split (default: all)",
    )
    parser.add_argument("--sft-epochs", type=int, default=1, help="passes over the demonstrations")
    parser.add_argument("--layers", type=int, default=3, help="layers of the tiny model")
    parser.add_argument("--grpo-steps", type=int, default=12, help="rollout batches per GRPO variant")
    parser.add_argument("--lr", type=float, default=1e-4, help="GRPO learning rate")
    parser.add_argument("--questions-per-step", type=int, default=4, help="GRPO questions per rollout batch")
    parser.add_argument("--eval-questions", type=int, default=200, help="test questions scored greedily")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def run(args: argparse.Namespace) -> int:
    import torch

    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.agents.grpo.trainer import train_grpo
    from searchgym.agents.sft import train_sft
    from searchgym.agents.training.config import SFTConfig
    from searchgym.cli import plot

    torch.set_num_threads(args.threads)
    root = demo_dir(args.run_dir, args.overwrite)
    print(f"demo runs go to {root}/")
    start = time.perf_counter()
    common: dict[str, Any] = {
        **_ENV,
        "threads": args.threads,
        "seed": args.seed,
        "eval_questions": args.eval_questions,
        "progress": not args.no_progress,
    }

    print("[1/4] oracle demonstrations of the generated world")
    demos = _write_demonstrations(
        root / "demos.jsonl", args.extra_worlds, args.seed, args.demos_per_world, not args.no_progress
    )
    print(f"[2/4] supervised warm-start on {demos} oracle demonstrations ({args.sft_epochs} epochs)")
    sft = SFTConfig(
        run_dir=str(root / "sft"),
        demos=str(root / "demos.jsonl"),
        epochs=args.sft_epochs,
        tiny_layers=args.layers,
        overwrite=True,  # inside a folder demo_dir() handed out: fresh, or replaced by request
        **common,
    )
    untrained = _evaluate_untrained(sft)
    sft_metrics = train_sft(sft)
    rows = [
        _row("untrained tiny model", untrained, 0.0),
        _row("SFT warm-start", sft_metrics, time.perf_counter() - start),
    ]
    print(f"      test EM {sft_metrics.get('eval/em', float('nan')):.3f}")
    argv = command_options(
        root / "sft" / "checkpoint.pt",
        _ENV,
        questions=min(100, args.eval_questions),
        samples=4,
        seed=args.seed,
        threads=args.threads,
    )
    headroom = _headroom(argv, not args.no_progress)
    (root / "headroom.json").write_text(json.dumps(headroom) + "\n", encoding="utf-8")
    print(f"      {headroom_sentence(headroom)}")
    print(f"      (searchgym bench headroom {' '.join(argv)})")

    runs = []
    for i, (name, llds) in enumerate((("GRPO", "none"), ("GRPO+LLDS (action)", "action")), start=3):
        print(f"[{i}/4] {name}: {args.grpo_steps} steps from the warm-start")
        t0 = time.perf_counter()
        cfg = GRPOConfig(
            run_dir=str(root / ("grpo" if llds == "none" else "grpo_llds")),
            init=str(root / "sft" / "checkpoint.pt"),
            llds=llds,
            steps=args.grpo_steps,
            questions_per_step=args.questions_per_step,
            lr=args.lr,
            save_every=0,
            eval_at_start=False,
            onpolicy_probe_size=32,  # half the default: the demo's warm-start rarely answers right
            overwrite=True,  # inside a folder demo_dir() handed out: fresh, or replaced by request
            **common,
        )
        metrics = train_grpo(cfg)
        rows.append(_row(name, metrics, time.perf_counter() - t0))
        runs.append(cfg.run.run_dir)

    plot.run(
        argparse.Namespace(
            runs=runs,
            out=str(root / "curves.png"),
            labels=["GRPO", "GRPO+LLDS"],
            smooth=1,
            title="searchgym demo: GRPO vs GRPO+LLDS (action) from one SFT warm-start, per training step",
            warm_start_em=sft_metrics.get("eval/em"),  # the GRPO runs skip their own step-0 evaluation
        )
    )
    print()
    print(format_table(rows, COLUMNS))
    print()
    print(protocol_sentence(rows[0], rows[1]))
    print(headroom_sentence(headroom))
    for line in verdict(rows[1:]):
        print(line)
    print(
        f"\ntotal {(time.perf_counter() - start) / 60:.1f} min. Runs, metrics.jsonl and checkpoints are under {root}/."
        f"\nLook at {root}/curves.png: top left, the rollout reward and test EM of both runs (dashed: the\n"
        "warm-start's EM); top middle, the probe set's log-likelihood per action kind (falling = displacement\n"
        "of correct behaviour); top right, LLD itself: the change of log-likelihood of each step's own\n"
        "responses, by advantage sign (A > 0 at or below 0 is the warning sign); bottom left, the per-update\n"
        "gradient-norm maximum (spikes: the late phase of the collapse). This budget shows the pipeline, not\n"
        "the result: a warm-start that answers (EM ~0.5) takes longer than the demo's 15 minutes to build\n"
        "(docs/experiments/warmstart.md measures how far `searchgym warmstart` gets in minutes).\n"
        "The pre-registered studies and their verdicts: docs/experiments/learn.md (GRPO beats a frozen\n"
        "control in sampled reward, not in greedy EM), docs/experiments/lld3.md (learn, then collapse),\n"
        "docs/experiments/learn2.md (RL beyond imitation: greedy EM from a warm-start with designed headroom)\n"
        "and docs/experiments/lld4.md (greedy EM rises, then collapses: the cures tried, a KL pull among them)."
    )
    return 0


def demo_dir(run_dir: str | None, overwrite: bool) -> Path:
    """The demo's folder: ``run_dir`` (refused when it holds a run, unless ``overwrite``), else ``runs/demo``
    or the first free ``runs/demo-N``, so running the demo twice never replaces the first one's runs.

    Raises:
        ConfigError: ``run_dir`` is not empty and ``overwrite`` is not set.
    """
    from searchgym.errors import ConfigError

    if run_dir is not None:
        root = Path(run_dir)
        if root.exists() and any(root.iterdir()) and not overwrite:
            raise ConfigError(
                f"{root} already holds a demo's runs; pass --overwrite to replace them (make demo "
                f"DEMO_ARGS='--run-dir {root} --overwrite'), or another --run-dir"
            )
        return root
    root, n = Path("runs/demo"), 1
    while root.exists() and any(root.iterdir()):
        n += 1
        root = Path(f"runs/demo-{n}")
    return root


def protocol_sentence(before: dict[str, Any], after: dict[str, Any]) -> str:
    """The sentence under the table: what the warm-start (``after``) changed against the untrained model.

    It says the warm-start taught the protocol only when more episodes end with an answer and more searches
    are made than before; otherwise it says it did not."""
    answered = (before["answered"] or 0, after["answered"] or 0)
    searches = (before["searches"] or 0, after["searches"] or 0)
    em = (before["test_em"] or 0, after["test_em"] or 0)
    taught = answered[1] > answered[0] and searches[1] > searches[0]
    return (
        f"SFT {'taught' if taught else 'did not teach'} the protocol: episodes ending with an answer "
        f"{answered[0]:.0%} -> {answered[1]:.0%}, searches per episode {searches[0]:.2f} -> {searches[1]:.2f}, "
        f"test EM {em[0]:.3f} -> {em[1]:.3f}."
    )


def wilson(p: float, n: int) -> tuple[float, float]:
    """The 95 % interval of a rate ``p`` measured on ``n`` questions (:func:`searchgym.stats.wilson`, the rule
    of every searchgym table); ``(0, 1)`` when nothing was measured."""
    from searchgym import stats

    if n <= 0:
        return (0.0, 1.0)
    interval = stats.wilson(p * n, n)
    return (interval.low, interval.high)


def _evaluate_untrained(config: TrainConfig) -> dict[str, float]:
    """Greedy play of the freshly initialised tiny model (the SFT run's starting point) on the eval questions."""
    from searchgym.agents.training.policy import config_policy
    from searchgym.agents.training.rollout import evaluate_greedy

    policy, _ = config_policy(config)
    scores = evaluate_greedy(
        policy.model, policy.tokenizer, config.env, config.eval, progress=config.run.progress
    )
    return {f"eval/{k}": v for k, v in scores.items()}


def _headroom(argv: list[str], progress: bool) -> dict[str, Any]:
    """``searchgym bench headroom ARGV``'s figures on the warm-start's checkpoint (what RL can find that
    greedy play misses)."""
    from searchgym.cli.bench_headroom import measure_command

    return measure_command([*argv, *([] if progress else ["--no-progress"])])


def headroom_sentence(figures: dict[str, Any]) -> str:
    """What ``bench headroom`` says of the warm-start: the most greedy EM RL could reach by flipping the
    questions some sample solves."""
    k, solvable = figures["samples"], figures["solvable_given_greedy_wrong"]
    return (
        f"Headroom at the warm-start ({figures['questions']} test questions, {k} samples at T 1): greedy EM "
        f"{figures['greedy_em']:.3f}, pass@{k} {figures['pass_at_k']:.3f}; where greedy is wrong, "
        f"{0.0 if solvable is None else solvable:.0%} of the questions have a correct sample, so flipping them "
        f"all would give greedy EM {figures['greedy_gain_bound']:.3f}."
    )


def verdict(rows: list[dict[str, Any]]) -> list[str]:
    """Plain sentences comparing each GRPO row with the warm-start (first row), on test EM and on the share
    of episodes that end with an answer (the protocol): separable beyond the 95% intervals, or not."""
    base = rows[0]
    out = []
    for row in rows[1:]:
        for key, name in (("test_em", "test EM"), ("answered", "answered share")):
            if row[key] is None or base[key] is None:
                continue
            diff = row[key] - base[key]
            (lo, hi), (blo, bhi) = wilson(row[key], row["n"]), wilson(base[key], base["n"])
            if lo > bhi or hi < blo:
                word = "higher" if diff > 0 else "lower"
                out.append(
                    f"{row['model']}: {name} {diff:+.3f} vs the warm-start — {word}, beyond the 95% intervals."
                )
            elif key == "test_em":
                out.append(
                    f"{row['model']}: {name} {diff:+.3f} vs the warm-start — the 95% intervals overlap: at this "
                    f"budget ({int(row['n'])} questions) the demo cannot tell them apart."
                )
    return out


def _write_demonstrations(
    path: Path, extra_worlds: int, seed: int, cap: int | None = None, progress: bool = False
) -> int:
    """Oracle transcripts of world 0's train split and of every split of ``extra_worlds`` other worlds
    (``progress``: a bar of the episodes played)."""
    import gymnasium as gym
    from tqdm.auto import tqdm

    import searchgym  # noqa: F401 - registers the env ids
    from searchgym.agents.demonstrations import generate_demonstrations, write_demonstrations

    sources = [(0, "train")] + [
        (w, s) for w in range(1, extra_worlds + 1) for s in ("train", "validation", "test")
    ]
    envs: list[Any] = [gym.make("SearchQA-v0", world_seed=w, split=s, **_ENV) for w, s in sources]
    sizes = [len(env.unwrapped.questions) for env in envs]
    sizes = [n if cap is None else min(cap, n) for n in sizes]

    def transcripts() -> Any:
        for env, n in zip(envs, sizes, strict=True):
            yield from generate_demonstrations(env, n, seed)
            env.close()

    bar = tqdm(transcripts(), total=sum(sizes), desc="demos", disable=not progress)
    return write_demonstrations(bar, path)


def _row(name: str, metrics: dict[str, float], seconds: float) -> dict[str, Any]:
    em, n = metrics.get("eval/em"), int(metrics.get("eval/episodes") or 0)
    ci = wilson(em, n) if em is not None else (float("nan"), float("nan"))
    return {
        "model": name,
        "test_em": em,
        "ci": ci,
        "n": n,
        "em_95ci": f"[{ci[0]:.3f}, {ci[1]:.3f}]",
        "test_f1": metrics.get("eval/f1"),
        "searches": metrics.get("eval/searches"),
        "answered": metrics.get("eval/answered"),
        "minutes": seconds / 60,
    }
