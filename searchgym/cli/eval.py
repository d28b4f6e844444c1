"""``searchgym eval``: evaluate an agent on an environment and print EM, F1, searches and more."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from searchgym.agents.evaluate import EvalSummary
from searchgym.cli._common import add_env_arguments, env_kwargs, format_table, load_agent, make_env

COMMAND = ("eval",)
HELP = "evaluate an agent (random, oracle, heuristic, or package.module:Class) on an environment"

COLUMNS = ["agent", *EvalSummary.metric_names()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_env_arguments(parser)
    parser.add_argument("--agent", required=True, help="random | oracle | heuristic | package.module:Class")
    parser.add_argument("--episodes", type=int, default=100, help="episodes (question i for episode i)")
    parser.add_argument("--seed", type=int, default=0, help="base seed")
    parser.add_argument(
        "--out",
        default=None,
        help="write transcripts to this JSONL file (through OUT.partial, renamed when the run completes: "
        "a failed run leaves OUT as it was)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--record-retrieval",
        default=None,
        metavar="PATH",
        help="record every search and its results to this cassette (replay it with --retriever cassette:PATH)",
    )
    parser.add_argument(
        "--retriever-faults",
        default=None,
        metavar="SPEC",
        help="inject seeded retriever faults, e.g. 'empty=0.1,shuffle=0.2,replace=0.1,replace_k=2,"
        "truncate=0.1,truncate_words=20,latency=0.05,latency_s=0.2,seed=0' (default: none)",
    )


def checkpoint_env_defaults(args: argparse.Namespace) -> dict[str, int]:
    """The turn and context sizes a ``checkpoint:FILE`` agent was trained with, for those not given.

    A model trained on 48-token turns plays an env with 512-token turns very slowly (an untrained or drifted
    policy fills every turn) and out of distribution, so the trainer's own sizes are the natural default.
    """
    if not args.agent.startswith("checkpoint:"):
        return {}
    path = args.agent[len("checkpoint:") :]
    if not os.path.isfile(path):
        return {}  # a Hugging Face folder carries no env settings; a missing file errors in load_agent
    import torch

    from searchgym.agents.grpo.checkpoint import check_config

    # Only the config is read here: the weights stay memory-mapped, untouched, and load_agent loads and checks
    # the file once. A file torch cannot read gets its clear CheckpointError there.
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return {}
    config = payload.get("config", {}) if isinstance(payload, dict) else {}
    check_config(config, payload.get("kind"), path)  # types and sizes, before the env is sized by them
    names = ("max_turn_tokens", "max_context_tokens")
    return {n: int(config[n]) for n in names if getattr(args, n, None) is None and n in config}


def run(args: argparse.Namespace) -> int:
    from searchgym.agents import evaluate
    from searchgym.cli._manifest import warn_on_data_mismatch, write_run_manifest
    from searchgym.data.jsonl import replace_on_success

    overrides: dict[str, Any] = dict(checkpoint_env_defaults(args))
    if args.retriever_faults is not None:
        overrides["retriever_faults"] = args.retriever_faults
    settings = {**env_kwargs(args), **overrides}
    warn_on_data_mismatch(args.agent, settings)
    if args.record_retrieval is not None:  # the cassette is written when the env releases it (env.close())
        overrides["retriever"] = f"cassette:{args.record_retrieval};record={args.retriever}"
    env = make_env(args, **overrides)
    agent = load_agent(args.agent, env, seed=args.seed)
    if args.out is None:
        summary = evaluate(env, agent, args.episodes, seed=args.seed, progress=not args.no_progress)
    else:
        # Episodes stream into OUT.partial (a crash keeps the finished ones there); OUT is replaced only
        # by a complete run, so a run that fails never destroys an earlier file.
        with replace_on_success(args.out) as partial:
            summary = evaluate(
                env, agent, args.episodes, seed=args.seed, out=partial, progress=not args.no_progress
            )
    env.close()
    if args.out is not None:
        config = {k: v for k, v in vars(args).items() if not k.startswith("_")}
        write_run_manifest(args.out, "eval", settings, folder=False, seeds={"seed": args.seed}, config=config)
    metrics = summary.metrics()
    if args.json:
        print(json.dumps(metrics))
    else:  # the faults column only when faults were injected
        columns = [c for c in COLUMNS if c != "retrieval_faults" or metrics.get(c) is not None]
        print(format_table([{"agent": args.agent, **metrics}], columns))
    return 0
