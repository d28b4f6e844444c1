"""``searchgym export-trajectories``: episodes as the rows TRL and verl consume (JSONL)."""

from __future__ import annotations

import argparse

from searchgym.cli._common import add_retriever_patience, add_transcript_arguments, env_kwargs, positive_int
from searchgym.cli._manifest import write_run_manifest

COMMAND = ("export-trajectories",)
HELP = (
    "play episodes with a policy and write token ids, loss masks, log-probs and rewards (TRL or verl fields)"
)


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
    parser.add_argument("--dataset", default=None, help="FlashRAG folder (default: the generated world)")
    parser.add_argument("--world-seed", type=int, default=0, help="seed of the generated world")
    parser.add_argument("--split", default="train", help="dataset split")
    parser.add_argument("--tokenizer", default=None, help="tokenizer (default: the policy's, else built-in)")
    parser.add_argument("--retriever", default="bm25", help="retriever backend name or URL")
    add_retriever_patience(parser)
    parser.add_argument("--topk", type=int, default=3, help="passages per search")
    parser.add_argument("--max-turns", type=int, default=4, help="turn budget per episode")
    parser.add_argument("--max-turn-tokens", type=int, default=48, help="token cap per turn")
    parser.add_argument("--max-context-tokens", type=int, default=1024, help="context size")
    add_transcript_arguments(parser, "Search-R1's base prompt or a chat turn (the tokenizer's chat template)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the question draw and of sampling")


def run(args: argparse.Namespace) -> int:
    from searchgym.agents.integrations.export import export_trajectories

    env = {
        **env_kwargs(args),
        "max_obs_tokens": args.max_obs_tokens,
        "reward": args.reward,
        "prompt_style": args.prompt_style,
    }
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
        env_kwargs=env,
    )
    config = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    write_run_manifest(
        args.out, "export-trajectories", env, folder=False, seeds={"seed": args.seed}, config=config
    )
    print(f"wrote {n} episodes to {args.out} ({args.format} fields)")
    return 0
