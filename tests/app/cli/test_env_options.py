"""The commands that play episodes take every EnvSpec field as an option, built from the spec's declaration
(``cli._common.add_env_arguments``), and no environment code, such command or code-level front end (OpenEnv,
the TRL tool env, the verl tool) declares an env default of its own."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from searchgym.app.cli import build_parser
from searchgym.envs import EnvSpec

ROOT = Path(__file__).resolve().parents[3]

COMMANDS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("eval",): (),
    ("train", "grpo"): (),
    ("train", "trl"): (),
    ("train", "sft"): (),
    ("train", "sb3"): (),
    ("demos",): (),
    ("export-trajectories",): (),
    ("bench", "headroom"): (),
    ("openenv", "serve"): (),
    ("validate-env",): (),
    # verl's rows: one parquet file per split, each split named by a repeatable --split
    ("prepare", "verl"): ("split",),
    # a benchmark plays several dataset folders, each with its own retriever (--retriever DATASET=SPEC)
    ("benchmark",): ("dataset", "world_seed", "retriever"),
}
"""Each command that takes the whole spec, and the fields it declares itself (with another form)."""

FILES = (
    "searchgym/app/cli/_common.py",
    "searchgym/app/cli/_manifest.py",
    "searchgym/app/cli/eval.py",
    "searchgym/app/cli/demos.py",
    "searchgym/app/cli/export_trajectories.py",
    "searchgym/app/cli/bench_headroom.py",
    "searchgym/app/cli/benchmark.py",
    "searchgym/app/cli/prepare_verl.py",
    "searchgym/app/cli/openenv_serve.py",
    "searchgym/app/openenv/environment.py",
    "searchgym/app/openenv/server.py",
    "searchgym/app/cli/validate_env.py",
    "searchgym/app/hub/checks.py",
    "searchgym/app/hub/parity.py",
    "searchgym/app/hub/replies.py",
    "searchgym/app/hub/verifiers_env.py",
    "agents/integrations/verl_data.py",
    "agents/integrations/export.py",
    "agents/integrations/trl_env.py",
    "agents/integrations/verl_tool.py",
    "agents/scripted.py",
    "agents/llm/policy.py",
    "agents/training/export.py",
)


NAMES = EnvSpec.field_names()
DECLARED = re.compile(
    rf"^\s+({'|'.join(NAMES)})\s*:\s*[^=\n`'(]+=(?!\s*((EnvSpec|TRAINING)\.\1|None)\b)", re.M
)
"""A field or argument with a default of its own, named as an env field (``topk: int = 3``). The spec's own
default (``topk: int = EnvSpec.topk``, or the trainers' ``TRAINING.max_turn_tokens``) is no second declaration, nor is ``None`` (not given: an object passed
in, e.g. ``retriever: Retriever | None = None``, or the env's value)."""
FLAG = re.compile(rf"add_argument\(\s*\"--({'|'.join(n.replace('_', '-') for n in NAMES)})\"")
"""An option of an env field's flag added by hand (``add_argument("--topk", ...)``)."""
LOOKUP = re.compile(rf"\.get\(\s*\"({'|'.join(NAMES)})\"\s*,")
"""An env field read from a mapping with a default of its own (``config.get("topk", 3)``)."""


def _subparser(path: tuple[str, ...]) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = build_parser()
    for word in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[word]
    return parser


@pytest.mark.parametrize("path", list(COMMANDS), ids=" ".join)
def test_the_command_takes_every_spec_field(path: tuple[str, ...]) -> None:
    options = {a.dest: a for a in _subparser(path)._actions}
    own = COMMANDS[path]
    missing = [n for n in EnvSpec.field_names() if n not in own and n not in options]
    assert not missing, f"searchgym {' '.join(path)} lacks {missing}"
    for name in EnvSpec.field_names():
        if name not in own:
            assert options[name].option_strings[0] == "--" + name.replace("_", "-")


def test_given_options_change_the_commands_spec_and_the_rest_keep_its_defaults() -> None:
    from searchgym.app.cli._common import env_spec_from_args
    from searchgym.app.cli.eval import env_defaults

    args = build_parser().parse_args(
        ["eval", "--agent", "random", "--topk", "5", "--prompt-style", "chat", "--no-append-question-mark"]
    )
    spec = env_spec_from_args(args, env_defaults())
    assert (spec.topk, spec.prompt_style, spec.append_question_mark) == (5, "chat", False)
    assert spec.split == "test" and spec.max_turn_tokens == EnvSpec().max_turn_tokens


def _without_searchr1_options(text: str) -> str:
    """``searchr1_options`` has Search-R1's argument names and defaults, not the env's: left out."""
    start = text.find("def searchr1_options(")
    if start < 0:
        return text
    end = text.find("\nclass ", start)
    return text[:start] + text[end:]


def test_env_defaults_are_declared_in_the_spec_alone() -> None:
    paths = [p for p in sorted((ROOT / "envs").glob("*.py")) if p.name != "spec.py"]
    found = []
    for path in [*paths, *(ROOT / f for f in FILES)]:
        text = _without_searchr1_options(path.read_text(encoding="utf-8"))
        found += [f"{path.relative_to(ROOT)}: {m.group(0).strip()}" for m in DECLARED.finditer(text)]
        found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in FLAG.finditer(text)]
        found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in LOOKUP.finditer(text)]
    # benchmark's own --retriever (one per dataset) and prepare verl's --split (repeated), see COMMANDS
    own = {("benchmark.py", "retriever"), ("prepare_verl.py", "split")}
    found = [
        f
        for f in found
        if not any(f.startswith(f"searchgym/app/cli/{m}: ") and f'"--{n}"' in f for m, n in own)
    ]
    assert not found, "env options declared outside envs/spec.py:\n" + "\n".join(found)


def test_the_grep_sees_a_declared_default() -> None:
    text = 'def f(\n    topk: int = 3,\n):\n    parser.add_argument("--max-turns", type=int)\n'
    assert DECLARED.search(text) and FLAG.search(text)
    assert LOOKUP.search('self.topk = config.get("topk", 3)') and not LOOKUP.search('config.get("type")')
    assert not DECLARED.search("def f(spec: EnvSpec | None = None, **fields: Any)")
    assert not DECLARED.search("def f(\n    topk: int = EnvSpec.topk,\n)") and DECLARED.search(
        "    topk: int = E.topk"
    )
    assert not DECLARED.search("    topk: The env's top-k (``SearchQAEnv(topk=5)``).")
    assert not DECLARED.search("    retriever: Retriever | None = None,") and DECLARED.search(
        "    topk: int = None_"
    )
