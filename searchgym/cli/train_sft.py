"""``searchgym train sft``: supervised warm-start on oracle demonstrations (policy tokens only)."""

from __future__ import annotations

import argparse
import json

from searchgym.cli._manifest import write_config_manifest

COMMAND = ("train", "sft")
HELP = "warm-start a policy on oracle demonstrations (generated from the training split unless --demos)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from searchgym.agents.training.config import SFTConfig
    from searchgym.cli._options import add_config_arguments

    add_config_arguments(parser, SFTConfig)


def run(args: argparse.Namespace) -> int:
    from searchgym.agents.sft import train_sft
    from searchgym.agents.training.config import SFTConfig
    from searchgym.cli._options import config_from_args

    config = config_from_args(SFTConfig, args)
    metrics = train_sft(config)
    write_config_manifest(config, "train sft")
    print(json.dumps({"run_dir": config.run_dir, "checkpoint": f"{config.run_dir}/checkpoint.pt", **metrics}))
    return 0
