"""Every number and figure of the pre-registered LLD experiments (docs/experiments/lld.md, lld2.md).

Usage:
    python scripts/lld_report.py lld RUNS_DIR [--plots DIR]        # the first experiment, from its run folders
    python scripts/lld_report.py gate CHECKPOINT [--questions N] [--out FILE]   # LLD-2's warm-start gate
    python scripts/lld_report.py summarize RUNS_DIR --out DIR [--only ARM/sSEED] # LLD-2: one JSON per run
    python scripts/lld_report.py lld2 SUMMARIES_DIR [--plots DIR]  # LLD-2's tables, verdict and figures
    python scripts/lld_report.py learn-summarize RUNS_DIR --out DIR [--only ARM/sSEED]  # the learning study
    python scripts/lld_report.py learn SUMMARIES_DIR [--plots DIR] # its tables, criteria L1-L3 and figure

LLD-2's run folders are not kept: ``summarize`` writes a small JSON per finished run (its per-step curves
included), committed as each run lands, and ``lld2`` recomputes every table, criterion and figure from those
files alone, through the pre-registered rules of :mod:`searchgym.agents.grpo.diagnostics`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from searchgym.app.study.experiments import learn as learn_report
from searchgym.app.study.experiments import learn2 as learn2_report
from searchgym.app.study.experiments import lld3 as lld3_report
from searchgym.app.study.experiments.lld import cmd_gate, cmd_lld, cmd_lld2, cmd_summarize, commit_of_head


def cmd_learn_summarize(args: argparse.Namespace) -> None:
    learn_report.summarize(args.runs_dir, args.out, args.only, commit_of_head())


def _print_report(module: Any, what: str, args: argparse.Namespace) -> None:
    """A study's report (``module.report``) of the summaries under ``args.summaries``; none is an error."""
    if not learn_report.load(args.summaries):
        raise SystemExit(f"no {what} summaries under {args.summaries}")
    print(module.report(args.summaries, args.plots))


def cmd_learn(args: argparse.Namespace) -> None:
    _print_report(learn_report, "learning-study", args)


def cmd_lld3_summarize(args: argparse.Namespace) -> None:
    lld3_report.summarize(args.runs_dir, args.out, args.only, commit_of_head())


def cmd_lld3(args: argparse.Namespace) -> None:
    _print_report(lld3_report, "LLD-3", args)


def cmd_learn2_summarize(args: argparse.Namespace) -> None:
    learn2_report.summarize(args.runs_dir, args.out, args.only, commit_of_head())


def cmd_learn2(args: argparse.Namespace) -> None:
    _print_report(learn2_report, "LEARN-2", args)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("lld", help="the first experiment's tables, verdict and plots, from its run folders")
    p.add_argument("runs_dir", type=Path)
    p.add_argument("--plots", type=Path, default=None)
    p.set_defaults(func=cmd_lld)
    p = sub.add_parser("gate", help="LLD-2's warm-start gate of a checkpoint")
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--split", default="validation", help="question split (the gate's: validation)")
    p.add_argument("--questions", type=int, default=500)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    p.set_defaults(func=cmd_gate)
    p = sub.add_parser("learn-summarize", help="one small JSON per finished run of the learning study")
    p.add_argument("runs_dir", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--only", nargs="*", default=None, help="ARM/sSEED of the runs to summarize")
    p.set_defaults(func=cmd_learn_summarize)
    p = sub.add_parser(
        "learn", help="the learning study's tables, criteria L1-L3 and figure, from the summaries"
    )
    p.add_argument("summaries", type=Path)
    p.add_argument("--plots", type=Path, default=None)
    p.set_defaults(func=cmd_learn)
    p = sub.add_parser("lld3-summarize", help="one small JSON per finished LLD-3 run")
    p.add_argument("runs_dir", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--only", nargs="*", default=None, help="ARM/sSEED of the runs to summarize")
    p.set_defaults(func=cmd_lld3_summarize)
    p = sub.add_parser("lld3", help="LLD-3's tables, criteria C1-C4 and figure, from the summaries")
    p.add_argument("summaries", type=Path)
    p.add_argument("--plots", type=Path, default=None)
    p.set_defaults(func=cmd_lld3)
    p = sub.add_parser("learn2-summarize", help="one small JSON per finished run of LEARN-2")
    p.add_argument("runs_dir", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--only", nargs="*", default=None, help="ARM/sSEED of the runs to summarize")
    p.set_defaults(func=cmd_learn2_summarize)
    p = sub.add_parser("learn2", help="LEARN-2's tables and criteria G1-G3, from the summaries")
    p.add_argument("summaries", type=Path)
    p.add_argument("--plots", type=Path, default=None)
    p.set_defaults(func=cmd_learn2)
    p = sub.add_parser("summarize", help="one small JSON per finished LLD-2 run")
    p.add_argument("runs_dir", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--only", nargs="*", default=None, help="ARM/sSEED runs to summarize (default: all)")
    p.set_defaults(func=cmd_summarize)
    p = sub.add_parser("lld2", help="LLD-2's tables, verdict and figure, from the summaries")
    p.add_argument("summaries", type=Path)
    p.add_argument("--plots", type=Path, default=None)
    p.set_defaults(func=cmd_lld2)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
