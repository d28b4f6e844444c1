"""Every fenced ``python`` and ``bash`` block of README.md and docs/ works as written.

* Python blocks run in a fresh interpreter in a temporary folder.
* Bash blocks: every ``searchgym ...`` command line must parse with the real CLI parser (so a renamed
  command or option fails at once), and then runs. The command lines of one document run in order in one
  scratch folder (a later command may read what an earlier one wrote, as a reader following the page
  would); ``../shared`` is reachable from it when it exists here. ``make demo`` is run as what it runs,
  ``searchgym demo``. Long commands get a small budget: :data:`BUDGETS` appends options to them (argparse
  keeps the last value), in the test, never in the docs. After each command, every ``--out`` and
  ``--run-dir`` it names must exist.
* Not run, each reported as skipped with its reason: blocks preceded by ``<!-- snippet: skip REASON -->``
  (a GPU, a network, hours), commands asking for ``--device cuda``, ``searchgym serve`` (it runs until
  stopped; tests/test_server_cli.py starts one), and lines that are not ``searchgym`` commands (``source``,
  ``pip``, scripts). Lines holding shell variables or braces are templates and are left out.
* A python block whose first line is a comment naming a ``.py`` path (``# mypkg/agent.py``) is a file the
  docs ask the reader to create: it is written there in every scratch folder before the commands run.
* :func:`test_readme_first_hour` follows the README's quickstart and "what next" literally in a copy of the
  repository: ``make demo`` (small budget through ``DEMO_ARGS``), then each next command with
  ``.venv/bin`` first on ``PATH``, checking exit status and output files. By default ``.venv`` is the
  virtualenv running the tests; ``pytest -m install`` builds a fresh one with the Makefile.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from searchgym.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SEARCHGYM_SHARED_DATA", ROOT.parent / "shared" / "data")).parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^\s*```\s*(\w*)\s*$")
SKIP = re.compile(r"^\s*<!--\s*snippet:\s*skip\s+(?P<reason>.+?)\s*-->\s*$")
FILE_COMMENT = re.compile(r"^#\s*(?P<path>[\w./-]+\.py)\s*$")
COMMAND_PREFIXES = ("searchgym ", ".venv/bin/searchgym ")
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")
PYTHON_TIMEOUT_S = 120
COMMAND_TIMEOUT_S = 900  # a hang guard, not a speed check: the machine may be busy
BIN = Path(sys.executable).parent

#: Small-budget options appended to long commands (by command path). argparse keeps an option's last
#: value, so these override the documented ones; what runs is the documented command, only shorter.
TINY_DEMO = "--extra-worlds 0 --demos-per-world 40 --grpo-steps 1 --questions-per-step 1 --eval-questions 2 --layers 1"
BUDGETS: dict[tuple[str, ...], list[str]] = {
    tuple(command.split()): options.split()
    for command, options in {
        "demo": TINY_DEMO + " --no-progress",
        "eval": "--episodes 8 --no-progress",
        "demos": "--episodes 16",
        "train sft": "--demo-episodes 24 --epochs 1 --eval-questions 0 --tiny-layers 1",
        "train grpo": "--steps 1 --questions-per-step 1 --group-size 2 --eval-questions 0 --probe-size 0",
        "train trl": "--steps 1 --questions-per-step 1 --group-size 2 --eval-questions 0",
        "train sb3": "--timesteps 64 --eval-episodes 1",
        "export-trajectories": "--episodes 4 --group-size 2",
        "bench all": "--quick --repeats 1",
        "bench env": "--steps 200 --repeats 1",
        "bench rollout": "--repeats 1 --questions 1 --group-size 2",
        "bench retrieval": "--sizes 2000 --repeats 1 --queries 16 --batch 8 --reference-queries 4",
    }.items()
}
#: Commands never run here, with the reason shown as the skip.
NOT_RUN: dict[tuple[str, ...], str] = {
    ("serve",): "`searchgym serve` runs until stopped (tests/test_server_cli.py starts and stops one)",
}


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


def shell_lines(block: Snippet) -> list[Snippet]:
    """Every command line of a bash block (backslash continuations joined, blanks and comments dropped)."""
    lines: list[Snippet] = []
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
        if line and not line.startswith("#"):
            lines.append(Snippet(block.path, start, line, block.skip))
    return lines


def command_lines(block: Snippet) -> list[Snippet]:
    """The ``searchgym`` command lines of a bash block (templates with ``$`` or braces left out)."""
    return [
        line
        for line in shell_lines(block)
        if line.code.startswith(COMMAND_PREFIXES) and not any(c in line.code for c in "${")
    ]


def collect() -> tuple[list[Snippet], list[Snippet]]:
    """Every python block, and every searchgym command line of every bash block."""
    python: list[Snippet] = []
    commands: list[Snippet] = []
    for document in DOCUMENTS:
        for language, block in fenced_blocks(document):
            if language == "python":
                python.append(block)
            elif language in SHELL_LANGUAGES:
                commands.extend(command_lines(block))
    return python, commands


PYTHON_SNIPPETS, COMMANDS = collect()
DOCUMENTED_FILES = {
    match["path"]: snippet.code + "\n"
    for snippet in PYTHON_SNIPPETS
    if (match := FILE_COMMENT.match(snippet.code.splitlines()[0] if snippet.code else ""))
}


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


def test_the_documents_hold_snippets_of_both_kinds() -> None:
    """Guards the extraction itself: an empty parametrisation would pass silently."""
    assert len(PYTHON_SNIPPETS) >= 5 and len(COMMANDS) >= 20
    assert "mypkg/always_search.py" in DOCUMENTED_FILES


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


def _clean_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1", **extra}


@pytest.mark.slow
@pytest.mark.parametrize("snippet", PYTHON_SNIPPETS, ids=[s.id for s in PYTHON_SNIPPETS])
def test_documented_python_runs(snippet: Snippet, tmp_path: Path) -> None:
    if snippet.skip is not None:
        pytest.skip(snippet.skip)
    script = tmp_path / "snippet.py"
    script.write_text(snippet.code + "\n", encoding="utf-8")
    try:
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=_clean_env(),
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


# --- running the documented commands --------------------------------------------------------------


def command_path(words: list[str]) -> tuple[str, ...]:
    """The sub-command path of ``searchgym`` argv words, e.g. ``("train", "grpo")``."""
    path: list[str] = []
    for word in words:
        if word.startswith("-"):
            break
        path.append(word)
    # Trailing positionals (export's paths) are not part of the command: keep the longest known prefix.
    known = {*BUDGETS, *NOT_RUN}
    for n in range(len(path), 0, -1):
        if tuple(path[:n]) in known:
            return tuple(path[:n])
    return tuple(path[:2])


def why_not_run(snippet: Snippet, words: list[str]) -> str | None:
    """The reason a documented command is not run here, or ``None`` when it runs."""
    if snippet.skip is not None:
        return snippet.skip
    for path, reason in NOT_RUN.items():
        if tuple(words[: len(path)]) == path:
            return reason
    if "--device" in words and words[words.index("--device") + 1].startswith("cuda"):
        return "asks for --device cuda (a GPU machine with a CUDA torch)"
    if any("../shared" in w for w in words) and not (SHARED / "data").is_dir():
        return f"reads ../shared, absent here ({SHARED})"
    return None


def written_paths(words: list[str]) -> list[str]:
    """The ``--out`` and ``--run-dir`` values of a command: what it promises to write."""
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("--out", "--run-dir")]


def scratch_folder(base: Path) -> Path:
    """A working folder with ``../shared`` beside it, holding the files the docs ask readers to create."""
    work = base / "work"
    work.mkdir(parents=True)
    if SHARED.is_dir():
        (base / "shared").symlink_to(SHARED, target_is_directory=True)
    for relative, text in DOCUMENTED_FILES.items():
        (work / relative).parent.mkdir(parents=True, exist_ok=True)
        (work / relative).write_text(text, encoding="utf-8")
    return work


def run_command(words: list[str], cwd: Path, where: str, env: dict[str, str] | None = None) -> str:
    """Runs one ``searchgym`` command line (argv without the program); fails the test on a non-zero exit."""
    try:
        done = subprocess.run(
            [str(BIN / "searchgym"), *words],
            cwd=cwd,
            env=env or _clean_env(),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{where}: `searchgym {shlex.join(words)}` ran past {COMMAND_TIMEOUT_S} s", pytrace=False)
    if done.returncode != 0:
        pytest.fail(
            f"{where}: `searchgym {shlex.join(words)}` exited {done.returncode}\n--- stderr ---\n"
            f"{done.stderr[-4000:]}",
            pytrace=False,
        )
    return done.stdout


@pytest.fixture(scope="module")
def prerequisites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Files some pages use without making them (a warm-start checkpoint, a Hugging Face folder).

    Built once, with small budgets, by the same commands the docs give for them.
    """
    work = scratch_folder(tmp_path_factory.mktemp("prerequisites"))
    run_command(["train", "sft", "--run-dir", "runs/sft", *BUDGETS[("train", "sft")]], work, "prerequisite")
    run_command(["export", "runs/sft/checkpoint.pt", "hf_folder"], work, "prerequisite")
    return {"runs/sft/checkpoint.pt": work / "runs/sft/checkpoint.pt", "hf_folder": work / "hf_folder"}


def provide(words: list[str], work: Path, prerequisites: dict[str, Path]) -> None:
    """Copies in the prerequisites a command names that no earlier command of its page wrote."""
    for word in words:
        name = word.rstrip("/")
        if name in prerequisites and not (work / name).exists():
            source = prerequisites[name]
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, work / name)
            else:
                shutil.copy2(source, work / name)


def shell_sessions() -> dict[str, list[Snippet]]:
    """Per document, its bash lines in order: ``searchgym`` commands and ``make demo``."""
    sessions: dict[str, list[Snippet]] = {}
    for document in DOCUMENTS:
        lines = [
            line
            for language, block in fenced_blocks(document)
            if language in SHELL_LANGUAGES
            for line in shell_lines(block)
            if line.code.startswith((*COMMAND_PREFIXES, "make demo"))
            and not any(c in line.code for c in "${")
        ]
        if lines:
            sessions[document.relative_to(ROOT).as_posix()] = lines
    return sessions


SESSIONS = shell_sessions()


@pytest.mark.slow
@pytest.mark.parametrize("document", list(SESSIONS))
def test_documented_commands_run(
    document: str,
    tmp_path: Path,
    prerequisites: dict[str, Path],
) -> None:
    work = scratch_folder(tmp_path)
    ran, skipped = [], []
    for snippet in SESSIONS[document]:
        words = shlex.split(snippet.code, comments=True)
        words = ["demo"] if words[:2] == ["make", "demo"] else words[1:]
        reason = why_not_run(snippet, words)
        if reason is not None:
            skipped.append(f"{snippet.id}: {reason}")
            continue
        provide(words, work, prerequisites)
        run_command([*words, *BUDGETS.get(command_path(words), [])], work, snippet.id)
        missing = [p for p in written_paths(words) if not (work / p).exists()]
        assert not missing, f"{snippet.id}: `{snippet.code}` exited 0 but did not write {missing}"
        ran.append(snippet.id)
    if not ran:
        pytest.skip("; ".join(skipped))
    if skipped:
        print(f"{document}: not run: " + "; ".join(skipped))


def subparser(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> argparse.ArgumentParser:
    """The parser of a sub-command path, e.g. ``("train", "grpo")``."""
    for name in path:
        choices = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        assert name in choices, f"no command {path}"
        parser = choices[name]
    return parser


def test_every_budget_names_real_options(parser: argparse.ArgumentParser) -> None:
    """A renamed command or budget option would silently run the documented (long) command."""
    for path, options in BUDGETS.items():
        known = subparser(parser, path)._option_string_actions
        unknown = [o for o in options if o.startswith("--") and o not in known]
        assert not unknown, f"searchgym {' '.join(path)} has no options {unknown}"


# --- the first hour: README's quickstart and "what next", literally, in a copy of the repository ----------


def readme_first_hour() -> list[Snippet]:
    """``make demo`` from the quickstart block, then every line of the block that activates ``.venv``."""
    blocks = [b for language, b in fenced_blocks(ROOT / "README.md") if language in SHELL_LANGUAGES]
    quickstart = next(b for b in blocks if any(line.code.startswith("make demo") for line in shell_lines(b)))
    after = next(b for b in blocks if b.code.lstrip().startswith("source .venv/bin/activate"))
    return [
        *(line for line in shell_lines(quickstart) if line.code.startswith("make demo")),
        *shell_lines(after),
    ]


def test_the_first_hour_is_found() -> None:
    steps = [s.code.split("#")[0].split() for s in readme_first_hour()]
    assert steps[0][:2] == ["make", "demo"] and steps[1] == ["source", ".venv/bin/activate"]
    assert len(steps) >= 4 and all(words[0] == "searchgym" for words in steps[2:])


def copy_repository(destination: Path) -> Path:
    """The working tree's files (tracked or not ignored), without virtualenvs or run outputs."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout ({listed.stderr.strip()}): cannot tell source files from outputs")
    for name in filter(None, listed.stdout.split("\0")):
        if (ROOT / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)
    return destination


def _first_hour(tmp_path: Path, fresh_venv: bool) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    repo = copy_repository(tmp_path / "searchgym")
    if SHARED.is_dir():
        (tmp_path / "shared").symlink_to(SHARED, target_is_directory=True)
    make = ["make", f"DEMO_ARGS={TINY_DEMO}"]
    if not fresh_venv:  # reuse the virtualenv running these tests: link it, and tell make not to refresh it
        (repo / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
        make += ["-o", ".venv/.installed-stamp"]
    timeout = 3600 if fresh_venv else COMMAND_TIMEOUT_S
    outputs: list[str] = []
    for step in readme_first_hour():
        words = shlex.split(step.code, comments=True)
        if words[:1] == ["source"]:
            continue  # each later line runs in bash after `source .venv/bin/activate`
        if words[:2] == ["make", "demo"]:
            line = shlex.join([*make, *words[1:]])
        else:
            line = "source .venv/bin/activate && " + shlex.join([*words, *BUDGETS.get(tuple(words[1:2]), [])])
        done = subprocess.run(
            ["bash", "-c", line], cwd=repo, env=_clean_env(), capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode == 0, f"{step.id}: `{line}` exited {done.returncode}\n{done.stderr[-4000:]}"
        outputs.append(done.stdout)
    assert (repo / ".venv/bin/searchgym").is_file()
    # What the README promises each step leaves behind.
    for expected in ("runs/demo/curves.png", "runs/demo/again.png", "runs/demo/grpo_llds/checkpoint.pt"):
        assert (repo / expected).stat().st_size > 0, expected
    assert (repo / "runs/demo/hf/config.json").is_file()
    assert "checkpoint:runs/demo/grpo_llds/checkpoint.pt" in "".join(outputs)  # the eval table's row


@pytest.mark.slow
def test_readme_first_hour(tmp_path: Path) -> None:
    _first_hour(tmp_path, fresh_venv=False)


@pytest.mark.install
def test_readme_first_hour_from_a_fresh_virtualenv(tmp_path: Path) -> None:
    """The same with the Makefile building ``.venv`` from scratch (pip install; minutes)."""
    _first_hour(tmp_path, fresh_venv=True)
