"""Usage errors of the command line as one line that says what was wrong (with a "did you mean" for a
misspelt option or command), followed by the usage of the command it belongs to — not argparse's top-level
usage block, nor "--agent is required" for an ``--agnet`` that was given."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import re
from collections.abc import Iterator, Sequence

__all__ = ["Parser", "UsageError", "explained", "friendly_errors"]

_friendly = False


class UsageError(SystemExit):
    """A usage error raised (inside :func:`friendly_errors`) instead of argparse's print-and-exit."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(2)
        self.parser = parser
        self.message = message


class Parser(argparse.ArgumentParser):
    """The parser of ``searchgym`` and of each of its commands (sub-parsers take their parent's class)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if _friendly:
            raise UsageError(self, message)
        super().error(message)


@contextlib.contextmanager
def friendly_errors() -> Iterator[None]:
    """Usage errors raise :class:`UsageError` (for :func:`explained`) while the block runs."""
    global _friendly
    before, _friendly = _friendly, True
    try:
        yield
    finally:
        _friendly = before


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _command_parser(root: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The deepest command parser ``argv`` names (``searchgym train grpo …`` → ``train grpo``'s)."""
    parser = root
    for word in argv:
        if word.startswith("-"):
            break
        choices = _subparsers(parser)
        if word not in choices:
            break
        parser = choices[word]
    return parser


def _unknown_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """The ``--options`` of ``argv`` that ``parser`` neither knows nor takes as an unambiguous prefix."""
    known = [o for o in parser._option_string_actions if o.startswith("--")]
    unknown = []
    for word in argv:
        if word == "--":
            break
        if not word.startswith("--"):
            continue
        name = word.split("=", 1)[0]
        if name in known or len([o for o in known if o.startswith(name)]) == 1:
            continue
        unknown.append(name)
    return unknown


def _short_usage(parser: argparse.ArgumentParser) -> str:
    """``usage: PROG REQUIRED… POSITIONALS… [options]`` (or ``PROG COMMAND`` and the commands) and where
    the rest is."""
    words = [parser.prog]
    choices = _subparsers(parser)
    if choices:
        words.append(f"COMMAND ({', '.join(choices)})")
    else:
        for action in parser._actions:
            if not action.option_strings:
                metavar = action.metavar or action.dest.upper()
                words.append(f"{metavar}..." if action.nargs in ("+", "*") else str(metavar))
            elif action.required:
                words.append(f"{action.option_strings[0]} {action.metavar or action.dest.upper()}")
        words.append("[options]")
    return f"usage: {' '.join(words)}; `{parser.prog} --help` says more"


def explained(error: UsageError, root: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """The lines that report ``error``: what was wrong (a misspelt option or command named, with the
    closest valid one), then the usage of the command ``argv`` names."""
    parser = _command_parser(root, argv)
    message = error.message
    choices = list(_subparsers(parser))
    unknown = [] if choices else _unknown_options(parser, argv)  # a wrong command is the first thing to say
    command = parser.prog.removeprefix("searchgym").strip()
    where = f"{command}: " if command else ""
    if unknown:
        known = [
            option
            for option, action in parser._option_string_actions.items()
            if option.startswith("--") and action.help != argparse.SUPPRESS
        ]
        parts = []
        for name in unknown:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            parts.append(f"{name}" + (f" (did you mean {close[0]}?)" if close else ""))
        message = f"{where}unrecognized option{'s' if len(parts) > 1 else ''} {', '.join(parts)}"
    elif choices and (choice := re.search(r"invalid choice: '([^']*)'", message)):
        close = difflib.get_close_matches(choice[1], choices, n=1, cutoff=0.6)
        message = f"{where}no command {choice[1]!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
    return [f"searchgym: error: {message}", _short_usage(parser)]
