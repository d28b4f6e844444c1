"""``searchgym bench all``: rollouts vs generate, updates, evaluation, env, retrieval, memory in one table."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

COMMAND = ("bench", "all")
HELP = "run every speed benchmark and print one table with the ratios measured in the same run"


def add_llm_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by the benchmarks that run the LLM policy."""
    parser.add_argument("--init", default=None, help="a trainer checkpoint to load (default: the tiny model)")
    parser.add_argument(
        "--model",
        default=None,
        help="a Hugging Face model folder or name instead, or config:FILE|qwen2-0.5b (that architecture, random weights)",
    )
    parser.add_argument("--device", default="cpu", help="torch device")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")


def set_threads(args: argparse.Namespace) -> None:
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_llm_arguments(parser)
    parser.add_argument("--quick", action="store_true", help="small batches, one run each (< 2 min, 2 cores)")
    parser.add_argument(
        "--repeats", type=int, default=None, help="runs per figure (default 3; 1 with --quick)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


ROWS = [
    ("rollout tokens/s (cached turns, inverse-CDF sampler)", "rollout_tokens_per_s", "{:.0f}"),
    ("rollout tokens/s before (re-read turns, multinomial)", "rollout_tokens_per_s_before", "{:.0f}"),
    ("rollout tokens/s, equal contexts extended one by one", "rollout_tokens_per_s_unshared", "{:.0f}"),
    ("rollout speed-up from reading equal contexts once", "rollout_speedup_shared", "{:.2f}"),
    ("generate tokens/s (same model, batch, new tokens)", "generate_tokens_per_s", "{:.0f}"),
    ("rollout / generate (target >= 0.9)", "rollout_vs_generate", "{:.2f}"),
    ("rollout / generate before", "rollout_vs_generate_before", "{:.2f}"),
    ("rollout log-prob gap, cached vs re-read", "rollout_logp_mismatch", "{:.1e}"),
    ("update policy tokens/s (today's defaults)", "update_tokens_per_s", "{:.0f}"),
    ("update policy tokens/s before (reference path)", "update_tokens_per_s_before", "{:.0f}"),
    ("update policy tokens/s, pi_old re-scored (--rescore-pi-old)", "update_tokens_per_s_rescored", "{:.0f}"),
    ("update speed-up (target >= 1.5)", "update_speedup", "{:.2f}"),
    ("update speed-up, pi_old re-scored", "update_speedup_rescored", "{:.2f}"),
    (
        "update policy tokens/s with the displacement diagnostics",
        "update_tokens_per_s_with_diagnostics",
        "{:.0f}",
    ),
    ("update speed-up with the displacement diagnostics", "update_speedup_with_diagnostics", "{:.2f}"),
    ("pi_old gap, sampler vs first update's forward", "update_logp_mismatch", "{:.1e}"),
    ("padding share of update slots", "padding_share", "{:.3f}"),
    ("padding share before", "padding_share_before", "{:.3f}"),
    ("GRPO step: rollout s", "step_rollout_s", "{:.2f}"),
    ("GRPO step: update s", "step_update_s", "{:.2f}"),
    ("GRPO step: diagnostics s", "step_diagnostics_s", "{:.2f}"),
    ("oracle episodes/s, generated world", "eval_episodes_per_s_world", "{:.0f}"),
    ("oracle episodes/s, HotpotQA", "eval_episodes_per_s_hotpotqa", "{:.0f}"),
    ("HotpotQA / world (target >= 0.8)", "hotpotqa_vs_world", "{:.2f}"),
    ("oracle episodes/s, world, same questions again", "eval_episodes_per_s_world_repeat", "{:.0f}"),
    ("oracle episodes/s, HotpotQA, same questions again", "eval_episodes_per_s_hotpotqa_repeat", "{:.0f}"),
    ("HotpotQA / world, same questions again", "hotpotqa_vs_world_repeat", "{:.2f}"),
    ("env steps/s, generated world (oracle, first pass)", "eval_steps_per_s_world", "{:.0f}"),
    ("env steps/s, HotpotQA (oracle, first pass)", "eval_steps_per_s_hotpotqa", "{:.0f}"),
    ("HotpotQA / world per env step, first pass", "hotpotqa_vs_world_per_step", "{:.2f}"),
    ("BM25 query p50 ms", "retrieval_p50_ms", "{:.2f}"),
    ("BM25 batch of 64 ms", "retrieval_batch_ms", "{:.2f}"),
    ("peak memory MiB", "peak_memory_mb", "{:.0f}"),
]


def add_training_bench_arguments(parser: argparse.ArgumentParser, unit: str) -> None:
    """The options of ``bench rollout`` and ``bench update``: the model, repeats, batch shape, ``--json``."""
    add_llm_arguments(parser)
    parser.add_argument("--repeats", type=int, default=3, help=f"{unit} per path; medians")
    parser.add_argument("--questions", type=int, default=10, help="questions per rollout batch")
    parser.add_argument("--group-size", type=int, default=5, help="responses per question")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run_training_bench(args: argparse.Namespace, benchmark: Any, prefixes: tuple[str, ...]) -> int:
    """Runs ``benchmark`` (``run_rollout_benchmark`` or ``run_update_benchmark``) with the parsed options and
    prints its figures: JSON, or the table rows whose keys start with ``prefixes``."""
    set_threads(args)
    figures = benchmark(
        repeats=args.repeats,
        questions=args.questions,
        group_size=args.group_size,
        init=args.init,
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        log=lambda line: print(line, file=sys.stderr),
    )
    report(figures, args.json, [r for r in ROWS if r[1].startswith(prefixes)])
    return 0


def report(figures: dict[str, Any], as_json: bool, rows: list[tuple[str, str, str]]) -> None:
    """Prints ``figures`` as one JSON object, or as the table of ``rows`` (:func:`print_figures`)."""
    if as_json:
        print(json.dumps(figures))
    else:
        print_figures(figures, rows)


def print_figures(figures: dict[str, Any], rows: list[tuple[str, str, str]]) -> None:
    """A two-column table of the figures present (markdown, so it pastes into the docs)."""
    print("| figure | value |\n| --- | ---: |")
    for label, key, fmt in rows:
        if figures.get(key) is not None:
            print(f"| {label} | {fmt.format(figures[key])} |")
    for size, us in (figures.get("env_us_per_step") or {}).items():
        print(f"| env µs per step, {size} sub-env{'s' if size != '1' else ''} | {us:.2f} |")


def run(args: argparse.Namespace) -> int:
    from searchgym.app.bench.suite import run_all

    set_threads(args)
    figures = run_all(
        quick=args.quick,
        repeats=args.repeats,
        device=args.device,
        init=args.init,
        model=args.model,
        dtype=args.dtype,
        log=lambda line: print(line, file=sys.stderr),
    )
    if args.json:
        print(json.dumps(figures))
        return 0
    print_figures(figures, ROWS)
    machine = figures["machine"]
    print(
        f"\n{machine['cpus']} CPUs ({machine['torch_threads']} torch threads), {machine['device']}, torch "
        f"{machine['torch']}; medians of {figures['rollout_repeats']} runs; {figures['seconds']:.0f} s"
    )
    return 0
