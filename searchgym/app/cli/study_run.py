"""``searchgym study run PROTOCOL.toml``: play a study's missing runs, resuming killed ones."""

from __future__ import annotations

import argparse
from pathlib import Path

from searchgym.app.cli._common import positive_int

COMMAND = ("study", "run")
HELP = (
    "play the missing runs of a study protocol (train grpo subprocesses, one thread each, --jobs at a time): "
    "a summarised run is never played again, a killed one resumes from its checkpoint; one summary JSON "
    "per run as it lands"
)


def add_study_arguments(parser: argparse.ArgumentParser) -> None:
    """The protocol and the folders every ``study`` command reads (the protocol's own by default)."""
    parser.add_argument("protocol", type=Path, help="the study's TOML file (docs/study.md)")
    parser.add_argument(
        "--runs", type=Path, default=None, help="run folders ARM/sSEED (default: the protocol's [study] runs)"
    )
    parser.add_argument(
        "--summaries",
        type=Path,
        default=None,
        help="summary JSON files (default: the protocol's [study] summaries)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_study_arguments(parser)
    parser.add_argument("--jobs", type=positive_int, default=1, help="runs at a time (each on one thread)")
    parser.add_argument(
        "--only",
        action="append",
        default=None,
        metavar="ARM[/sSEED]",
        help="play only these runs (repeatable), e.g. --only grpo or --only grpo/s1",
    )


def run(args: argparse.Namespace) -> int:
    from searchgym.app.study.protocol import load_protocol
    from searchgym.app.study.runner import run_study

    protocol = load_protocol(args.protocol)
    failed = run_study(
        protocol,
        jobs=args.jobs,
        runs=args.runs,
        summaries=args.summaries,
        only=args.only,
        say=lambda line: print(line, flush=True),
    )
    return 1 if failed else 0
