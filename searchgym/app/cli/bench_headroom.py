"""``searchgym bench headroom``: can RL move greedy play? Success of sampled episodes where greedy fails."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchgym.app.cli._common import add_env_arguments, env_spec_from_args, format_table, run_env_defaults

if TYPE_CHECKING:
    from searchgym.app.bench.headroom import HeadroomSettings, QuestionRecord

COMMAND = ("bench", "headroom")
HELP = (
    "play each question greedily and K times sampled: pass@K, and how often samples succeed where greedy "
    "fails (by question kind and greedy failure stage)"
)

_MODEL_FIELDS: dict[str, type] = {
    "init": str,
    "model": str,
    "device": str,
    "dtype": str,
    "tiny_layers": int,
    "tiny_hidden": int,
    "threads": int,
}
"""The model options and their types: options of :class:`~searchgym.agents.training.config.TrainConfig`,
whose defaults and help they take (but for :data:`_HELP`'s)."""

_HELP = {
    "init": "the checkpoint to measure (a train sft or train grpo checkpoint.pt; its training turn and "
    "context sizes are the default --max-turn-tokens and --max-context-tokens); default: the tiny model at "
    "random weights (--tiny-layers, --tiny-hidden), or --model",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:

    from searchgym.agents.training.config import TrainConfig
    from searchgym.app.cli.eval import TRAINED_SIZES
    from searchgym.options import flat_options, literal_choices

    add_env_arguments(parser, run_env_defaults(), unset=TRAINED_SIZES)
    options = flat_options(TrainConfig)
    fields = {name: f for name, (_, f, _) in options.items()}
    hints = {name: hint for name, (_, _, hint) in options.items()}
    model = parser.add_argument_group("model")
    for name, kind in _MODEL_FIELDS.items():
        choices = list(literal_choices(hints[name])) or None
        model.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=kind,
            choices=choices,
            default=fields[name].default,
            help=_HELP.get(name, fields[name].metadata["help"]),
        )
    parser.add_argument(
        "--questions", type=int, default=200, help="the first N questions of --split are played"
    )
    parser.add_argument(
        "--samples", type=int, default=5, help="sampled episodes per question and temperature (K)"
    )
    parser.add_argument(
        "--temperatures",
        default="1",
        help="comma-separated sampling temperatures, e.g. 1,0.7; the first one's figures are also at the "
        "top level of --json (default: 1)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the samples (and of a tiny model's random weights)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=64, help="at most this many episodes generated together"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument(
        "--out",
        default=None,
        help="also write one JSON line per question (id, kind, greedy EM and failure stage, sampled EMs)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    figures = measure(args, settings_of(args))
    if args.json:
        print(json.dumps(figures))
    else:
        print(report(figures))
    return 0


def settings_of(args: argparse.Namespace) -> HeadroomSettings:
    """The play's settings from the command's options (checked).

    Raises:
        ConfigError: an env other than SearchQA-v0, fewer than one thread, or bad settings.
    """
    from searchgym.app.bench.headroom import HeadroomSettings, parse_temperatures
    from searchgym.errors import ConfigError

    settings = HeadroomSettings(
        questions=args.questions,
        samples=args.samples,
        temperatures=parse_temperatures(args.temperatures),
        seed=args.seed,
        batch_size=args.batch_size,
    )
    if args.env != "SearchQA-v0":
        raise ConfigError(f"bench headroom plays SearchQA-v0 (through its vector env), not --env {args.env}")
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    return settings


def command_options(
    checkpoint: Path | str,
    env: Mapping[str, int],
    *,
    questions: int,
    samples: int,
    seed: int,
    threads: int,
) -> list[str]:
    """The ``searchgym bench headroom`` options that measure ``checkpoint`` on the first ``questions`` test
    questions, ``samples`` samples at temperature 1, in the env sizes ``env`` gives (``max_turn_tokens``,
    ``max_context_tokens``, and ``topk`` when it holds one): what the demo and the warm-start recipe run and
    print, so anyone can run it again."""
    sizes = [
        f"--{k.replace('_', '-')}" for k in ("topk", "max_turn_tokens", "max_context_tokens") if k in env
    ]
    pairs = [(flag, str(env[flag[2:].replace("-", "_")])) for flag in sizes]
    return [
        "--init",
        str(checkpoint),
        "--split",
        "test",
        *(x for pair in pairs for x in pair),
        "--questions",
        str(max(questions, 1)),
        "--samples",
        str(samples),
        "--temperatures",
        "1",
        "--seed",
        str(seed),
        "--threads",
        str(threads),
    ]


def measure_command(argv: Sequence[str]) -> dict[str, Any]:
    """What ``searchgym bench headroom ARGV --json`` prints, as a dict (the demo and the warm-start recipe
    measure their checkpoints through it, so their figures are the command's)."""
    parser = argparse.ArgumentParser(prog="searchgym bench headroom")
    add_arguments(parser)
    args = parser.parse_args(list(argv))
    return measure(args, settings_of(args))


def measure(args: argparse.Namespace, settings: HeadroomSettings) -> dict[str, Any]:
    """Builds the policy and the env from ``args``, plays (:func:`~searchgym.app.bench.headroom.run_headroom`),
    and returns :func:`~searchgym.app.bench.headroom.headroom_figures` with the run's settings and wall time."""
    import torch

    from searchgym.agents.training.config import TrainConfig
    from searchgym.agents.training.policy import build_policy
    from searchgym.app.bench.headroom import LLMHeadroomPolicy, headroom_figures, run_headroom
    from searchgym.app.cli._manifest import warn_on_data_mismatch

    start = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = env_spec_from_args(args, _env_defaults(args))
    if args.init is not None or args.model is not None:
        warn_on_data_mismatch(f"checkpoint:{args.init or args.model}", spec)
    turn, context = spec.max_turn_tokens, spec.max_context_tokens
    config = TrainConfig(
        init=args.init,
        model=args.model,
        tokenizer=args.tokenizer,
        device=args.device,
        dtype=args.dtype,
        tiny_layers=args.tiny_layers,
        tiny_hidden=args.tiny_hidden,
        seed=args.seed,
        max_turn_tokens=turn,
        max_context_tokens=context,
        progress=False,
        tensorboard=False,
    )
    built, _ = build_policy(
        config.model,
        device=config.run.device,
        weights_seed=config.run.seed,
        max_context_tokens=config.env.max_context_tokens,
        max_turn_tokens=turn,
    )
    built.model.eval()
    policy = LLMHeadroomPolicy(built.model, built.tokenizer, turn)
    records = run_headroom(policy, spec, settings, tokenizer=built.tokenizer, progress=not args.no_progress)
    if args.out is not None:
        write_question_records(records, args.out)
    return {
        **headroom_figures(records),
        "split": args.split,
        "init": args.init,
        "model": args.model,
        "seed": settings.seed,
        "batch_size": settings.batch_size,
        "max_turn_tokens": turn,
        "max_context_tokens": context,
        "wall_s": time.perf_counter() - start,
    }


def write_question_records(records: Sequence[QuestionRecord], path: str) -> None:
    """One JSON line per question (id, kind, the greedy episode's EM and failure stage, each temperature's
    sampled EMs), written through ``PATH.partial``: the figures can be joined with other runs question by
    question."""
    from searchgym.data.jsonl import replace_on_success

    with replace_on_success(path) as partial, partial.open("w", encoding="utf-8") as f:
        for r in records:
            samples = {str(t): list(v) for t, v in r.samples.items()}
            line = {"question_id": r.question_id, "kind": r.kind, "stage": r.stage, "greedy": r.greedy}
            f.write(json.dumps(line | {"samples": samples}) + "\n")


def _env_defaults(args: argparse.Namespace) -> Any:
    """The env the command plays unless told otherwise: the ``--init`` checkpoint's (or the ``--model``
    folder's, as ``searchgym export`` wrote it) turn and context sizes, as ``searchgym eval`` takes them."""
    from searchgym.app.cli.eval import trained_env_spec, with_trained_sizes

    source = args.init if args.init is not None else args.model
    trained = trained_env_spec(f"checkpoint:{source}") if source is not None else None
    return with_trained_sizes(run_env_defaults(), trained)


def report(figures: dict[str, Any]) -> str:
    """The figures as text: one table per temperature, rows all / kind:K / stage:S (empty stages left out)."""
    from searchgym.app.bench.headroom import FIGURE_KEYS

    lines = [
        f"{figures['questions']} questions of split {figures['split']!r}, greedy EM {figures['greedy_em']:.3f}, "
        f"K={figures['samples']} samples per temperature ({figures['wall_s']:.0f} s)"
    ]
    for key, block in figures["by_temperature"].items():
        rows = [{"group": "all", **block}]
        rows += [{"group": f"kind:{kind}", **fig} for kind, fig in block["by_kind"].items()]
        rows += [
            {"group": f"stage:{stage}", **fig} for stage, fig in block["by_stage"].items() if fig["questions"]
        ]
        lines += ["", f"temperature {key}", format_table(rows, ("group", *FIGURE_KEYS))]
    return "\n".join(lines)
