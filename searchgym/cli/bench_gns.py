"""``searchgym bench gns``: the gradient noise scale of GRPO at a checkpoint, in groups per update."""

from __future__ import annotations

import argparse
import json
import sys

COMMAND = ("bench", "gns")
HELP = "measure GRPO's gradient noise scale at a checkpoint: how many groups an update needs"

_KEYS = (
    "groups",
    "rollouts",
    "mean_reward",
    "informative_frac",
    "grad_sq",
    "trace_cov",
    "noise_scale_groups",
    "noise_scale_rollouts",
    "minibatch_groups",
    "snr_minibatch",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # The GRPO options (model, env, group size, temperature, reward, advantage, mini-batch) are train grpo's.
    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.cli._options import add_config_arguments

    add_config_arguments(parser, GRPOConfig)
    parser.add_argument("--groups", type=int, default=64, help="groups sampled, one gradient each")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.bench.gns import run_gns_benchmark
    from searchgym.cli._options import config_from_args

    config = config_from_args(GRPOConfig, args, probe_size=0, onpolicy_probe_size=0, ledger_size=0)
    if config.threads:
        import torch

        torch.set_num_threads(config.threads)
    figures = run_gns_benchmark(config, args.groups, log=lambda line: print(line, file=sys.stderr))
    if args.json:
        print(json.dumps(figures))
        return 0
    for key in _KEYS:
        value = figures[key]
        print(f"{key:22s} {value:.6g}" if isinstance(value, float) else f"{key:22s} {value}")
    print(figures["recommendation"])
    return 0
