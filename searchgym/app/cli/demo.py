"""``searchgym demo``: the main job on the embedded default world, end to end on a laptop CPU.

Build a warm-start with designed headroom from nothing (``searchgym warmstart``'s recipe) → measure the
headroom RL could find (``bench headroom``) → train it further with GRPO and with GRPO+LLDS (action gate)
for the same short budget → score all three greedily on the same test questions and print the table: test
EM with its interval and each run's paired gain over the frozen warm-start, with McNemar's p. The curves go
under ``RUN_DIR``. About 11 minutes on two CPU cores (docs/experiments/warmstart.md).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from searchgym.app.cli._common import format_table
from searchgym.app.cli.bench_headroom import command_options

COMMAND = ("demo",)
HELP = "build a warm-start with headroom, train GRPO and GRPO+LLDS from it, compare on test questions"

COLUMNS = [
    "model",
    "test_em",
    "em_95ci",
    "gain",
    "gain_95ci",
    "mcnemar_p",
    "lost/gained",
    "searches",
    "minutes",
]
"""The columns of the comparison table the demo prints."""
RECIPE_PREFIX = "warmstart-"
"""The demo's recipe options are the warm-start command's, named ``--warmstart-epochs`` and so on."""
SUMMARY = "summary.json"
"""The demo's figures (rows, per-question outcomes' digest, headroom, machine), beside its runs."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from searchgym.app.cli.warmstart import RECIPES, add_recipe_options

    parser.add_argument(
        "--run-dir",
        default=None,
        help="where the runs, metrics and plots go (default: runs/demo, or runs/demo-2, -3 … when it is taken: "
        "an earlier demo is never replaced unless you name its folder and pass --overwrite)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace the runs in an existing --run-dir")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0, help="seed of every stage")
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="headroom", help="the warm-start recipe")
    add_recipe_options(parser, prefix=RECIPE_PREFIX)
    parser.add_argument("--grpo-steps", type=int, default=20, help="rollout batches per GRPO variant")
    parser.add_argument("--lr", type=float, default=2e-4, help="GRPO learning rate (constant)")
    parser.add_argument("--questions-per-step", type=int, default=48, help="GRPO questions per rollout batch")
    parser.add_argument("--group-size", type=int, default=5, help="GRPO samples per question")
    parser.add_argument(
        "--eval-questions", type=int, default=500, help="test questions every model is scored on, greedily"
    )
    parser.add_argument(
        "--headroom-questions", type=int, default=100, help="test questions of the headroom line (0: skip it)"
    )
    parser.add_argument("--headroom-samples", type=int, default=8, help="samples per question at T 1 (K)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def run(args: argparse.Namespace) -> int:
    import torch

    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.agents.grpo.trainer import train_grpo
    from searchgym.app.cli import plot
    from searchgym.app.cli.warmstart import RECIPES, build, machine, recipe_changes

    torch.set_num_threads(args.threads)
    root = demo_dir(args.run_dir, args.overwrite)
    progress = not args.no_progress
    recipe = replace(RECIPES[args.recipe], **recipe_changes(args, prefix=RECIPE_PREFIX))
    print(f"demo runs go to {root}/; the world: {recipe.world()}")
    start = time.perf_counter()

    print(f"[1/4] warm-start: searchgym warmstart --recipe {args.recipe} (the {recipe.mix} demonstrator)")
    t0 = time.perf_counter()
    card = build(
        root / "warmstart",
        recipe,
        name=args.recipe,
        seed=args.seed,
        threads=args.threads,
        overwrite=True,  # inside a folder demo_dir() handed out: fresh, or replaced by request
        demos_per_world=args.demos_per_world,
        eval_questions=args.eval_questions,  # the frozen baseline, question by question
        headroom_questions=0,
        progress=progress,
    )
    checkpoint = root / "warmstart" / "checkpoint.pt"
    test = card["test"]
    warm = {
        "metrics": {"eval/searches": test["searches"], "eval/answered": test["answered"]},
        "outcomes": read_outcomes(root / "warmstart", 0),
    }
    rows = [row("warm-start", warm, None, time.perf_counter() - t0)]
    print(
        f"      greedy test EM {rows[0]['test_em']:.3f} {rows[0]['em_95ci']} ({card['wall_s'] / 60:.1f} min)"
    )

    headroom: dict[str, Any] | None = None
    if args.headroom_questions > 0:
        print(f"[2/4] headroom at the warm-start ({args.headroom_questions} test questions)")
        argv = command_options(
            checkpoint,
            recipe.env(),
            questions=args.headroom_questions,
            samples=args.headroom_samples,
            seed=args.seed,
            threads=args.threads,
        )
        headroom = _headroom(argv, progress)
        (root / "headroom.json").write_text(json.dumps(headroom) + "\n", encoding="utf-8")
        print(f"      {headroom_sentence(headroom)}")
        print(f"      (searchgym bench headroom {' '.join(argv)})")
    else:
        print("[2/4] headroom: skipped (--headroom-questions 0)")

    runs = []
    for i, (name, llds) in enumerate((("GRPO", "none"), ("GRPO+LLDS (action)", "action")), start=3):
        print(f"[{i}/4] {name}: {args.grpo_steps} steps from the warm-start")
        t0 = time.perf_counter()
        cfg = GRPOConfig(
            run_dir=str(root / ("grpo" if llds == "none" else "grpo_llds")),
            init=str(checkpoint),
            llds=llds,
            steps=args.grpo_steps,
            questions_per_step=args.questions_per_step,
            group_size=args.group_size,
            lr=args.lr,
            lr_schedule="constant",
            warmup_steps=0,
            kl_coef=0.0,
            entropy_coef=0.0,
            weight_decay=0.0,
            probe_size=32,
            probe_every=5,
            onpolicy_probe_size=0,
            ledger_size=0,
            save_every=0,
            eval_at_start=False,  # the frozen warm-start was scored above, on the same questions
            eval_split="test",
            eval_questions=args.eval_questions,
            eval_batch=100,
            threads=args.threads,
            seed=args.seed,
            progress=progress,
            overwrite=True,  # inside a folder demo_dir() handed out: fresh, or replaced by request
            **recipe.env(),
        )
        metrics = train_grpo(cfg)
        outcomes = read_outcomes(Path(cfg.run.run_dir), args.grpo_steps)
        rows.append(
            row(name, {"metrics": metrics, "outcomes": outcomes}, warm["outcomes"], time.perf_counter() - t0)
        )
        runs.append(cfg.run.run_dir)

    plot.run(
        argparse.Namespace(
            runs=runs,
            out=str(root / "curves.png"),
            labels=["GRPO", "GRPO+LLDS"],
            smooth=1,
            title="searchgym demo: GRPO vs GRPO+LLDS (action) from one warm-start, per training step",
            warm_start_em=rows[0]["test_em"],  # the GRPO runs skip their own step-0 evaluation
        )
    )
    total = time.perf_counter() - start
    summary = {
        "seed": args.seed,
        "threads": args.threads,
        "recipe": card["options"],
        "world": recipe.world(),
        "grpo": {"steps": args.grpo_steps, "lr": args.lr, "questions_per_step": args.questions_per_step},
        "rows": [{k: v for k, v in r.items() if k != "outcomes"} for r in rows],
        "headroom": headroom,
        "wall_s": total,
        "machine": machine(),
    }
    (root / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print()
    print(format_table(rows, COLUMNS))
    print()
    if headroom is not None:
        print(headroom_sentence(headroom))
    for line in verdict(rows):
        print(line)
    print(
        f"\ntotal {total / 60:.1f} min. Runs, metrics.jsonl, checkpoints and {SUMMARY} are under {root}/."
        f"\nLook at {root}/curves.png: top left, the rollout reward and test EM of both runs (dashed: the\n"
        "warm-start's EM); top middle, the probe set's log-likelihood per action kind (falling = displacement\n"
        "of correct behaviour); top right, LLD itself: the change of log-likelihood of each step's own\n"
        "responses, by advantage sign (A > 0 at or below 0 is the warning sign); bottom left, the per-update\n"
        "gradient-norm maximum (spikes: the late phase of the collapse).\n"
        "The warm-start imitates a demonstrator who answers most bridge questions after one search (a wrong\n"
        "shortcut); a sample sometimes makes the second search, and GRPO learns from those samples what\n"
        "imitation did not teach. docs/experiments/warmstart.md measures the recipe and this demo's seeds;\n"
        "docs/experiments/learn2.md shows the same gain at full size, beyond the same compute of imitation;\n"
        "docs/experiments/lld4.md and lld5.md show what happens when training goes on (the rise collapses)."
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


def read_outcomes(run_dir: Path, step: int) -> dict[str, float]:
    """Each question's EM at ``step`` in a run's ``eval_episodes.jsonl``."""
    from searchgym.agents.training.run import EVAL_EPISODES

    out: dict[str, float] = {}
    with open(run_dir / EVAL_EPISODES, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if record["step"] == step:
                out[record["question_id"]] = float(record["em"])
    return out


def paired_gain(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """``after``'s EM minus ``before``'s on the same questions: the mean difference with its percentile-bootstrap
    interval (:func:`searchgym.stats.bootstrap_mean`, resampling questions) and McNemar's exact p with the
    questions lost and gained.

    Raises:
        ValueError: the two were not scored on the same questions.
    """
    import numpy as np

    from searchgym import stats

    if set(before) != set(after) or not before:
        raise ValueError(
            f"a paired gain needs the same questions: {len(before)} and {len(after)} outcomes, "
            f"{len(set(before) ^ set(after))} not shared"
        )
    ids = sorted(before)
    a = np.array([before[q] for q in ids]) > 0.5
    b = np.array([after[q] for q in ids]) > 0.5
    interval = stats.bootstrap_mean(b.astype(float) - a.astype(float))
    p, lost, gained = stats.mcnemar_p(a, b)
    return {
        "gain": interval.mean,
        "low": interval.low,
        "high": interval.high,
        "p": p,
        "lost": lost,
        "gained": gained,
    }


def row(name: str, run: dict[str, Any], baseline: dict[str, float] | None, seconds: float) -> dict[str, Any]:
    """One line of the table: ``run``'s greedy test figures, and its paired gain over ``baseline``'s
    per-question outcomes (none for the baseline itself)."""
    metrics, outcomes = run["metrics"], run["outcomes"]
    n = len(outcomes)
    em = sum(outcomes.values()) / n if n else float("nan")
    lo, hi = wilson(em, n)
    out: dict[str, Any] = {
        "model": name,
        "test_em": em,
        "n": n,
        "ci": (lo, hi),
        "em_95ci": f"[{lo:.3f}, {hi:.3f}]",
        "searches": metrics.get("eval/searches"),
        "answered": metrics.get("eval/answered"),
        "minutes": seconds / 60,
        "outcomes": outcomes,
    }
    if baseline is not None:
        g = paired_gain(baseline, outcomes)
        out |= {
            "gain": f"{g['gain']:+.3f}",
            "gain_95ci": f"[{g['low']:+.3f}, {g['high']:+.3f}]",
            "mcnemar_p": f"{g['p']:.2g}",
            "lost/gained": f"{g['lost']}/{g['gained']}",
            "paired": g,
        }
    return out


def wilson(p: float, n: int) -> tuple[float, float]:
    """The 95 % interval of a rate ``p`` measured on ``n`` questions (:func:`searchgym.stats.wilson`, the rule
    of every searchgym table); ``(0, 1)`` when nothing was measured."""
    from searchgym import stats

    if n <= 0:
        return (0.0, 1.0)
    interval = stats.wilson(p * n, n)
    return (interval.low, interval.high)


def _headroom(argv: list[str], progress: bool) -> dict[str, Any]:
    """``searchgym bench headroom ARGV``'s figures on the warm-start's checkpoint (what RL can find that
    greedy play misses)."""
    from searchgym.app.cli.bench_headroom import measure_command

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
    """One sentence per trained row (every row after the first, the frozen warm-start): its paired gain in
    greedy test EM, and whether the 95 % interval of that gain excludes 0."""
    out = []
    for r in rows[1:]:
        g = r["paired"]
        head = (
            f"{r['model']}: greedy test EM {g['gain']:+.3f} [{g['low']:+.3f}, {g['high']:+.3f}] over the frozen "
            f"warm-start on the same {r['n']} questions ({g['gained']} gained, {g['lost']} lost, McNemar p "
            f"{g['p']:.2g})"
        )
        if g["low"] > 0:
            out.append(f"{head}: RL improved greedy play beyond the paired interval.")
        elif g["high"] < 0:
            out.append(f"{head}: RL made greedy play worse, beyond the paired interval.")
        else:
            out.append(f"{head}: the interval holds 0, so at this budget the demo cannot tell them apart.")
    return out
