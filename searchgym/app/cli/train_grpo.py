"""``searchgym train grpo``: GRPO, with or without the LLDS regulariser, on a SearchQA environment."""

from __future__ import annotations

import argparse
import json

from searchgym.app.cli._manifest import write_config_manifest
from searchgym.app.cli._splits import check_splits

COMMAND = ("train", "grpo")
HELP = "train a policy with GRPO (+LLDS: --llds action|response|token, or none for vanilla GRPO)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # The options are the fields of GRPOConfig: the help is written once, in the dataclass.
    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.app.cli._options import add_config_arguments

    add_config_arguments(parser, GRPOConfig)


def run(args: argparse.Namespace) -> int:
    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.agents.grpo.trainer import train_grpo
    from searchgym.app.cli._options import config_from_args

    config = config_from_args(GRPOConfig, args)
    check_splits(config)
    metrics = train_grpo(config)
    write_config_manifest(config, "train grpo")
    final = {k: v for k, v in metrics.items() if k.startswith(("eval/", "rollout/reward", "rollout/em"))}
    print(json.dumps({"run_dir": config.run.run_dir, **final}))
    return 0
