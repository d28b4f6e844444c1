"""``searchgym bench step``: a GRPO step's time, phase by phase, and a second configuration compared in one run."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from searchgym.agents.grpo.config import GRPOConfig

COMMAND = ("bench", "step")
HELP = (
    "time GRPO steps phase by phase (rollout: generation, retrieval, env; pi_old, forward, backward, optimizer, "
    "displacement, probes, ledger, evaluation) and steps per hour; --compare OPTIONS times a second "
    "configuration in the same run, alternating, and prints per-phase ratios. The defaults are the learning "
    "study's regime (scripts/learn_experiment.sh): 48 questions x 5, mini-batches of 120, probes every 5 "
    "steps, 500 evaluation questions every 50, one thread"
)

REGIME: dict[str, Any] = {
    "questions_per_step": 48,
    "group_size": 5,
    "minibatch_size": 120,
    "temperature": 1.0,
    "advantage": "group",
    "reward": "em",
    "llds": "none",
    "kl_coef": 0.0,
    "entropy_coef": 0.0,
    "weight_decay": 0.0,
    "lr": 1e-4,
    "warmup_steps": 0,
    "lr_schedule": "constant",
    "probe_size": 64,
    "onpolicy_probe_size": 64,
    "probe_every": 5,
    "ledger_size": 0,
    "eval_split": "test",
    "eval_questions": 500,
    "eval_batch": 100,
    "eval_every": 50,
    "threads": 1,
}
"""The learning study's options (docs/experiments/learn.md), this command's defaults."""

LABELS = {
    "rollout": "rollout",
    "generation": "  generation",
    "retrieval": "  retrieval",
    "env": "  env",
    "greedy": "greedy baseline",
    "update": "update",
    "pi_old": "  pi_old",
    "reference": "  reference",
    "forward": "  forward",
    "backward": "  backward",
    "optimizer": "  optimizer",
    "ledger_llds": "  ledger-LLDS",
    "displacement": "  displacement",
    "update_other": "  rest",
    "probes": "probes",
    "ledger": "ledger",
    "evaluation": "evaluation",
    "step": "step of the regime",
}
"""The report's rows: each phase of :data:`searchgym.app.bench.step.PHASES`, and the totals."""


class _OptionsParser(argparse.ArgumentParser):
    """The parser of ``--compare``'s options: a bad option is one error naming ``--compare``."""

    def error(self, message: str) -> Any:
        from searchgym.errors import ConfigError

        raise ConfigError(f"--compare: {message}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.app.cli._options import add_config_arguments

    add_config_arguments(parser, GRPOConfig)
    parser.set_defaults(**REGIME)
    bench = parser.add_argument_group("benchmark")
    bench.add_argument("--repeats", type=int, default=3, help="timed steps per configuration; medians")
    bench.add_argument(
        "--compare",
        default=None,
        metavar="OPTIONS",
        help="train grpo options of a second configuration, over this one's (e.g. \"--precision "
        'bf16-autocast"); both run in this process, taking turns (default: none)',
    )
    bench.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="one untimed step per configuration",
    )
    bench.add_argument(
        "--base-rollout",
        choices=("shared", "unshared"),
        default="shared",
        help="unshared: the base configuration's rollout extends every context for itself, as rollouts did "
        "before equal contexts were read once (a step-for-step baseline of that earlier path; the "
        "transcripts are the same) (default: shared)",
    )
    bench.add_argument("--json", action="store_true", help="print one JSON object")


def compare_config(args: argparse.Namespace, options: str) -> Any:
    """The ``GRPOConfig`` of ``--compare OPTIONS``: the parsed command line with ``OPTIONS`` over it."""
    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.app.cli._options import add_config_arguments, config_from_args
    from searchgym.errors import ConfigError

    parser = _OptionsParser(prog="--compare", add_help=False)
    add_config_arguments(parser, GRPOConfig)
    try:
        words = shlex.split(options)
    except ValueError as e:
        raise ConfigError(f"--compare {options!r}: {e}") from None
    namespace = parser.parse_args(words, namespace=argparse.Namespace(**vars(args)))
    return config_from_args(GRPOConfig, namespace)


def run(args: argparse.Namespace) -> int:
    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.app.bench.step import run_step_benchmark
    from searchgym.app.cli._options import config_from_args

    config = config_from_args(GRPOConfig, args)
    other = compare_config(args, args.compare) if args.compare is not None else None
    if config.run.threads:
        import torch

        torch.set_num_threads(config.run.threads)
    figures = run_step_benchmark(
        config,
        other,
        repeats=args.repeats,
        warmup=args.warmup,
        unshared_base=args.base_rollout == "unshared",
        log=lambda line: print(line, file=sys.stderr),
    )
    if args.json:
        print(json.dumps(figures))
        return 0
    print(format_report(figures, config, args.compare))
    return 0


def format_report(figures: dict[str, Any], config: GRPOConfig, compare: str | None) -> str:
    """The report: one row per phase that took time (median seconds; with ``--compare``, the ratio), then
    steps per hour, the rollout metrics that precision moves, and the update's FLOP rate."""
    base = figures["base"]
    other = figures.get("other")
    lines = [
        f"{config.batch.questions_per_step} questions x {config.batch.group_size}, {config.batch.updates_per_step} updates a step, "
        f"probes every {config.probes.probe_every}, {config.eval.questions} evaluation questions every "
        f"{config.eval.every or config.batch.steps} steps; median of {len(base['repeats'])} repetitions (s)",
    ]
    header = f"{'phase':22s}{'base':>9s}"
    if other is not None:
        header += f"{'compare':>9s}{'ratio':>8s}   compare: {compare}"
    lines.append(header)
    for phase, label in LABELS.items():
        if base["phases"].get(phase, 0.0) == 0.0 and (
            other is None or other["phases"].get(phase, 0.0) == 0.0
        ):
            continue
        if phase in ("probes", "evaluation"):
            every = (
                config.probes.probe_every if phase == "probes" else config.eval.every or config.batch.steps
            )
            label = f"{label} (1/{every})"
        lines.append(_row(label, base, other, figures, phase))
    hours = f"{'steps per hour':22s}{base['steps_per_hour']:9.0f}"
    if other is not None:
        hours += f"{other['steps_per_hour']:9.0f}{other['steps_per_hour'] / base['steps_per_hour']:8.2f}"
    lines.append(hours)
    for label, arm in (("base", base), ("compare", other)):
        if arm is None:
            continue
        m = arm["metrics"]
        line = (
            f"{label}: {arm['precision']}; setup {arm['setup_s']:.1f} s; clip fraction {m['train/clip_frac']:.4f}; "
            f"pi_old gap {m['rollout/logp_mismatch']:.2e}; reward {m['rollout/reward']:.3f}"
        )
        if "update_gflops" in m:
            line += (
                f"; update {m['update_gflop']:.1f} GFLOP at {m['update_gflops']:.1f} GFLOP/s = "
                f"{m['update_gflops'] / m['peak_gflops']:.0%} of a 1024^3 matmul's {m['peak_gflops']:.1f}"
            )
        lines.append(line)
    if "logp_gap" in figures:
        gap = figures["logp_gap"]
        lines.append(
            f"|log pi(base) - log pi(compare)| on the same {gap['logp_gap_tokens']} policy tokens: "
            f"max {gap['logp_gap_max']:.2e}, mean {gap['logp_gap_mean']:.2e}"
        )
    return "\n".join(lines)


def _row(
    label: str, base: dict[str, Any], other: dict[str, Any] | None, figures: dict[str, Any], phase: str
) -> str:
    """One table row: the phase's median seconds and, compared, the median of its paired ratios."""
    row = f"{label:22s}{base['phases'][phase]:9.3f}"
    if other is None:
        return row
    ratio = figures["compare"][phase]["ratio"]
    shown = f"{ratio:8.2f}" if math.isfinite(ratio) else f"{'-':>8s}"
    return row + f"{other['phases'][phase]:9.3f}" + shown
