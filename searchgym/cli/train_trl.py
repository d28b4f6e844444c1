"""``searchgym train trl``: GRPO (+LLDS) on SearchQA with TRL's GRPOTrainer (extra ``searchgym[trl]``)."""

from __future__ import annotations

import argparse
import json

COMMAND = ("train", "trl")
HELP = "train a policy with TRL's GRPOTrainer on SearchQA episodes (+LLDS: --llds action|response|token)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # The options are the fields of TRLConfig: the help is written once, in the dataclass.
    from searchgym.agents.grpo.config import add_config_arguments
    from searchgym.agents.integrations.config import TRLConfig

    add_config_arguments(parser, TRLConfig)


def run(args: argparse.Namespace) -> int:
    from searchgym.agents.grpo.config import config_from_args
    from searchgym.agents.integrations.config import TRLConfig

    config = config_from_args(TRLConfig, args)
    from searchgym.agents.integrations.trl import train_trl  # needs the trl extra

    metrics = train_trl(config)
    keep = ("eval/", "reward", "rollout/", "train/llds", "lld/")
    print(json.dumps({"run_dir": config.run_dir, **{k: v for k, v in metrics.items() if k.startswith(keep)}}))
    return 0
