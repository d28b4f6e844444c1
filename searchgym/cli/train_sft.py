"""``searchgym train sft``: supervised warm-start on oracle demonstrations (policy tokens only)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any, TypeVar

COMMAND = ("train", "sft")
HELP = "warm-start a policy on oracle demonstrations (generated from the training split unless --demos)"

C = TypeVar("C")


def add_overwrite_argument(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    """``--overwrite``, unless the config dataclass already declares it as a field (then it is generated)."""
    if "overwrite" not in {f.name for f in dataclasses.fields(cls)}:
        parser.add_argument(
            "--overwrite",
            action=argparse.BooleanOptionalAction,
            default=False,
            help="replace the run RUN_DIR already holds (checkpoint, metrics, TensorBoard events)",
        )


def apply_overwrite(config: C, args: argparse.Namespace) -> C:
    """Carries ``--overwrite`` onto a config that has no such field yet (read with ``getattr``)."""
    if not hasattr(config, "overwrite"):
        config.overwrite = bool(getattr(args, "overwrite", False))  # type: ignore[attr-defined]
    return config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from searchgym.agents.grpo.config import SFTConfig, add_config_arguments

    add_config_arguments(parser, SFTConfig)
    add_overwrite_argument(parser, SFTConfig)


def run(args: argparse.Namespace) -> int:
    from searchgym.agents.grpo.config import SFTConfig, config_from_args
    from searchgym.agents.grpo.sft import train_sft

    config = apply_overwrite(config_from_args(SFTConfig, args), args)
    metrics = train_sft(config)
    print(json.dumps({"run_dir": config.run_dir, "checkpoint": f"{config.run_dir}/checkpoint.pt", **metrics}))
    return 0
