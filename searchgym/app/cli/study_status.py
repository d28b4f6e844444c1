"""``searchgym study status PROTOCOL.toml``: what ran, what is running or partial, what is left."""

from __future__ import annotations

import argparse

from searchgym.app.cli.study_run import add_study_arguments

COMMAND = ("study", "status")
HELP = "what a study has run, what is running or partial, and what is left"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_study_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from searchgym.app.study.protocol import load_protocol
    from searchgym.app.study.runner import status

    print(status(load_protocol(args.protocol), args.runs, args.summaries))
    return 0
