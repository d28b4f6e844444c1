"""Every fenced ``python`` and ``bash`` block of README.md and docs/ works as written.

Python blocks run in a fresh interpreter in a temporary folder. A block that truly needs a GPU, a network
or minutes is preceded by ``<!-- snippet: skip REASON -->`` and is reported as skipped with that reason.
Bash blocks are not run: each ``searchgym ...`` command line in them must parse with the real CLI parser,
so a renamed command or option fails here. Lines holding shell variables or braces are left out (they are
templates, not commands).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from searchgym.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^\s*```\s*(\w*)\s*$")
SKIP = re.compile(r"^\s*<!--\s*snippet:\s*skip\s+(?P<reason>.+?)\s*-->\s*$")
COMMAND_PREFIXES = ("searchgym ", ".venv/bin/searchgym ")
PYTHON_TIMEOUT_S = 120


@dataclass(frozen=True)
class Snippet:
    """One fenced block (or, for bash, one command line of it).

    Attributes:
        path: The Markdown file, relative to the repository root.
        line: 1-based line of the block's first code line (for a command, of the command).
        code: The block's text (for a command, the joined command line).
        skip: The reason given by a preceding ``<!-- snippet: skip REASON -->``, or ``None``.
    """

    path: str
    line: int
    code: str
    skip: str | None = None

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def fenced_blocks(path: Path) -> list[tuple[str, Snippet]]:
    """The ``(language, snippet)`` of every fenced block of a Markdown file, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    relative = path.relative_to(ROOT).as_posix()
    blocks: list[tuple[str, Snippet]] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not FENCE.match(lines[end]):
            end += 1
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = SKIP.match(previous)
        snippet = Snippet(relative, i + 2, "\n".join(lines[i + 1 : end]), marker and marker["reason"])
        blocks.append((opening[1].lower(), snippet))
        i = end + 1
    return blocks


def command_lines(block: Snippet) -> list[Snippet]:
    """The ``searchgym`` command lines of a bash block, backslash continuations joined."""
    commands: list[Snippet] = []
    pending: list[str] = []
    start = block.line
    for offset, raw in enumerate(block.code.splitlines()):
        if not pending:
            start = block.line + offset
        if raw.rstrip().endswith("\\"):
            pending.append(raw.rstrip()[:-1])
            continue
        line = " ".join([*pending, raw]).strip()
        pending = []
        if line.startswith(COMMAND_PREFIXES) and not any(c in line for c in "${"):
            commands.append(Snippet(block.path, start, line, block.skip))
    return commands


def collect() -> tuple[list[Snippet], list[Snippet]]:
    """Every python block, and every searchgym command line of every bash block."""
    python: list[Snippet] = []
    commands: list[Snippet] = []
    for document in DOCUMENTS:
        for language, block in fenced_blocks(document):
            if language == "python":
                python.append(block)
            elif language in ("bash", "sh", "shell", "console"):
                commands.extend(command_lines(block))
    return python, commands


PYTHON_SNIPPETS, COMMANDS = collect()


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


def test_the_documents_hold_snippets_of_both_kinds() -> None:
    """Guards the extraction itself: an empty parametrisation would pass silently."""
    assert len(PYTHON_SNIPPETS) >= 5 and len(COMMANDS) >= 20


@pytest.mark.parametrize("snippet", COMMANDS, ids=[c.id for c in COMMANDS])
def test_documented_command_parses(snippet: Snippet, parser: argparse.ArgumentParser) -> None:
    words = shlex.split(snippet.code, comments=True)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parser.parse_args(words[1:])
    except SystemExit as e:  # argparse reports a usage error by exiting
        pytest.fail(f"{snippet.id}: `{snippet.code}` does not parse:\n{stderr.getvalue()}", pytrace=False)
        raise AssertionError from e  # unreachable: keeps type checkers aware that the test ends here


@pytest.mark.slow
@pytest.mark.parametrize("snippet", PYTHON_SNIPPETS, ids=[s.id for s in PYTHON_SNIPPETS])
def test_documented_python_runs(snippet: Snippet, tmp_path: Path) -> None:
    if snippet.skip is not None:
        pytest.skip(snippet.skip)
    script = tmp_path / "snippet.py"
    script.write_text(snippet.code + "\n", encoding="utf-8")
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=PYTHON_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{snippet.id} ran past {PYTHON_TIMEOUT_S} s", pytrace=False)
    if done.returncode != 0:
        pytest.fail(
            f"{snippet.id} failed (exit {done.returncode}):\n{snippet.code}\n--- stderr ---\n{done.stderr[-4000:]}",
            pytrace=False,
        )
