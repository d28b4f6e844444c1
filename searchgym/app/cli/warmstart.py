"""``searchgym warmstart``: build, from nothing but the package, a warm-start with designed headroom.

The ``headroom`` recipe (the idea of ``docs/experiments/learn2.md``): a tiny model imitates a mixed
demonstrator, ``shortcut`` on most bridge questions (it answers the bridge entity: plausible, always wrong)
and ``oracle`` as a minority, in a demo-sized world (one passage per search: short transcripts, so cheap
updates). Greedy play takes the shortcut; sampled play sometimes takes the oracle's second search: headroom
that RL can find. The command writes the checkpoint, its demonstrations and a card (``card.json``,
``card.md``: the recipe, its options, the build's wall time, greedy test EM with its interval and the
headroom figures of ``bench headroom``) into ``RUN_DIR``. ``docs/experiments/warmstart.md`` measures the
recipe's levers.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

COMMAND = ("warmstart",)
HELP = "build a warm-start with designed headroom from nothing (a recipe), with its card"

HEADROOM_CLASS = "bridge"
"""The question kind where the recipe's demonstrator is worse than the episode allows."""
GATE_GREEDY_MAX = 0.20
"""The gate: the headroom class's greedy EM at most this (the shortcut took hold) …"""
GATE_SOLVABLE_MIN = 0.20
"""… and its ``solvable_given_greedy_wrong`` at least this (a sample finds the better strategy)."""


@dataclass(frozen=True)
class Recipe:
    """What a warm-start is built from: the world it plays, the demonstrations and the supervised run."""

    topk: int = 1
    """Passages per search (the demo-sized world: the default world's 3 cost ~50 % longer transcripts)."""
    max_turn_tokens: int = 48
    max_context_tokens: int = 1024
    mix: str = "mix:oracle=0.35,shortcut=0.65"
    """The demonstrator (``searchgym demos --demonstrator``)."""
    extra_worlds: int = 0
    """Also demonstrate every split of this many other generated worlds (seeds 1, 2, …)."""
    epochs: int = 10
    batch_size: int = 16
    batch_order: str = "random"
    """``random``, or ``length``: demonstrations of about the same length batched together (less padding)."""
    curriculum: str | None = None
    """``KIND:N``: the first ``N`` epochs learn from ``KIND``'s questions only (e.g. ``attribute:2``)."""
    lr: float = 4e-3
    lr_schedule: str = "linear"
    warmup_steps: int = 20
    layers: int = 2
    hidden: int = 128

    def env(self) -> dict[str, Any]:
        """The env options of the recipe's world (``gym.make("SearchQA-v0", **env)``, every split)."""
        return {
            "topk": self.topk,
            "max_turn_tokens": self.max_turn_tokens,
            "max_context_tokens": self.max_context_tokens,
        }

    def world(self) -> str:
        """The world in words, for the demo's and the card's first line."""
        return (
            f"the generated world (seed 0), {self.topk} passage{'s' if self.topk != 1 else ''} per search, "
            f"turns of {self.max_turn_tokens} tokens"
        )


RECIPES: dict[str, Recipe] = {"headroom": Recipe()}
"""The named recipes (``--recipe``)."""

_OVERRIDES: dict[str, tuple[type, str]] = {
    "topk": (int, "passages per search"),
    "mix": (str, "the demonstrator"),
    "extra_worlds": (int, "also demonstrate every split of this many other generated worlds"),
    "epochs": (int, "passes over the demonstrations"),
    "batch_size": (int, "demonstrations per update"),
    "batch_order": (str, "random, or length (demonstrations of about the same length batched together)"),
    "curriculum": (str, "KIND:N: the first N epochs learn from KIND's questions only (e.g. attribute:2)"),
    "lr": (float, "peak learning rate"),
    "lr_schedule": (str, "constant or linear (decay to 0)"),
    "warmup_steps": (int, "linear warm-up updates"),
    "layers": (int, "layers of the tiny model"),
    "hidden": (int, "hidden size of the tiny model"),
}


_CHOICES: dict[str, tuple[str, ...]] = {
    "lr_schedule": ("constant", "linear"),
    "batch_order": ("random", "length"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="headroom", help="the recipe")
    parser.add_argument("--run-dir", required=True, help="where the checkpoint, demonstrations and card go")
    parser.add_argument("--overwrite", action="store_true", help="replace a warm-start already in --run-dir")
    parser.add_argument("--seed", type=int, default=0, help="seed of the demonstrations, weights and order")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    add_recipe_options(parser)
    parser.add_argument(
        "--eval-questions", type=int, default=1000, help="test questions scored greedily (the card's EM)"
    )
    parser.add_argument(
        "--headroom-questions", type=int, default=300, help="test questions of the headroom check (0: skip)"
    )
    parser.add_argument("--headroom-samples", type=int, default=8, help="samples per question at T 1 (K)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def add_recipe_options(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """The options that change one of a recipe's settings (``searchgym warmstart``; ``searchgym demo`` names
    them with ``prefix``, e.g. ``--warmstart-epochs``)."""
    group = parser.add_argument_group("recipe options (default: the recipe's)")
    for name, (kind, text) in _OVERRIDES.items():
        flag = "--" + prefix + name.replace("_", "-")
        group.add_argument(flag, type=kind, default=None, help=text)
    group.add_argument(
        "--demos-per-world", type=int, default=None, help="cap the demonstrations per world and split"
    )


def recipe_changes(args: argparse.Namespace, prefix: str = "") -> dict[str, Any]:
    """The recipe settings ``args`` changes (those of :func:`add_recipe_options` given on the command line).

    Raises:
        ConfigError: an unknown learning-rate schedule or batch order, or a curriculum that is not ``KIND:N``
            (the message names the flag).
    """
    from searchgym.agents.training.config import parse_curriculum
    from searchgym.errors import ConfigError

    dest = prefix.replace("-", "_")
    given = {name: getattr(args, dest + name) for name in _OVERRIDES}
    changes = {name: value for name, value in given.items() if value is not None}
    for name, allowed in _CHOICES.items():
        if name in changes and changes[name] not in allowed:
            flag = "--" + prefix + name.replace("_", "-")
            raise ConfigError(f"{flag} must be {' or '.join(allowed)}, got {changes[name]!r}")
    if "curriculum" in changes:
        try:
            parse_curriculum(changes["curriculum"])
        except ConfigError as e:
            raise ConfigError(f"--{prefix}curriculum: {e}") from None
    return changes


def run(args: argparse.Namespace) -> int:
    card = build(
        Path(args.run_dir),
        replace(RECIPES[args.recipe], **recipe_changes(args)),
        name=args.recipe,
        seed=args.seed,
        threads=args.threads,
        overwrite=args.overwrite,
        demos_per_world=args.demos_per_world,
        eval_questions=args.eval_questions,
        headroom_questions=args.headroom_questions,
        headroom_samples=args.headroom_samples,
        progress=not args.no_progress,
    )
    print(card_text(card))
    return 0


def build(
    run_dir: Path,
    recipe: Recipe,
    *,
    name: str = "headroom",
    seed: int = 0,
    threads: int = 2,
    overwrite: bool = False,
    demos_per_world: int | None = None,
    eval_questions: int = 1000,
    headroom_questions: int = 300,
    headroom_samples: int = 8,
    progress: bool = True,
) -> dict[str, Any]:
    """Builds the warm-start of ``recipe`` in ``run_dir`` and writes its card.

    Steps: the mixed demonstrator's transcripts (``demos.jsonl``), supervised training from fresh tiny
    weights (``checkpoint.pt``: the wall time of these two is the card's ``wall_s``), greedy play of the first
    ``eval_questions`` test questions (per question in ``eval_episodes.jsonl``, step 0), and ``bench headroom`` on the first ``headroom_questions`` (K
    ``headroom_samples``, T 1; per question in ``headroom.jsonl``).

    Returns:
        The card (also in ``card.json`` and ``card.md``).

    Raises:
        ConfigError: ``run_dir`` holds a run and ``overwrite`` is not set.
    """
    import torch

    from searchgym.agents.sft import train_sft
    from searchgym.agents.training.config import SFTConfig
    from searchgym.agents.training.policy import build_policy
    from searchgym.agents.training.rollout import evaluate_greedy
    from searchgym.agents.training.run import append_eval_episodes
    from searchgym.stats import wilson

    torch.set_num_threads(threads)
    start = time.perf_counter()
    demos = run_dir / "demos.jsonl"
    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / "checkpoint.pt").exists() and not overwrite:
        from searchgym.errors import ConfigError

        raise ConfigError(
            f"{run_dir} already holds a warm-start; pass --overwrite to rebuild it, or another --run-dir"
        )
    config = SFTConfig(
        run_dir=str(run_dir),
        overwrite=True,
        demos=str(demos),
        keep_unrewarded=True,
        epochs=recipe.epochs,
        batch_size=recipe.batch_size,
        batch_order=recipe.batch_order,
        curriculum=recipe.curriculum,
        lr=recipe.lr,
        lr_schedule=recipe.lr_schedule,
        warmup_steps=recipe.warmup_steps,
        tiny_layers=recipe.layers,
        tiny_hidden=recipe.hidden,
        seed=seed,
        threads=threads,
        eval_questions=0,
        progress=progress,
        tensorboard=False,
        **recipe.env(),
    )
    counts = write_demonstrations(demos, recipe, seed, demos_per_world, progress=progress)
    train_sft(config)
    wall = time.perf_counter() - start
    checkpoint = run_dir / "checkpoint.pt"
    card: dict[str, Any] = {
        "recipe": name,
        "options": asdict(recipe),
        "world": recipe.world(),
        "seed": seed,
        "threads": threads,
        "demonstrations": counts,
        "wall_s": wall,
        "checkpoint": str(checkpoint),
        "machine": machine(),
    }
    if eval_questions > 0:
        policy, _ = build_policy(
            replace(config.model, init=str(checkpoint)), max_context_tokens=recipe.max_context_tokens
        )
        episodes: list[dict[str, Any]] = []
        result = evaluate_greedy(
            policy.model,
            policy.tokenizer,
            config.env,
            replace(config.eval, questions=eval_questions, batch=100),
            episodes,
            progress=progress,
        )
        append_eval_episodes(run_dir, 0, episodes, config.env.reward)
        n = int(result["episodes"])
        interval = wilson(result["em"] * n, n)
        card["test"] = {
            "questions": n,
            "greedy_em": result["em"],
            "em_95ci": [interval.low, interval.high],
            "searches": result["searches"],
            "answered": result["answered"],
        }
    if headroom_questions > 0:
        card["headroom"] = headroom(
            checkpoint,
            recipe,
            questions=headroom_questions,
            samples=headroom_samples,
            seed=seed,
            threads=threads,
            progress=progress,
            out=run_dir / "headroom.jsonl",
        )
    write_card(card, run_dir)
    return card


def headroom(
    checkpoint: Path,
    recipe: Recipe,
    *,
    questions: int,
    samples: int,
    seed: int,
    threads: int,
    progress: bool = True,
    out: Path | None = None,
) -> dict[str, Any]:
    """``searchgym bench headroom`` on ``checkpoint`` (its figures, the command that reproduces them, and the
    gate on :data:`HEADROOM_CLASS`)."""
    from searchgym.app.cli.bench_headroom import command_options, measure_command

    sizes = {
        "topk": recipe.topk,
        "max_turn_tokens": recipe.max_turn_tokens,
        "max_context_tokens": recipe.max_context_tokens,
    }
    argv = command_options(
        checkpoint, sizes, questions=questions, samples=samples, seed=seed, threads=threads
    )
    extra = [*([] if progress else ["--no-progress"]), *([] if out is None else ["--out", str(out)])]
    figures = measure_command([*argv, *extra])
    kind = figures["by_kind"].get(HEADROOM_CLASS)
    gate = None
    if kind is not None:
        solvable = kind["solvable_given_greedy_wrong"]
        gate = {
            "class": HEADROOM_CLASS,
            "greedy_em": kind["greedy_em"],
            "solvable_given_greedy_wrong": solvable,
            "met": kind["greedy_em"] <= GATE_GREEDY_MAX
            and solvable is not None
            and solvable >= GATE_SOLVABLE_MIN,
        }
    keep = ("questions", "samples", "greedy_em", "mean_at_k", "pass_at_k", "solvable_given_greedy_wrong")
    return {
        "command": "searchgym bench headroom " + " ".join(argv),
        **{k: figures[k] for k in (*keep, "greedy_gain_bound")},
        "by_kind": figures["by_kind"],
        "gate": gate,
    }


def write_demonstrations(
    path: Path, recipe: Recipe, seed: int, cap: int | None = None, *, progress: bool = True
) -> dict[str, int]:
    """The recipe's demonstrator on world 0's training split and every split of ``recipe.extra_worlds``
    other worlds; returns the count per teacher (``oracle``, ``shortcut``)."""
    from collections import Counter

    import gymnasium as gym
    from tqdm.auto import tqdm

    import searchgym  # noqa: F401 - registers the env ids
    from searchgym.agents.demonstrations import generate_demonstrations
    from searchgym.agents.demonstrations import write_demonstrations as write

    sources = [(0, "train")] + [
        (w, s) for w in range(1, recipe.extra_worlds + 1) for s in ("train", "validation", "test")
    ]
    envs = [gym.make("SearchQA-v0", world_seed=w, split=s, **recipe.env()) for w, s in sources]
    sizes = [len(env.unwrapped.questions) for env in envs]  # type: ignore[attr-defined]
    sizes = [n if cap is None else min(cap, n) for n in sizes]
    counts: Counter[str] = Counter()

    def transcripts() -> Any:
        for env, n in zip(envs, sizes, strict=True):
            for demo in generate_demonstrations(env, n, seed, recipe.mix):
                counts[demo.demonstrator] += 1
                yield demo
            env.close()

    bar = tqdm(transcripts(), total=sum(sizes), desc="demos", disable=not progress)
    write(bar, path)
    return dict(sorted(counts.items()))


def machine() -> dict[str, Any]:
    """The machine a figure was measured on: CPU model, cores, vector flags, torch version."""
    import os
    import platform

    import torch

    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name") and ":" in line:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and ":" in line:
                flags = {f for f in line.split(":", 1)[1].split() if f.startswith(("avx512", "amx", "avx2"))}
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "flags": sorted(flags), "torch": torch.__version__}


def write_card(card: dict[str, Any], run_dir: Path) -> None:
    """``card.json`` and ``card.md`` beside the checkpoint."""
    (run_dir / "card.json").write_text(json.dumps(card, indent=1) + "\n", encoding="utf-8")
    (run_dir / "card.md").write_text(card_text(card) + "\n", encoding="utf-8")


def card_text(card: dict[str, Any]) -> str:
    """The card in a few lines of markdown."""
    options = ", ".join(f"{k} {v}" for k, v in card["options"].items())
    m = card["machine"]
    lines = [
        f"# Warm-start: recipe `{card['recipe']}`, seed {card['seed']}",
        "",
        f"- world: {card['world']}",
        f"- options: {options}",
        f"- demonstrations: {', '.join(f'{k} {v}' for k, v in card['demonstrations'].items())}",
        f"- built in {card['wall_s'] / 60:.1f} min at {card['threads']} threads (demonstrations and SFT) on "
        f"{m['cpu']} ({m['cores']} cores; {' '.join(m['flags']) or 'no AVX2/AVX-512'}; torch {m['torch']})",
    ]
    if "test" in card:
        t = card["test"]
        lo, hi = t["em_95ci"]
        lines.append(
            f"- greedy test EM {t['greedy_em']:.3f} [{lo:.3f}, {hi:.3f}] on {t['questions']} questions"
        )
    if "headroom" in card:
        h = card["headroom"]
        solvable = h["solvable_given_greedy_wrong"]
        lines.append(
            f"- headroom ({h['questions']} test questions, K {h['samples']}, T 1): greedy EM "
            f"{h['greedy_em']:.3f}, pass@{h['samples']} {h['pass_at_k']:.3f}, solvable | greedy wrong "
            f"{0.0 if solvable is None else solvable:.3f}"
        )
        gate = h["gate"]
        if gate is not None:
            verdict = "met" if gate["met"] else "NOT met"
            s = gate["solvable_given_greedy_wrong"]
            lines.append(
                f"- gate on {gate['class']} questions (greedy EM <= {GATE_GREEDY_MAX}, solvable | greedy wrong "
                f">= {GATE_SOLVABLE_MIN}): {gate['greedy_em']:.3f}, {0.0 if s is None else s:.3f}: {verdict}"
            )
        lines.append(f"- reproduce the headroom figures: `{h['command']}`")
    return "\n".join(lines)
