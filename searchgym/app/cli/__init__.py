"""The ``searchgym`` command line.

Each command is a module in this package that defines ``COMMAND`` (its path, e.g. ``("bench", "env")``),
``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``. Modules are discovered, so adding a command
is adding a file. Modules import heavy dependencies inside ``run`` so that ``searchgym --help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence
from types import ModuleType

from searchgym.app.cli._usage import Parser, UsageError, explained, friendly_errors
from searchgym.errors import RetrieverError, SearchGymError

__all__ = ["build_parser", "main"]


def _command_modules() -> list[ModuleType]:
    modules = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "COMMAND"):
            modules.append(module)
    return modules


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to an option's help unless the help already says what its default is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or action.required:  # a required option has no default to show
            return text
        return super()._get_help_string(action) or text


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with one sub-parser per discovered command."""
    parser = Parser(prog="searchgym", description="Search-and-answer RL environments and agents.")
    groups: dict[tuple[str, ...], argparse._SubParsersAction[Parser]] = {
        (): parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    }
    parents: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for module in _command_modules():
        path: tuple[str, ...] = tuple(module.COMMAND)
        for depth in range(1, len(path)):  # intermediate groups such as "bench" or "train"
            prefix = path[:depth]
            if prefix not in groups:
                group = groups[prefix[:-1]].add_parser(prefix[-1], help=f"{prefix[-1]} commands")
                parents[prefix] = group
                groups[prefix] = group.add_subparsers(dest="_".join(prefix), metavar="COMMAND", required=True)
        sub = groups[path[:-1]].add_parser(
            path[-1],
            help=module.HELP,
            description=module.HELP,
            formatter_class=_DefaultsFormatter,
        )
        module.add_arguments(sub)
        sub.set_defaults(_run=module.run, _command=path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``searchgym`` console script."""
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        with friendly_errors():
            args = parser.parse_args(words)
    except UsageError as e:  # one line saying what was wrong, then the command's usage; exit 2, as argparse
        print("\n".join(explained(e, parser, words)), file=sys.stderr)
        raise SystemExit(2) from None
    try:
        return int(args._run(args) or 0)
    except SearchGymError as e:
        print(f"searchgym: error: {e}", file=sys.stderr)
        if isinstance(e, RetrieverError):  # a training run that lost its retriever: what it saved
            from searchgym.app.cli._common import saved_and_resume

            saved = saved_and_resume(args)
            if saved:
                print(f"searchgym: {saved}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line (what was saved, how to continue), not a traceback
        from searchgym.app.cli._common import interrupted_message

        print(f"\n{interrupted_message(args)}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
