"""``searchgym export-trajectories``: episodes as the rows TRL and verl consume (JSONL)."""

from __future__ import annotations

import argparse
from typing import Any

from searchgym.app.cli._common import add_env_arguments, env_spec_from_args, positive_int
from searchgym.app.cli._manifest import write_run_manifest

COMMAND = ("export-trajectories",)
HELP = (
    "play episodes with a policy and write token ids, loss masks, log-probs and rewards (TRL or verl fields)"
)


def _env_defaults() -> Any:
    """The episodes exported unless told otherwise: the trainers' sizes (:data:`~searchgym.envs.spec.TRAINING`),
    as the policy exported is usually a trained one."""
    from searchgym.envs.spec import TRAINING

    return TRAINING


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="JSONL file to write (one episode per line)")
    parser.add_argument("--format", choices=["trl", "verl"], default="trl", help="field names of the engine")
    parser.add_argument(
        "--policy", default=None, help="checkpoint.pt or Hugging Face folder (default: a fresh tiny model)"
    )
    parser.add_argument("--episodes", type=positive_int, default=64, help="episodes (questions x group size)")
    parser.add_argument(
        "--group-size", type=positive_int, default=1, help="episodes per question (GRPO groups)"
    )
    parser.add_argument("--batch", type=positive_int, default=32, help="episodes generated together")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    parser.add_argument(
        "--greedy", action="store_true", help="take the most likely token instead of sampling"
    )
    add_env_arguments(parser, _env_defaults(), env_id=False)
    parser.add_argument("--seed", type=int, default=0, help="seed of the question draw and of sampling")


def run(args: argparse.Namespace) -> int:
    from searchgym.agents.integrations.export import export_trajectories

    spec = env_spec_from_args(args)
    n = export_trajectories(
        args.out,
        fmt=args.format,
        policy=args.policy,
        episodes=args.episodes,
        group_size=args.group_size,
        batch=args.batch,
        temperature=args.temperature,
        greedy=args.greedy,
        seed=args.seed,
        spec=spec,
        tokenizer=getattr(args, "tokenizer", None),
    )
    config = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    write_run_manifest(
        args.out,
        "export-trajectories",
        {**spec.to_record(), "tokenizer": getattr(args, "tokenizer", None)},
        folder=False,
        seeds={"seed": args.seed},
        config=config,
    )
    print(f"wrote {n} episodes to {args.out} ({args.format} fields)")
    return 0
