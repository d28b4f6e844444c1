"""``searchgym prepare verl``: the parquet files verl's trainer reads, from any searchgym dataset."""

from __future__ import annotations

import argparse
import json
import sys

from searchgym.cli._common import add_env_arguments, run_env_defaults

COMMAND = ("prepare", "verl")
HELP = "write OUT/{split}.parquet for verl's RLHFDataset: one row per question, played by the searchgym agent loop"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="folder to write (one SPLIT.parquet per split)")
    parser.add_argument("--dataset", default=None, help="FlashRAG folder (default: the generated world)")
    parser.add_argument("--world-seed", type=int, default=0, help="seed of the generated world")
    parser.add_argument(
        "--split", action="append", default=None, help="split to write; repeat for several (default: train)"
    )
    parser.add_argument("--limit", type=int, default=None, help="keep the first N questions of each split")
    parser.add_argument(
        "--retriever",
        default="bm25",
        help="retriever the workers use: a backend name (built in each worker) or a /retrieve server URL",
    )
    add_env_arguments(
        parser,
        run_env_defaults(),
        env_id=False,
        tokenizer=False,
        title="retrieval",
        only=("retriever_patience",),
    )
    parser.add_argument("--topk", type=int, default=3, help="passages per search")
    parser.add_argument(
        "--max-turns", type=int, default=4, help="turn budget per episode (answer turn included)"
    )
    parser.add_argument("--max-turn-tokens", type=int, default=512, help="token cap per turn")
    parser.add_argument(
        "--max-context-tokens",
        type=int,
        default=4096,
        help="transcript size; keep it <= verl's data.max_prompt_length + data.max_response_length",
    )
    add_env_arguments(
        parser,
        env_id=False,
        tokenizer=False,
        title="transcript",
        only=("max_obs_tokens", "reward", "prompt_style"),
    )
    parser.add_argument(
        "--no-plugin-check",
        dest="plugin_check",
        action="store_false",
        help="do not import the searchgym verl plugin after writing (it shows the error verl would hide)",
    )


def run(args: argparse.Namespace) -> int:
    from searchgym.agents.integrations.verl_data import write_verl_parquet

    env_kwargs = {
        "dataset": args.dataset,
        "world_seed": args.world_seed,
        "retriever": args.retriever,
        "retriever_patience": args.retriever_patience,
        "topk": args.topk,
        "max_turns": args.max_turns,
        "max_turn_tokens": args.max_turn_tokens,
        "max_context_tokens": args.max_context_tokens,
        "max_obs_tokens": args.max_obs_tokens,
        "reward": args.reward,
        "prompt_style": args.prompt_style,
    }
    written = write_verl_parquet(args.out, env_kwargs, args.split or ["train"], limit=args.limit)
    print(json.dumps({split: str(path) for split, path in written.items()}))
    if args.plugin_check:
        from searchgym.agents.integrations.verl_data import check_verl_plugin

        problem = check_verl_plugin()
        if problem is not None:
            print(
                "searchgym prepare verl: the data is written, but the searchgym plugin does not load where "
                "verl is installed, so verl's workers would only report 'Agent loop searchgym not "
                f"registered'. The real error:\n{problem}",
                file=sys.stderr,
            )
            return 1
    return 0
