"""``searchgym demos``: write oracle demonstrations (token-level transcripts) to JSONL."""

from __future__ import annotations

import argparse
import sys

from searchgym.cli._common import add_env_arguments, make_env, positive_int, repeats_note

COMMAND = ("demos",)
HELP = "write token-level oracle demonstrations to JSONL (for supervised warm-start)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_env_arguments(parser)
    parser.set_defaults(split="train")
    parser.add_argument(
        "--episodes", type=positive_int, default=None, help="demonstrations (default: one per question)"
    )
    parser.add_argument(
        "--out",
        required=True,
        help="output JSONL path (through OUT.partial, renamed when all are written: a failed run leaves OUT as it was)",
    )
    parser.add_argument("--seed", type=int, default=0, help="base seed")


def run(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from searchgym.agents.demonstrations import generate_demonstrations, write_demonstrations

    env = make_env(args)
    questions = len(env.unwrapped.questions)
    episodes = args.episodes or questions
    note = repeats_note(
        episodes, questions, args.split, "a repeated question's demonstration weighs more in SFT"
    )
    if note is not None:
        print(note, file=sys.stderr)
    demos = tqdm(generate_demonstrations(env, episodes, args.seed), total=episodes, desc="demos")
    n = write_demonstrations(demos, args.out)
    print(f"wrote {n} demonstrations to {args.out}")
    return 0
