"""The flag surface of the training and evaluation commands, pinned: every flag of ``searchgym train
grpo|sft|trl|sb3`` and ``searchgym eval`` with its default, choices and help, against ``flag_surface.json``.

A refactor that changes a default, a choice or a help line behind the options' backs fails here. A change
meant to be seen is written into the file on purpose, and shows in review as a diff of it:

    .venv/bin/python tests/app/cli/test_flag_surface.py --write
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

SURFACE = Path(__file__).with_name("flag_surface.json")
COMMANDS = (("train", "grpo"), ("train", "sft"), ("train", "trl"), ("train", "sb3"), ("eval",))


def _subparser(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> argparse.ArgumentParser:
    for word in words:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[word]
    return parser


def flag_surface() -> dict[str, dict[str, dict[str, Any]]]:
    """``{command: {flags: {default, choices, help}}}`` as the CLI's parser declares them."""
    from searchgym.app.cli import build_parser

    root = build_parser()
    surface: dict[str, dict[str, dict[str, Any]]] = {}
    for words in COMMANDS:
        flags = {}
        for action in _subparser(root, words)._actions:
            if action.option_strings:
                flags[" ".join(action.option_strings)] = {
                    "default": repr(action.default),
                    "choices": None if action.choices is None else [repr(c) for c in action.choices],
                    "help": action.help,
                }
        surface[" ".join(words)] = flags
    return surface


def test_the_flags_defaults_choices_and_help_are_the_pinned_ones() -> None:
    pinned = json.loads(SURFACE.read_text(encoding="utf-8"))
    live = flag_surface()
    assert sorted(live) == sorted(pinned)
    for command, flags in pinned.items():
        assert sorted(live[command]) == sorted(flags), f"{command}: flags added or removed"
        for flag, pinned_values in flags.items():
            assert live[command][flag] == pinned_values, f"{command} {flag}"
    assert sum(len(flags) for flags in live.values()) > 250  # every command's flags, not a parser's stub


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    SURFACE.write_text(json.dumps(flag_surface(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {SURFACE}")
