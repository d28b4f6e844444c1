"""``searchgym doctor``: check the installation, one line per check; exit 1 when a required check fails."""

from __future__ import annotations

import argparse

COMMAND = ("doctor",)
HELP = (
    "check the installation: Python and package versions, torch and its devices, optional extras, the env "
    "and BM25, and (when given) a retrieval server, a model and a tokenizer; exit 1 if a required check fails"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--retriever",
        default=None,
        metavar="URL",
        help="also check that the /retrieve server at URL answers one search in the retrieval protocol "
        "(default: skipped)",
    )
    parser.add_argument(
        "--model",
        default=None,
        metavar="NAME_OR_PATH",
        help="also load this model offline (on the CPU) and check it has a logit for every token id "
        "(default: skipped)",
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        metavar="NAME_OR_PATH",
        help="also load this tokenizer offline and check the protocol's tags in it (default: --model's)",
    )
    parser.add_argument("--json", action="store_true", help="print the checks as one JSON object")


def run(args: argparse.Namespace) -> int:
    from searchgym.app.doctor.checks import exit_code, format_check, report_json, run_checks

    checks = run_checks(retriever=args.retriever, model=args.model, tokenizer=args.tokenizer)
    print(report_json(checks) if args.json else "\n".join(format_check(c) for c in checks))
    return exit_code(checks)
