"""``searchgym study report PROTOCOL.toml``: a study's tables, signal leads, verdict and figure."""

from __future__ import annotations

import argparse
from pathlib import Path

from searchgym.app.cli.study_run import add_study_arguments

COMMAND = ("study", "report")
HELP = (
    "a study's report from its summaries: each definition per run, the onset and lead of every warning "
    "signal, the verdict per criterion, and the figure"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_study_arguments(parser)
    parser.add_argument(
        "--figure",
        type=Path,
        default=None,
        help="draw the figure into this PNG (default: the protocol's [report] figure, else none)",
    )
    parser.add_argument("--no-figure", action="store_true", help="draw no figure, whatever the protocol says")


def run(args: argparse.Namespace) -> int:
    from searchgym.app.study.protocol import load_protocol
    from searchgym.app.study.report import report

    protocol = load_protocol(args.protocol)
    figure = None if args.no_figure else args.figure or protocol.figure
    print(report(protocol, args.summaries, figure))
    return 0
