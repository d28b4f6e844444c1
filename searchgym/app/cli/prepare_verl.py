"""``searchgym prepare verl``: the parquet files verl's trainer reads, from any searchgym dataset."""

from __future__ import annotations

import argparse
import json
import sys

from searchgym.app.cli._common import add_env_arguments, run_env_defaults

COMMAND = ("prepare", "verl")
HELP = "write OUT/{split}.parquet for verl's RLHFDataset: one row per question, played by the searchgym agent loop"


VERL_CONTEXT_TOKENS = 4096
"""The transcript size prepare verl writes unless told: room for a real model's turns (keep it <= verl's
``data.max_prompt_length + data.max_response_length``)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="folder to write (one SPLIT.parquet per split)")
    parser.add_argument(
        "--split", action="append", default=None, help="split to write; repeat for several (default: train)"
    )
    parser.add_argument("--limit", type=int, default=None, help="keep the first N questions of each split")
    add_env_arguments(
        parser,
        run_env_defaults(max_context_tokens=VERL_CONTEXT_TOKENS),
        env_id=False,
        tokenizer=False,
        title="environment (every row carries it; verl's workers build the env from it)",
        skip=("split",),
    )
    parser.add_argument(
        "--no-plugin-check",
        dest="plugin_check",
        action="store_false",
        help="do not import the searchgym verl plugin after writing (it shows the error verl would hide)",
    )


def run(args: argparse.Namespace) -> int:
    from searchgym.agents.integrations.verl_data import write_verl_parquet
    from searchgym.envs import EnvSpec

    # Every setting checked here, not first in verl's workers (--split names the files: set per file).
    spec = EnvSpec(**{name: getattr(args, name) for name in EnvSpec.field_names() if name != "split"})
    written = write_verl_parquet(args.out, spec, args.split or ["train"], limit=args.limit)
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
