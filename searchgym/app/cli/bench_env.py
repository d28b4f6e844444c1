"""``searchgym bench env``: per-token step overhead of SearchQA-v0."""

from __future__ import annotations

import argparse
import json

COMMAND = ("bench", "env")
HELP = (
    "measure the per-token step overhead of SearchQA-v0 (single env and vector env) and the cost of snapshots"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=1000, help="tokens per measured run (single env)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure; medians are reported")
    parser.add_argument("--num-envs", type=int, default=64, help="sub-envs of the vector env")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from searchgym.app.bench.env import run_env_benchmark

    figures = run_env_benchmark(steps=args.steps, repeats=args.repeats, num_envs=args.num_envs)
    if args.json:
        print(json.dumps(figures))
        return 0
    print(f"world generation            {figures['world_generation_s'] * 1000:8.1f} ms")
    print(
        f"step overhead, single env   {figures['step_overhead_us']:8.2f} us/token (goal <= {figures['goal_us']:.0f})"
    )
    print(
        f"step overhead, vector env   {figures['vector_step_overhead_us']:8.2f} us/token per sub-env "
        f"({figures['vector_num_envs']} sub-envs)"
    )
    print(
        f"scripted rollout            {figures['rollout_seconds'] * 1000:8.1f} ms, "
        f"{figures['rollout_env_share'] * 100:.1f}% of it in the env (incl. BM25)"
    )
    print(
        f"snapshot / restore          {figures['snapshot_us']:8.2f} / {figures['restore_us']:.2f} us "
        f"({figures['snapshot_tokens']:.0f}-token episode, goal <= {figures['goal_us']:.0f}); "
        f"fork {figures['fork_us_per_branch']:.2f} us per branch"
    )
    print(f"(medians of {figures['repeats']} runs)")
    return 0
