"""The command line, now :mod:`searchgym.app.cli`; this name stays importable for one release."""

from searchgym.app.cli import build_parser, main  # noqa: F401
