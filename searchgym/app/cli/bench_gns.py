"""``searchgym bench gns``: the gradient noise scale of GRPO at a checkpoint, in groups per update."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

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


NO_SIGNAL = (
    "no reward signal: every one of the {groups} groups got one reward for all its responses (mean_reward "
    "{mean_reward:.3g}, informative_frac 0), so every advantage is 0 and the gradient measured is the entropy "
    "bonus's alone, not learning signal: its noise scale and SNR say nothing about GRPO's batch. Measure at a "
    "checkpoint whose samples sometimes succeed (a warm-start: train sft), or with more --groups"
)
"""The recommendation when no group has a reward signal."""


def no_reward_signal(figures: dict[str, Any]) -> bool:
    """Whether no group carried a reward signal: each group's rewards all equal, so each group-relative
    advantage is 0."""
    return bool(figures["informative_frac"] == 0)


@contextlib.contextmanager
def _ticking(show: bool) -> Iterator[Callable[[str], None]]:
    """A log for :func:`run_gns_benchmark` that prints its lines and, once the gradients start (its one
    line), keeps a timer running on stderr until they are done: the step is silent for tens of seconds."""
    from tqdm.auto import tqdm

    done = threading.Event()
    threads: list[threading.Thread] = []

    def tick(bar: Any) -> None:
        while not done.wait(0.5):
            bar.refresh()
        bar.close()

    def log(line: str) -> None:
        print(line, file=sys.stderr)
        if show and not threads:
            bar = tqdm(desc="gradients", bar_format="{desc}: {elapsed} elapsed", file=sys.stderr)
            threads.append(threading.Thread(target=tick, args=(bar,), daemon=True))
            threads[0].start()

    try:
        yield log
    finally:
        done.set()
        for thread in threads:
            thread.join()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # The GRPO options (model, env, group size, temperature, reward, advantage, mini-batch) are train grpo's.
    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.app.cli._options import add_config_arguments

    add_config_arguments(parser, GRPOConfig)
    parser.add_argument("--groups", type=int, default=64, help="groups sampled, one gradient each")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.app.bench.gns import run_gns_benchmark
    from searchgym.app.cli._options import config_from_args

    config = config_from_args(GRPOConfig, args, probe_size=0, onpolicy_probe_size=0, ledger_size=0)
    if config.run.threads:
        import torch

        torch.set_num_threads(config.run.threads)
    with _ticking(config.run.progress) as log:
        figures = run_gns_benchmark(config, args.groups, log=log)
    if no_reward_signal(figures):
        figures["recommendation"] = NO_SIGNAL.format(**figures)
    if args.json:
        print(json.dumps(figures))
        return 0
    for key in _KEYS:
        value = figures[key]
        print(f"{key:22s} {value:.6g}" if isinstance(value, float) else f"{key:22s} {value}")
    print(figures["recommendation"])
    return 0
