"""Every fenced block of README.md and docs/ either runs here or says, next to it, why it does not.

What runs:

* ``python`` blocks, each in a fresh interpreter in a temporary folder. A block whose first line is a
  comment naming a ``.py`` path (``# mypkg/agent.py``) is a file the docs ask the reader to create: it is
  also written there in every scratch folder before the commands run. A block that talks to a retrieval
  server on ``127.0.0.1:8000`` gets one (on a free port, its address put in the code).
* ``bash`` blocks, command by command (a line, backslash continuations joined, or a whole ``for`` loop;
  comments dropped), in ``bash``: the commands of one document in order in one scratch folder (a later one
  may read what an earlier one wrote, as a reader following the page would; ``../shared`` is reachable from
  it when it exists here). ``searchgym`` on ``PATH`` (and ``.venv/bin/searchgym``) is the real command
  with :data:`BUDGETS` appended, so loops and ``$VAR`` lines run as written too; ``python`` is the
  virtualenv's. A ``searchgym serve`` line is started, asked ``GET /health`` and stopped. Files a page uses
  without making them (a warm-start checkpoint, a Hugging Face folder, an SB3 model, a pre-v2 checkpoint)
  are made once by :func:`prerequisites`. After a command, every ``--out`` and ``--run-dir`` it names must
  exist. Every ``searchgym`` line without shell variables must also parse with the real CLI parser
  (:func:`test_documented_command_parses`, which runs nothing).
* README's ``make demo`` (of its two commands) and its "what next" block run literally, with ``make`` and
  ``source .venv/bin/activate``, in a copy of the repository: :func:`test_readme_first_hour`; the README
  itself reads as a first-hour guide, every term defined at first use or linked:
  :func:`test_readme_is_a_first_hour_guide`.

What does not run, and why, is visible in the Markdown next to the block:

* blocks tagged ``text``, ``json``, ``yaml`` or ``toml`` are data (printed output, formulas, synopses, a
  protocol), not commands;
* ``<!-- snippet: skip REASON -->`` above a block skips the block (a GPU, a network, hours);
  ``<!-- snippet: skip `PREFIX`: REASON -->`` skips the block's commands that start with ``PREFIX``.

:func:`test_every_block_runs_or_says_why` enumerates every block and command and fails on an untagged block,
an unknown tag, a marker that matches nothing, and an unmarked command that would need a GPU, the network or
change the environment (``pip``, ``make`` other than the first hour's ``make demo``, ``accelerate``,
``torchrun``, ``huggingface-cli``, ``cuda``), so no new command slips through unrun and unexplained.

Budgets, which keep this file to minutes of CPU: the documented commands run with :data:`BUDGETS` appended
(argparse keeps an option's last value), a loop over seeds with fewer seeds (:data:`SHELL_BUDGETS`), and
python blocks with :data:`PYTHON_BUDGETS` substituted. They only shrink sizes (episodes, steps, timesteps,
questions, probes, sequence lengths, repeats, seeds; :func:`test_budgets_only_shrink_sizes` compares the
options with their defaults), silence progress bars, and give ``serve`` a free port: what runs is the
documented command, only smaller, so the documented figures are not reproduced. The one results table a check can
hold to account cheaply is README's demo table: :func:`test_readme_demo_table_is_consistent` checks its
intervals, its summary sentence and the prose quoting it against the demo's own code, and the first-hour
run checks that the demo prints a table with the same columns and rows. Its figures themselves are not
reproduced here: the demo takes about a quarter of an hour at its size.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from searchgym.app.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SEARCHGYM_SHARED_DATA", ROOT.parent / "shared" / "data")).parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^\s*```\s*(\S*)\s*$")
SKIP = re.compile(r"^\s*<!--\s*snippet:\s*skip\s+(?:`(?P<prefix>[^`]+)`\s*:\s*)?(?P<reason>.+?)\s*-->\s*$")
FILE_COMMENT = re.compile(r"^#\s*(?P<path>[\w./-]+\.py)\s*$")
SEARCHGYM = ("searchgym", ".venv/bin/searchgym")
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")
DATA_LANGUAGES = ("text", "json", "yaml", "toml")
#: Programs an unmarked line may not start with (it would change the environment, reach the network, need
#: GPUs or run this test suite), with the reason the audit gives; a line naming ``cuda`` needs one too.
NEEDS_A_MARKER: dict[str, str] = {
    "pip": "installs packages",
    "make": "runs a Makefile target (only the first hour's `make demo` runs here)",
    "accelerate": "launches one process per GPU",
    "torchrun": "launches one process per GPU",
    "huggingface-cli": "downloads from the network",
}
PYTHON_TIMEOUT_S = 120
COMMAND_TIMEOUT_S = 900  # a hang guard, not a speed check: the machine may be busy
SERVER = "127.0.0.1:8000"  # the address python blocks use for a retrieval server
BIN = Path(sys.executable).parent

#: Small-budget options appended to long commands (by command path). argparse keeps an option's last
#: value, so these override the documented ones; what runs is the documented command, only shorter.
TINY_DEMO = (
    "--demos-per-world 12 --warmstart-layers 1 --warmstart-hidden 32 --warmstart-epochs 1 --warmstart-batch-size 4 "
    "--grpo-steps 1 --questions-per-step 2 --eval-questions 4 --headroom-questions 2 --headroom-samples 2"
)
BUDGETS: dict[tuple[str, ...], list[str]] = {
    tuple(command.split()): options.split()
    for command, options in {
        "demo": TINY_DEMO + " --no-progress",
        "eval": "--episodes 8 --no-progress",
        "benchmark": "--episodes 5 --no-progress",
        "demos": "--episodes 16",
        "train sft": "--demo-episodes 24 --epochs 1 --eval-questions 0 --tiny-layers 1",
        "train grpo": "--steps 1 --questions-per-step 1 --group-size 2 --eval-questions 0 --probe-size 0 "
        "--onpolicy-probe-size 0",
        "train trl": "--updates 1 --questions-per-step 1 --group-size 2 --eval-questions 0",
        "train sb3": "--steps 64 --eval-questions 1",
        "export-trajectories": "--episodes 4",
        "index dense": "--max-length 32 --no-progress",
        "serve": "--port 0",
        "bench all": "--quick --repeats 1",
        "bench env": "--steps 200 --repeats 1",
        "bench update": "--repeats 1 --questions 1 --group-size 2",
        "bench rollout": "--repeats 1 --questions 1 --group-size 2",
        "bench step": "--repeats 1 --no-warmup --questions-per-step 2 --group-size 2 --minibatch-size 4 "
        "--probe-size 0 --onpolicy-probe-size 0 --eval-questions 0 --threads 1",
        "bench gns": "--groups 2 --questions-per-step 1 --group-size 2 --threads 1",
        "bench headroom": "--questions 4 --samples 2 --threads 1 --no-progress",
        "bench retrieval": "--sizes 2000 --repeats 1 --queries 16 --batch 8 --reference-queries 4",
        "validate-env": "--questions 1",
    }.items()
}
#: Fewer repetitions of a documented loop: documented text -> what runs (each must occur in the docs).
SHELL_BUDGETS: dict[str, str] = {
    "for seed in 0 1 2; do": "for seed in 0; do",  # docs/sb3.md: every command of its table, seed 0 only
}
#: The same for python blocks.
PYTHON_BUDGETS: dict[str, str] = {
    "n_steps=128, batch_size=64)": "n_steps=16, batch_size=64)",  # docs/sb3.md: 4 envs x 16 steps a rollout
    "model.learn(5_000)": "model.learn(64)",
}


@dataclass(frozen=True)
class Marker:
    """A ``<!-- snippet: skip ... -->`` line above a block: for the whole block, or its lines with ``prefix``."""

    reason: str
    prefix: str | None = None


@dataclass(frozen=True)
class Block:
    """One fenced block of a Markdown file.

    Attributes:
        path: The Markdown file, relative to the repository root.
        line: 1-based line of the block's first code line.
        language: The fence's tag, lower case ("" when untagged).
        code: The block's text.
        markers: The skip markers right above the fence.
    """

    path: str
    line: int
    language: str
    code: str
    markers: tuple[Marker, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def skip(self) -> str | None:
        """The reason the whole block is not run, or ``None``."""
        return next((m.reason for m in self.markers if m.prefix is None), None)


@dataclass(frozen=True)
class Snippet:
    """A python block, or one line of a bash block.

    Attributes:
        path: The Markdown file, relative to the repository root.
        line: 1-based line of the code (for a bash line, where it starts).
        code: The block's text, or the joined line.
        skip: Why it is not run (a marker's reason), or ``None``.
    """

    path: str
    line: int
    code: str
    skip: str | None = None

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def fenced_blocks(path: Path, root: Path = ROOT) -> list[Block]:
    """Every fenced block of a Markdown file, in order, with the skip markers above it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    relative = path.relative_to(root).as_posix()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not FENCE.match(lines[end]):
            end += 1
        markers: list[Marker] = []
        j = i - 1
        while j >= 0 and (not lines[j].strip() or SKIP.match(lines[j])):  # markers, blank lines between
            if marker := SKIP.match(lines[j]):
                markers.insert(0, Marker(marker["reason"], marker["prefix"]))
            j -= 1
        code = "\n".join(lines[i + 1 : end])
        blocks.append(Block(relative, i + 2, opening[1].lower(), code, tuple(markers)))
        i = end + 1
    return blocks


def logical_lines(block: Block) -> list[tuple[int, str]]:
    """The block's lines with backslash continuations joined, blanks and comments dropped, and where each
    starts."""
    lines: list[tuple[int, str]] = []
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
            lines.append((start, line))
    return lines


def shell_lines(block: Block) -> list[Snippet]:
    """Every command of a bash block: a logical line, or a ``for ... do ... done`` loop over several, each
    with the reason of the marker that covers it."""
    statements: list[tuple[int, str]] = []
    depth = 0  # loops open at the end of the last line
    for start, line in logical_lines(block):
        if depth > 0:
            statements[-1] = (statements[-1][0], statements[-1][1] + "\n" + line)
        else:
            statements.append((start, line))
        words = [w.rstrip(";") for w in words_of(line)]
        depth += words.count("do") - words.count("done")
    return [Snippet(block.path, start, code, why_skipped(block, code)) for start, code in statements]


def why_skipped(block: Block, command: str) -> str | None:
    """The reason of the marker that covers a command of ``block``, or ``None``."""
    by_prefix = (m.reason for m in block.markers if m.prefix is not None and command.startswith(m.prefix))
    return block.skip or next(by_prefix, None)


def words_of(line: str) -> list[str]:
    return shlex.split(line, comments=True)


def searchgym_argv(line: str) -> list[str] | None:
    """The ``searchgym`` arguments of a plain command line, or ``None`` for anything else (other programs,
    and lines with shell variables, which run in bash but cannot be parsed alone)."""
    if "$" in line:
        return None
    words = words_of(line)
    return words[1:] if words and words[0] in SEARCHGYM else None


def needs_a_marker(line: str) -> str | None:
    """Why an unmarked line could not run here, or ``None``."""
    if "cuda" in line:
        return "asks for a GPU"
    return NEEDS_A_MARKER.get(line.split()[0])


# --- the inventory ----------------------------------------------------------------------------------------


@dataclass
class Audit:
    """What the inventory found: problems, how many blocks or lines of each kind, and the reasons given."""

    problems: list[str]
    counts: Counter[str]
    reasons: list[str]


def audit(documents: Sequence[Path], first_hour: set[str], root: Path = ROOT) -> Audit:
    """Classifies every block and line of ``documents``: run here, run by the first hour, not run with a
    visible reason, or a problem (see the module docstring)."""
    problems: list[str] = []
    counts: Counter[str] = Counter()
    reasons: list[str] = []
    for document in documents:
        for block in fenced_blocks(document, root):
            lines = shell_lines(block) if block.language in SHELL_LANGUAGES else []
            for marker in block.markers:
                if marker.prefix is not None and not any(
                    line.code.startswith(marker.prefix) for line in lines
                ):
                    problems.append(
                        f"{block.id}: the marker for `{marker.prefix}` matches no line of the block"
                    )
            if not block.language:
                problems.append(f"{block.id}: untagged fence: tag it (bash, python, text, json ...)")
            elif block.language in DATA_LANGUAGES:
                counts["data blocks (text, json ...)"] += 1
            elif block.language == "python":
                if block.skip:
                    counts["python blocks not run, with a reason"] += 1
                    reasons.append(f"{block.id}: {block.skip}")
                else:
                    counts["python blocks run"] += 1
            elif block.language in SHELL_LANGUAGES:
                counts["bash blocks"] += 1
                if block.skip:
                    reasons.append(
                        f"{block.id} ({len(lines)} command{'s' * (len(lines) != 1)}): {block.skip}"
                    )
                for line in lines:
                    if line.skip:
                        counts["bash commands not run, with a reason"] += 1
                        if not block.skip:
                            reasons.append(f"{line.id}: {line.skip}")
                    elif line.id in first_hour:
                        counts["bash commands run by test_readme_first_hour"] += 1
                    elif (why := needs_a_marker(line.code)) is not None:
                        problems.append(
                            f"{line.id}: `{line.code}` {why}: mark it <!-- snippet: skip REASON -->"
                        )
                    else:
                        counts["bash commands run"] += 1
            else:
                problems.append(
                    f"{block.id}: unknown tag {block.language!r} (run: python, bash; data: text, json ...)"
                )
    return Audit(problems, counts, reasons)


def readme_first_hour() -> list[Snippet]:
    """``make demo`` from the two commands' block, then every line of the block that activates ``.venv``."""
    blocks = [b for b in fenced_blocks(ROOT / "README.md") if b.language in SHELL_LANGUAGES]
    quickstart = next(b for b in blocks if any(line.code.startswith("make demo") for line in shell_lines(b)))
    after = next(b for b in blocks if b.code.lstrip().startswith("source .venv/bin/activate"))
    return [
        *(line for line in shell_lines(quickstart) if line.code.startswith("make demo")),
        *shell_lines(after),
    ]


FIRST_HOUR = {step.id for step in readme_first_hour()}
BLOCKS = [block for document in DOCUMENTS for block in fenced_blocks(document)]
PYTHON_SNIPPETS = [Snippet(b.path, b.line, b.code, b.skip) for b in BLOCKS if b.language == "python"]
SHELL_LINES = [line for b in BLOCKS if b.language in SHELL_LANGUAGES for line in shell_lines(b)]
COMMANDS = [line for line in SHELL_LINES if searchgym_argv(line.code) is not None]
DOCUMENTED_FILES = {
    match["path"]: snippet.code + "\n"
    for snippet in PYTHON_SNIPPETS
    if (match := FILE_COMMENT.match(snippet.code.splitlines()[0] if snippet.code else ""))
}


def test_every_block_runs_or_says_why() -> None:
    """The inventory: every block and line is run (here or by the first hour) or not run with a reason
    visible in the Markdown; anything else fails. Each python budget still finds its documented text."""
    found = audit(DOCUMENTS, FIRST_HOUR)
    print("\n".join(f"{n:4d} {kind}" for kind, n in sorted(found.counts.items())))
    print("not run:\n  " + "\n  ".join(found.reasons))
    assert not found.problems, "\n".join(found.problems)
    python = "\n".join(s.code for s in PYTHON_SNIPPETS)
    assert all(old in python for old in PYTHON_BUDGETS), "a PYTHON_BUDGETS key is in no python block"
    shell = "\n".join(s.code for s in SHELL_LINES if s.skip is None)
    assert all(old in shell for old in SHELL_BUDGETS), "a SHELL_BUDGETS key is in no bash line that runs"
    assert found.counts["python blocks run"] >= 15 and found.counts["bash commands run"] >= 40


def test_the_audit_catches_what_would_slip_through(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```\nsearchgym eval\n```\n\n"
        "```bash\npip install torch\nsearchgym train grpo --device cuda\nsearchgym eval\n```\n\n"
        "<!-- snippet: skip `searchgym serve`: runs until stopped -->\n```bash\nsearchgym eval\n```\n\n"
        "<!-- snippet: skip downloads a model -->\n\n```bash\nhuggingface-cli download x\n```\n\n"
        "```mermaid\ngraph\n```\n\n```text\nout\n```\n",
        encoding="utf-8",
    )
    found = audit([page], set(), root=tmp_path)
    expected = [
        "page.md:2: untagged fence",
        "page.md:6: `pip install torch` installs packages",
        "page.md:7: `searchgym train grpo --device cuda` asks for a GPU",
        "page.md:13: the marker for `searchgym serve` matches no line",
        "page.md:23: unknown tag 'mermaid'",
    ]
    assert len(found.problems) == len(expected)
    assert all(p.startswith(e) for p, e in zip(found.problems, expected, strict=True)), found.problems
    assert found.counts["bash commands run"] == 2 and found.counts["data blocks (text, json ...)"] == 1
    assert found.reasons == ["page.md:19 (1 command): downloads a model"]


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


@pytest.mark.parametrize("snippet", COMMANDS, ids=[c.id for c in COMMANDS])
def test_documented_command_parses(snippet: Snippet, parser: argparse.ArgumentParser) -> None:
    argv = searchgym_argv(snippet.code)
    assert argv is not None
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parser.parse_args(argv)
    except SystemExit as e:  # argparse reports a usage error by exiting
        pytest.fail(f"{snippet.id}: `{snippet.code}` does not parse:\n{stderr.getvalue()}", pytrace=False)
        raise AssertionError from e  # unreachable: keeps type checkers aware that the test ends here


SHARED_COMMANDS = [c for c in COMMANDS if "--dataset ../shared/" in c.code]


@pytest.mark.parametrize("snippet", SHARED_COMMANDS, ids=[c.id for c in SHARED_COMMANDS])
def test_documented_dataset_and_splits_exist(snippet: Snippet, parser: argparse.ArgumentParser) -> None:
    """Every documented command that names a folder of ``../shared/data`` — those not run here too (a GPU,
    hours) — names a dataset that exists and splits (slices included) that it has, as the command itself
    checks them before it starts."""
    from searchgym.app.cli._splits import check_splits

    if not (SHARED / "data").is_dir():
        pytest.skip(f"../shared is absent here ({SHARED})")
    argv = searchgym_argv(snippet.code)
    assert argv is not None
    args = parser.parse_args(argv)
    args.dataset = str(SHARED / Path(args.dataset).relative_to("../shared"))
    check_splits(args)


def test_every_documented_dataset_command_is_checked() -> None:
    """The check above finds the real-data training commands of grpo.md and scale.md (run on a GPU only)."""
    where = {(c.path, words_of(c.code)[1]) for c in SHARED_COMMANDS}
    assert {("docs/grpo.md", "train"), ("docs/scale.md", "train"), ("docs/scale.md", "prepare")} <= where


def subparser(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> argparse.ArgumentParser:
    """The parser of a sub-command path, e.g. ``("train", "grpo")``."""
    for name in path:
        choices = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        assert name in choices, f"no command {path}"
        parser = choices[name]
    return parser


def test_budgets_only_shrink_sizes(parser: argparse.ArgumentParser) -> None:
    """Every budget option exists (a renamed one would silently run the documented, long command), and a
    numeric one is at most the option's default: budgets make runs smaller, never different in kind."""
    for path, options in BUDGETS.items():
        actions = subparser(parser, path)._option_string_actions
        unknown = [o for o in options if o.startswith("--") and o not in actions]
        assert not unknown, f"searchgym {' '.join(path)} has no options {unknown}"
        for option, value in zip(options, [*options[1:], ""], strict=True):
            default = actions[option].default if option in actions else None
            if option.startswith("--") and isinstance(default, int | float) and not isinstance(default, bool):
                assert float(value) <= default, (
                    f"searchgym {' '.join(path)} {option} {value} > default {default}"
                )


# --- README as a first-hour guide ---------------------------------------------------------------------------

#: README's sections, in the order a newcomer needs them: what the package is for (its API, the agents,
#: benchmarking) before what the demo printed and what the studies found.
README_SECTIONS = (
    "Install",
    "The two commands",
    "Using the environment",
    "Agents",
    "Benchmark your agent",
    "The command line",
    "What `make demo` prints",
    "What the studies found",
)
#: The line the README's first ``env = gym.make(`` example must come before: a reader meets the API on the
#: first screenful, not after the demo's figures.
FIRST_EXAMPLE_BEFORE_LINE = 60
#: Abbreviations every reader knows: no definition asked.
COMMON_ABBREVIATIONS = frozenset(
    {"API", "CI", "CLI", "CPU", "GPU", "HTML", "HTTP", "JSON", "JSONL", "PNG", "README", "URL"}
)
#: The project's words that are not abbreviations but still need a definition or a link at first use.
README_TERMS = (
    "FlashRAG",
    "frozen control",
    "warm-start",
    "pre-registered",
    "likelihood displacement",
    "ledger-LLDS",
    "three-phase",
    "A ≥ 0",
)
ABBREVIATION = re.compile(r"(?<![\w-])[A-Z][A-Z0-9]*[A-Z0-9](?![\w])")
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]*)\)")


def readme_prose(text: str) -> str:
    """The README as a reader's eye meets words: fenced blocks, HTML comments and inline code blanked out
    (same length, so positions hold), link texts kept."""

    def blank(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match[0])

    text = re.sub(r"^\s*```.*?^\s*```[^\n]*$", blank, text, flags=re.MULTILINE | re.DOTALL)
    text = re.sub(r"<!--.*?-->", blank, text, flags=re.DOTALL)
    return re.sub(r"`[^`]+`", blank, text)


def undefined_terms(text: str) -> list[str]:
    """Each abbreviation and :data:`README_TERMS` word whose first use in ``text`` is neither inside a link's
    text nor defined beside it: ``TERM (meaning…)``, ``TERM: meaning``, ``meaning (TERM)`` or
    ``(TERM: meaning…)``."""
    prose = readme_prose(text)
    links = [m.span(1) for m in LINK.finditer(prose)]
    firsts: dict[str, tuple[int, int]] = {}
    for match in ABBREVIATION.finditer(prose):
        if match[0] not in COMMON_ABBREVIATIONS:
            firsts.setdefault(match[0], match.span())
    for term in README_TERMS:
        if (at := prose.lower().find(term.lower())) >= 0:
            firsts[term] = (at, at + len(term))
    missing = []
    for term, (start, end) in firsts.items():
        linked = any(a <= start and end <= b for a, b in links)
        after = " ".join(prose[end : end + 3].split())
        named = prose[:start].rstrip().endswith("(") and prose[end : end + 1] in (")", ":")  # "long (ABBR)"
        defined = after.startswith(("(", ":")) or named
        if not (linked or defined):
            line = prose.count("\n", 0, start) + 1
            missing.append(f"README.md:{line}: {term!r} is used before it is defined or linked")
    return missing


def test_readme_is_a_first_hour_guide() -> None:
    """What it is, install, the two commands, then the API, the agents, benchmarking and the command line,
    and only then what the demo printed and three findings with their pages; every term defined at its first
    use or linked to the page that explains it."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    assert [h for h in headings if h in README_SECTIONS] == list(README_SECTIONS), headings
    first = next(n for n, line in enumerate(text.splitlines(), 1) if line.startswith("env = gym.make("))
    assert first < FIRST_EXAMPLE_BEFORE_LINE, f"README.md:{first}: the first env = gym.make( example"
    intro = text.split("\n## ", 1)[0]
    assert len(re.findall(r"[.!?](?:\s|$)", intro.split("\n\n")[1])) == 3, "what it is: three sentences"
    quickstart = next(b for b in BLOCKS if b.path == "README.md" and b.language in SHELL_LANGUAGES)
    assert [words_of(line)[:2] for _, line in logical_lines(quickstart)] == [
        ["make", "demo"],
        ["make", "test"],
    ]
    findings = text.split("## What the studies found", 1)[1].split("\n## ", 1)[0]
    bullets = re.findall(r"^- (.+(?:\n  .+)*)", findings, flags=re.MULTILINE)
    assert len(bullets) == 3 and all(re.search(r"\]\(docs/experiments/\w+\.md\)", b) for b in bullets)
    assert "learn2.md" in bullets[-1]
    assert not re.search(r"\b1,\d{3} tests\b", text), "test counts go stale: say what the commands run"
    assert undefined_terms(text) == []
    broken = [t for _, t in LINK.findall(text) if "://" not in t and not (ROOT / t.split("#")[0]).exists()]
    assert broken == []


def test_the_term_check_catches_an_unexplained_term() -> None:
    assert undefined_terms("We train with GRPO (group relative policy optimisation).\n") == []
    assert undefined_terms("Group relative policy optimisation (GRPO) then [LLDS](docs/grpo.md).\n") == []
    assert undefined_terms("`SFT` in code is fine; (C1 met), SAPO too.\n") == [
        "README.md:1: 'C1' is used before it is defined or linked",
        "README.md:1: 'SAPO' is used before it is defined or linked",
    ]
    assert undefined_terms("a frozen control of the same seed, then ledger-LLDS\n") == [
        "README.md:1: 'frozen control' is used before it is defined or linked",
        "README.md:1: 'ledger-LLDS' is used before it is defined or linked",
    ]


# --- README's demo table --------------------------------------------------------------------------------------


def readme_demo_table() -> tuple[list[str], list[dict[str, str]], list[str]]:
    """The header, rows and verdict sentences of the README's ``make demo`` output block."""
    block = next(b for b in BLOCKS if b.path == "README.md" and b.language == "text" and "em_95ci" in b.code)
    header, dashes, *rest = block.code.splitlines()
    assert set(dashes.replace(" ", "")) == {"-"}, (
        f"README demo table: the line under the header is {dashes!r}"
    )
    columns = header.split()
    rows = [
        dict(zip(columns, re.split(r"\s{2,}", line.strip()), strict=True))
        for line in rest
        if "  " in line.strip()
    ]
    sentences = [line for line in rest if any(line.startswith(f"{r['model']}: ") for r in rows)]
    return columns, rows, sentences


def test_readme_demo_table_is_consistent() -> None:
    """The table is what the demo prints, and its figures agree with each other and with the prose."""
    from searchgym.app.cli.demo import COLUMNS, wilson
    from searchgym.app.cli.demo import add_arguments as demo_arguments

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    columns, rows, sentences = readme_demo_table()
    assert columns == COLUMNS
    assert [r["model"] for r in rows] == ["warm-start", "GRPO", "GRPO+LLDS (action)"]
    demo = argparse.ArgumentParser()
    demo_arguments(demo)
    questions = re.search(r"(\d+)\s+test\s+questions,\s+greedy", readme)
    assert questions is not None and int(questions[1]) == demo.get_default("eval_questions")
    n = int(questions[1])
    warm = float(rows[0]["test_em"])
    for row in rows:  # each interval is the Wilson interval of its EM over that many questions
        lo, hi = wilson(float(row["test_em"]), n)
        assert row["em_95ci"] == f"[{lo:.3f}, {hi:.3f}]", row
    for row, sentence in zip(rows[1:], sentences, strict=True):
        gain = float(row["gain"])
        # the gain is the row's EM minus the warm-start's, and the questions it gained less those it lost
        assert gain == pytest.approx(float(row["test_em"]) - warm, abs=0.0015), row
        lost, gained = (int(x) for x in row["lost/gained"].split("/"))
        assert gain == pytest.approx((gained - lost) / n, abs=5e-4), row
        lo, hi = (float(x) for x in row["gain_95ci"].strip("[]").split(", "))
        assert lo <= gain <= hi, row
        assert sentence.startswith(
            f"{row['model']}: greedy test EM {row['gain']} {row['gain_95ci']} over the frozen warm-start on the "
            f"same {n} questions ({gained} gained, {lost} lost, McNemar p {row['mcnemar_p']})"
        ), sentence
        assert ("beyond the paired interval" in sentence) == (lo > 0 or hi < 0), sentence

    def quoted(pattern: str) -> list[float]:
        found = re.search(pattern.replace(" ", r"\s+"), readme)
        assert found is not None, f"README no longer says {pattern!r}"
        return [float(x) for x in found.groups()]

    # What the prose under the table quotes from it, to its rounding.
    before, after, gain = quoted(r"GRPO lifts greedy test EM from ([\d.]+) to ([\d.]+) \(([+-][\d.]+),")
    assert [before, after, gain] == [warm, float(rows[1]["test_em"]), float(rows[1]["gain"])]
    (minutes,) = quoted(r"([\d.]+) min wall at")
    stages = sum(float(r["minutes"]) for r in rows)  # the headroom line's minute is the rest
    assert stages - 0.05 <= minutes <= stages + 1.0, "the wall time quoted is the run's: its stages summed"


# --- running the documented python blocks ------------------------------------------------------------------


def _clean_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1", **extra}


@pytest.fixture(scope="module")
def retrieval_server() -> Iterator[str]:
    """``host:port`` of a Search-R1 ``/retrieve`` server over the default world, for the blocks that call one."""
    pytest.importorskip("fastapi")
    from searchgym.data import generate_world
    from searchgym.retrieval import make_retriever
    from searchgym.server import ServerThread, create_app

    passages = generate_world(seed=0).passages
    with ServerThread(create_app(make_retriever("bm25", passages), passages)) as server:
        yield server.url.removeprefix("http://")


@pytest.mark.slow
@pytest.mark.parametrize("snippet", PYTHON_SNIPPETS, ids=[s.id for s in PYTHON_SNIPPETS])
def test_documented_python_runs(snippet: Snippet, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if snippet.skip is not None:
        pytest.skip(snippet.skip)
    code = snippet.code
    for old, new in PYTHON_BUDGETS.items():
        code = code.replace(old, new)
    if SERVER in code:
        code = code.replace(SERVER, request.getfixturevalue("retrieval_server"))
    script = tmp_path / "snippet.py"
    script.write_text(code + "\n", encoding="utf-8")
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
            f"{snippet.id} failed (exit {done.returncode}):\n{code}\n--- stderr ---\n{done.stderr[-4000:]}",
            pytrace=False,
        )


# --- running the documented bash lines ----------------------------------------------------------------------


def command_path(words: Sequence[str]) -> tuple[str, ...]:
    """The sub-command path of ``searchgym`` argv words, e.g. ``("train", "grpo")``."""
    path: list[str] = []
    for word in words:
        if word.startswith("-"):
            break
        path.append(word)
    # Trailing positionals (export's paths) are not part of the command: keep the longest known prefix.
    for n in range(len(path), 0, -1):
        if tuple(path[:n]) in BUDGETS:
            return tuple(path[:n])
    return tuple(path[:2])


def budgeted(argv: Sequence[str]) -> list[str]:
    """``searchgym`` arguments with their command's budget appended."""
    return [*argv, *BUDGETS.get(command_path(argv), [])]


SHIM = """#!{python}
# `searchgym` for the documented lines: the real command, with the test's budget appended; forked from the
# module's fork server when it runs (tests/searchgym_forkserver.py: the imports done once).
import os, sys
sys.path.insert(0, {tests!r})
from test_docs_snippets import BIN, budgeted
argv = budgeted(sys.argv[1:])
if {socket!r}:
    from searchgym_forkserver import client
    sys.argv = [sys.argv[0], *argv]
    client({socket!r}, str(BIN / "searchgym"))
os.execv(str(BIN / "searchgym"), [str(BIN / "searchgym"), *argv])
"""
FORKSERVER: dict[str, str] = {}
"""The socket of the module's fork server (:func:`forked_searchgym`), while it runs."""


@pytest.fixture(scope="module")
def forked_searchgym() -> Iterator[None]:
    """A server the documented ``searchgym`` lines fork from: each still its own process, in its folder,
    with its environment, streams and exit code; torch and transformers are imported once, not per line."""
    from .searchgym_forkserver import forkserver

    with forkserver(BIN / "searchgym") as folder:
        FORKSERVER["socket"] = str(folder.parent / "socket")
        yield
    FORKSERVER.clear()


def scratch_folder(base: Path) -> tuple[Path, dict[str, str]]:
    """A working folder with ``../shared`` beside it and the files the docs ask readers to create, and the
    environment its lines run in (``searchgym`` budgeted, the virtualenv's ``python``)."""
    work = base / "work"
    work.mkdir(parents=True)
    if SHARED.is_dir():
        (base / "shared").symlink_to(SHARED, target_is_directory=True)
    for relative, text in DOCUMENTED_FILES.items():
        (work / relative).parent.mkdir(parents=True, exist_ok=True)
        (work / relative).write_text(text, encoding="utf-8")
    shim = SHIM.format(
        python=sys.executable, tests=str(Path(__file__).parent), socket=FORKSERVER.get("socket", "")
    )
    for folder in (base / "bin", work / ".venv" / "bin"):
        folder.mkdir(parents=True)
        (folder / "searchgym").write_text(shim, encoding="utf-8")
        (folder / "searchgym").chmod(0o755)
    return work, _clean_env(PATH=f"{base / 'bin'}{os.pathsep}{BIN}{os.pathsep}{os.environ.get('PATH', '')}")


def run_line(line: str, cwd: Path, env: dict[str, str], where: str) -> str:
    """Runs one documented line in bash; fails the test on a non-zero exit."""
    try:
        done = subprocess.run(
            ["bash", "-eo", "pipefail", "-c", line],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{where}: `{line}` ran past {COMMAND_TIMEOUT_S} s", pytrace=False)
    if done.returncode != 0:
        pytest.fail(
            f"{where}: `{line}` exited {done.returncode}\n--- stderr ---\n{done.stderr[-4000:]}",
            pytrace=False,
        )
    return done.stdout


def serve_line(line: str, cwd: Path, env: dict[str, str], where: str) -> None:
    """Starts a documented ``searchgym serve`` line, checks ``GET /health``, and stops it."""
    import httpx

    process = subprocess.Popen(
        ["bash", "-c", f"exec {line}"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for text in process.stdout or []:
            lines.put(text)

    threading.Thread(target=pump, daemon=True).start()
    output: list[str] = []
    deadline = time.monotonic() + COMMAND_TIMEOUT_S
    try:
        url = None
        while url is None:
            try:
                output.append(lines.get(timeout=1))
            except queue.Empty:
                if process.poll() is not None or time.monotonic() > deadline:
                    tail = "".join(output)[-4000:]
                    pytest.fail(
                        f"{where}: `{line}` did not serve (exit {process.returncode}):\n{tail}", pytrace=False
                    )
                continue
            if ready := re.search(r"serving .* on (http://\S+)/retrieve", output[-1]):
                url = ready[1]
        health = httpx.get(url + "/health", timeout=30).json()
        assert health["status"] == "ok", f"{where}: {health}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def written_paths(words: Sequence[str]) -> list[str]:
    """The ``--out`` and ``--run-dir`` values of a command: what it promises to write."""
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("--out", "--run-dir")]


@pytest.fixture(scope="module")
def prerequisites(tmp_path_factory: pytest.TempPathFactory, forked_searchgym: None) -> dict[str, Path]:
    """Files some pages use without making them, built once with small budgets by the commands the docs give
    for them: a warm-start checkpoint, its Hugging Face folder, an SB3 macro model, and a checkpoint in the
    format before v2 (the warm-start's payload tagged v1, what ``upgrade`` converts)."""
    import torch

    from searchgym.agents.training.checkpoint import LEGACY_FORMATS, load_checkpoint

    work, env = scratch_folder(tmp_path_factory.mktemp("prerequisites"))
    for line in (
        "searchgym train sft --run-dir runs/sft",
        "searchgym export runs/sft/checkpoint.pt hf_folder",
    ):
        run_line(line, work, env, "prerequisite")
    run_line("searchgym train sb3 --algo ppo --view macro", work, env, "prerequisite")
    payload = {k: v for k, v in load_checkpoint(work / "runs/sft/checkpoint.pt").items() if k != "format"}
    (work / "runs/old").mkdir()
    torch.save({"format": LEGACY_FORMATS[0], **payload}, work / "runs/old/checkpoint.pt")
    return {
        name: work / name
        for name in (
            "runs/sft/checkpoint.pt",
            "hf_folder",
            "runs/sb3-ppo-macro-s0/model.zip",
            "runs/old/checkpoint.pt",
        )
    }


@contextlib.contextmanager
def provided(words: Sequence[str], work: Path, prerequisites: dict[str, Path]) -> Iterator[None]:
    """The prerequisites a command names (``sb3:PATH`` too, with its run's ``config.json``) that no earlier
    command of its page wrote, copied in for that command and removed after it: they stand for files made elsewhere, so a later command of the
    page that makes them (sb3.md trains the model its evaluation line loads) finds its place free."""
    copied = []
    for word in words:
        name = word.split(":")[-1].rstrip("/")
        if name in prerequisites and not (work / name).exists():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            if prerequisites[name].is_dir():
                shutil.copytree(prerequisites[name], work / name)
            else:
                shutil.copy2(prerequisites[name], work / name)
            copied.append(work / name)
            run_config = prerequisites[name].parent / "config.json"  # an sb3 model plays the env it records
            if (
                name.endswith(".zip")
                and run_config.is_file()
                and not (work / name).with_name("config.json").exists()
            ):
                shutil.copy2(run_config, (work / name).with_name("config.json"))
                copied.append((work / name).with_name("config.json"))
    yield
    for path in copied:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def shell_sessions() -> dict[str, list[Snippet]]:
    """Per document, its bash lines in order, but those the first hour runs (marked ones included: they are
    reported as skipped)."""
    sessions: dict[str, list[Snippet]] = {}
    for line in SHELL_LINES:
        if line.id not in FIRST_HOUR:
            sessions.setdefault(line.path, []).append(line)
    return sessions


SESSIONS = shell_sessions()


@pytest.mark.slow
@pytest.mark.parametrize("document", list(SESSIONS))
def test_documented_commands_run(document: str, tmp_path: Path, prerequisites: dict[str, Path]) -> None:
    work, env = scratch_folder(tmp_path)
    ran: list[str] = []
    skipped: dict[str, list[str]] = {}  # reason -> the commands it covers
    unwritten: list[str] = []  # what the skipped commands would have written
    for snippet in SESSIONS[document]:
        words = words_of(snippet.code)
        reason = snippet.skip
        if reason is None and any("../shared" in w for w in words) and not (SHARED / "data").is_dir():
            reason = f"reads ../shared, absent here ({SHARED})"
        if reason is None and any(w == p or w.startswith(p + "/") for w in words for p in unwritten):
            reason = "reads what a command not run here writes"
        if reason is not None:
            skipped.setdefault(reason, []).append(snippet.id)
            unwritten += written_paths(words)
            continue
        with provided(words, work, prerequisites):
            if words[:1] and words[0] in SEARCHGYM and words[1:2] == ["serve"]:
                serve_line(snippet.code, work, env, snippet.id)
            else:
                code = snippet.code
                for old, new in SHELL_BUDGETS.items():
                    code = code.replace(old, new)
                run_line(code, work, env, snippet.id)
            missing = [p for p in written_paths(words) if not (work / p).exists()]
            assert not missing, f"{snippet.id}: `{snippet.code}` exited 0 but did not write {missing}"
        unwritten = [p for p in unwritten if p not in written_paths(words)]
        ran.append(snippet.id)
    if not ran:
        pytest.skip("; ".join(f"{', '.join(ids)}: {reason}" for reason, ids in skipped.items()))
    if skipped:
        print(f"{document}: not run: " + "; ".join(f"{', '.join(ids)}: {r}" for r, ids in skipped.items()))


# --- the first hour: README's quickstart and "what next", literally, in a copy of the repository ----------


def test_the_first_hour_is_found() -> None:
    steps = [words_of(s.code) for s in readme_first_hour()]
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
        words = words_of(step.code)
        if words[:1] == ["source"]:
            continue  # each later line runs in bash after `source .venv/bin/activate`
        if words[:2] == ["make", "demo"]:
            line = shlex.join([*make, *words[1:]])
        else:
            line = "source .venv/bin/activate && " + shlex.join(budgeted(words))
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
    # The demo printed the README's table: the same columns, the same rows, the same summary sentence.
    columns, rows, _ = readme_demo_table()
    printed = outputs[0]
    assert re.search(r"^\s*" + r"\s+".join(re.escape(c) for c in columns) + r"\s*$", printed, re.MULTILINE), (
        printed[-3000:]
    )
    assert all(re.search(rf"^\s*{re.escape(r['model'])}\s+[\d.]+\s+\[", printed, re.MULTILINE) for r in rows)
    # each trained row's verdict, whatever a tiny budget's numbers say
    for r in rows[1:]:
        assert f"{r['model']}: greedy test EM " in printed, printed[-3000:]


@pytest.mark.slow
def test_readme_first_hour(tmp_path: Path) -> None:
    _first_hour(tmp_path, fresh_venv=False)


@pytest.mark.install
def test_readme_first_hour_from_a_fresh_virtualenv(tmp_path: Path) -> None:
    """The same with the Makefile building ``.venv`` from scratch (pip install; minutes)."""
    _first_hour(tmp_path, fresh_venv=True)
