"""``searchgym eval``: evaluate an agent on an environment and print EM, F1, searches and more."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from searchgym.agents.evaluate import EvalSummary
from searchgym.cli._common import (
    AGENT_FORMS,
    add_env_arguments,
    env_kwargs,
    format_table,
    load_agent,
    make_env,
    positive_int,
    repeats_note,
)

COMMAND = ("eval",)
HELP = (
    "evaluate an agent (random, oracle, heuristic, checkpoint:PATH, sb3:PATH, package.module:Class) on an env"
)

COLUMNS = ["agent", *EvalSummary.metric_names(), "questions"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_env_arguments(parser)
    parser.add_argument("--agent", required=True, help=AGENT_FORMS)
    parser.add_argument(
        "--episodes",
        type=positive_int,
        default=100,
        help="episodes; episode i plays question i of the split (more episodes than questions play each "
        "question again, with another seed, and the note and the 'questions' column say so)",
    )
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
    """The turn and context sizes a ``checkpoint:PATH`` agent was trained with, for those not given.

    A model trained on 48-token turns plays an env with 512-token turns very slowly (an untrained or drifted
    policy fills every turn) and out of distribution, so the trainer's own sizes are the natural default. A
    checkpoint file records them in its config; a Hugging Face folder from ``searchgym export`` in its note.
    """
    if not args.agent.startswith("checkpoint:"):
        return {}
    path = args.agent[len("checkpoint:") :]
    names = [n for n in ("max_turn_tokens", "max_context_tokens") if getattr(args, n, None) is None]
    from searchgym.agents.grpo.export import checkpoint_env_sizes, export_env_sizes

    if os.path.isdir(path):
        sizes = export_env_sizes(path)
    elif os.path.isfile(path):
        sizes = checkpoint_env_sizes(path)  # the weights stay unread: load_agent loads and checks them once
    else:
        return {}  # a missing file errors in load_agent
    return {n: v for n, v in sizes.items() if n in names}


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
    questions = min(args.episodes, len(env.unwrapped.questions))  # distinct questions played
    note = repeats_note(
        args.episodes, len(env.unwrapped.questions), args.split, "the figures average over episodes"
    )
    if note is not None:
        print(note, file=sys.stderr)
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
    metrics = {**summary.metrics(), "questions": questions}
    if args.json:
        print(json.dumps(metrics))
    else:  # the faults column only when faults were injected
        columns = [c for c in COLUMNS if c != "retrieval_faults" or metrics.get(c) is not None]
        print(format_table([{"agent": args.agent, **metrics}], columns))
    return 0
