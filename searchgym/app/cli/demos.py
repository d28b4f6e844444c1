"""``searchgym demos``: write token-level demonstrations (the oracle's, or a mixture of teachers) to JSONL."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from searchgym.app.cli._common import (
    add_env_arguments,
    make_env,
    positive_int,
    repeats_note,
    run_env_defaults,
)

if TYPE_CHECKING:
    from searchgym.agents.demonstrations import Demonstration

COMMAND = ("demos",)
HELP = "write token-level demonstrations to JSONL (for supervised warm-start): the oracle's, or a mixture's"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_env_arguments(parser, run_env_defaults())
    parser.add_argument(
        "--episodes", type=positive_int, default=None, help="demonstrations (default: one per question)"
    )
    parser.add_argument(
        "--out",
        required=True,
        help="output JSONL path (through OUT.partial, renamed when all are written: a failed run leaves OUT as it was)",
    )
    parser.add_argument("--seed", type=int, default=0, help="base seed")
    parser.add_argument(
        "--demonstrator",
        default="oracle",
        help="who plays each episode: oracle, shortcut (answers a bridge question after its first hop; the "
        "oracle elsewhere), or a mixture drawn per episode, e.g. mix:oracle=0.1,shortcut=0.9",
    )


def run(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from searchgym.agents.demonstrations import (
        generate_demonstrations,
        parse_demonstrator,
        write_demonstrations,
    )

    parse_demonstrator(args.demonstrator)  # a bad value fails before the env is built
    env = make_env(args)
    questions = len(env.unwrapped.questions)
    episodes = args.episodes or questions
    note = repeats_note(
        episodes, questions, args.split, "a repeated question's demonstration weighs more in SFT"
    )
    if note is not None:
        print(note, file=sys.stderr)
    counts: Counter[tuple[str, bool]] = Counter()

    def counted() -> Iterator[Demonstration]:
        for demo in generate_demonstrations(env, episodes, args.seed, args.demonstrator):
            counts[demo.demonstrator, demo.reward > 0] += 1
            yield demo

    n = write_demonstrations(tqdm(counted(), total=episodes, desc="demos"), args.out)
    by_teacher = ", ".join(
        f"{name} {counts[name, True] + counts[name, False]} ({counts[name, True]} rewarded)"
        for name in sorted({name for name, _ in counts})
    )
    print(f"wrote {n} demonstrations to {args.out}: {by_teacher}")
    # train sft generates its own oracle demonstrations unless it is given a file.
    print(f"train on them with: searchgym train sft --demos {shlex.quote(args.out)} --run-dir RUN_DIR")
    return 0
