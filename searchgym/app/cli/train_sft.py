"""``searchgym train sft``: supervised warm-start on oracle demonstrations (policy tokens only)."""

from __future__ import annotations

import argparse
import json
import sys

from searchgym.app.cli._manifest import write_config_manifest
from searchgym.app.cli._splits import check_splits

COMMAND = ("train", "sft")
HELP = "warm-start a policy on oracle demonstrations (generated from the training split unless --demos)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from searchgym.agents.training.config import SFTConfig
    from searchgym.app.cli._options import add_config_arguments

    add_config_arguments(parser, SFTConfig)


def run(args: argparse.Namespace) -> int:
    from searchgym.agents.sft import train_sft
    from searchgym.agents.training.config import SFTConfig
    from searchgym.app.cli._options import config_from_args

    config = config_from_args(SFTConfig, args)
    check_splits(config)
    if config.sft.demos is None:
        print(
            f"note: training on {config.sft.demonstrator} demonstrations generated from split {config.env.split!r} "
            "(--demos FILE trains on a file written by `searchgym demos`)",
            file=sys.stderr,
        )
    metrics = train_sft(config)
    write_config_manifest(config, "train sft")
    print(
        json.dumps(
            {"run_dir": config.run.run_dir, "checkpoint": f"{config.run.run_dir}/checkpoint.pt", **metrics}
        )
    )
    return 0
