"""``searchgym train trl``: GRPO (+LLDS) on SearchQA with TRL's GRPOTrainer (extra ``searchgym[trl]``)."""

from __future__ import annotations

import argparse
import json
import os

from searchgym.app.cli._manifest import write_config_manifest
from searchgym.app.cli._splits import check_splits

COMMAND = ("train", "trl")
HELP = "train a policy with TRL's GRPOTrainer on SearchQA episodes (+LLDS: --llds action|response|token)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # The options are the fields of TRLConfig: the help is written once, in the dataclass.
    from searchgym.agents.integrations.config import TRLConfig
    from searchgym.app.cli._options import add_config_arguments

    add_config_arguments(parser, TRLConfig)
    parser.add_argument(
        "--trl-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="trl_arg",
        help="a field of TRL's GRPOConfig that no option above sets (value read as JSON, else as text), "
        "e.g. --trl-arg gradient_checkpointing=true --trl-arg deepspeed=ds_zero3.json; repeatable",
    )


def run(args: argparse.Namespace) -> int:
    from searchgym.agents.integrations.config import TRLConfig, parse_trl_args
    from searchgym.app.cli._options import config_from_args

    config = config_from_args(TRLConfig, args)
    check_splits(config)
    overrides = parse_trl_args(args.trl_arg)
    from searchgym.agents.integrations.trl_train import end_processes, train_trl  # needs the trl extra

    metrics = train_trl(config, **overrides)
    if int(os.environ.get("RANK", "0")) == 0:  # one manifest and summary under torchrun / accelerate launch
        write_config_manifest(config, "train trl")
        keep = ("eval/", "reward", "rollout/", "train/llds", "lld/")
        summary = {k: v for k, v in metrics.items() if k.startswith(keep)}
        print(json.dumps({"run_dir": config.run.run_dir, **summary}))
    end_processes()
    return 0
