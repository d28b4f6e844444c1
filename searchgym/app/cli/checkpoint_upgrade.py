"""``searchgym checkpoint upgrade OLD NEW``: a v1 checkpoint you trust, converted to the safe format."""

from __future__ import annotations

import argparse

COMMAND = ("checkpoint", "upgrade")
HELP = (
    "convert a v1 checkpoint YOU TRUST (it is unpickled, which can run code) to the current format, which "
    "loads without unpickling"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("old", help="the v1 checkpoint.pt")
    parser.add_argument("new", help="where to write the converted checkpoint (may be OLD)")


def run(args: argparse.Namespace) -> int:
    from searchgym.agents.training.checkpoint import upgrade_checkpoint

    print(f"wrote {upgrade_checkpoint(args.old, args.new)}")
    return 0
