"""Helpers shared by CLI commands: env options, agent loading, table printing."""

from __future__ import annotations

import argparse
import importlib
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from searchgym.errors import ConfigError

__all__ = [
    "add_env_arguments",
    "env_kwargs",
    "format_table",
    "interrupted_message",
    "load_agent",
    "make_env",
    "positive_int",
]

BUILTIN_AGENTS = ("random", "oracle", "heuristic")
AGENT_FORMS = (
    "random | oracle | heuristic | checkpoint:PATH (a train sft/grpo checkpoint.pt, or a Hugging Face folder "
    "from export) | sb3:PATH (a stable-baselines3 model.zip) | openai:MODEL (a served model, with --base-url) | "
    "package.module:Class"
)
"""Every form ``--agent`` takes, for the commands' help."""


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer >= 1 (``--episodes 0`` or ``-5`` is a usage error, not an empty run)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def repeats_note(episodes: int, questions: int, split: str, what: str) -> str | None:
    """The stderr note for more episodes than the split has questions (episode i plays question i mod N).

    Args:
        episodes: Episodes asked for.
        questions: Questions in the split.
        split: The split's name.
        what: What the repeats mean for this command's output, the note's last words.

    Returns:
        The note, or None when every episode plays another question.
    """
    if episodes <= questions:
        return None
    low, high = episodes // questions, -(-episodes // questions)
    times = f"{low}" if low == high else f"{low} or {high}"
    return (
        f"note: {episodes} episodes over the {questions} questions of split {split!r}: each question is played "
        f"{times} times (episode i plays question i mod {questions}, seeded seed+i); {what}"
    )


def interrupted_message(args: argparse.Namespace) -> str:
    """The one line printed when a command is stopped with Ctrl-C.

    For a training run it names what was saved and the command that continues it (``train grpo``: the
    run folder's ``checkpoint.pt``; ``train trl``: its newest ``checkpoint-N``); otherwise it says the
    command was interrupted, and for ``train sft`` (saved once, at the end) how to start it again.
    """
    path = tuple(getattr(args, "_command", ()) or ("command",))
    command = " ".join(path)
    run_dir = getattr(args, "run_dir", None)
    if path == ("train", "sft") and run_dir is not None:
        again = shlex.join(["searchgym", "train", "sft", "--run-dir", str(run_dir), "--overwrite"])
        return f"searchgym: {command} interrupted; SFT saves its checkpoint at the end, so start again with: {again} ..."
    saved = saved_and_resume(args)
    if saved is None:
        return f"searchgym: {command} interrupted"
    return f"searchgym: {command} interrupted" + (
        f" {saved[len('stopped ') :]}" if saved.startswith("stopped ") else f"; {saved}"
    )


def saved_and_resume(args: argparse.Namespace) -> str | None:
    """What a stopped training run saved and the command that continues it (``None``: not a resumable run).

    ``train grpo``: the step ``RUN_DIR/checkpoint.pt`` holds; ``train trl``: its newest ``checkpoint-N``.
    """
    path = tuple(getattr(args, "_command", ()) or ("command",))
    run_dir = getattr(args, "run_dir", None)
    if run_dir is None or not hasattr(args, "resume"):
        return None
    resume = shlex.join(["searchgym", *path, "--run-dir", str(run_dir), "--resume"])
    if path == ("train", "trl"):
        saved = sorted(Path(run_dir).glob("checkpoint-*"), key=lambda p: _number(p.name.rpartition("-")[2]))
        if saved:
            return f"the newest checkpoint is {saved[-1]}; continue with: {resume}"
    else:
        checkpoint = Path(run_dir) / "checkpoint.pt"
        if checkpoint.is_file():
            step = _saved_step(checkpoint)
            holds = f"step {step}" if step is not None else "an unreadable step"
            return f"{checkpoint} holds {holds}; continue with: {resume}"
    return (
        f"stopped before its first checkpoint; nothing to resume in {run_dir} "
        "(--save-every N writes one every N steps)"
    )


def _number(text: str) -> int:
    return int(text) if text.isdigit() else -1


def _saved_step(checkpoint: Path) -> int | None:
    """The step a checkpoint file records, read without loading its tensors (``None`` if unreadable)."""
    from searchgym.agents.training.checkpoint import peek_checkpoint

    step = (peek_checkpoint(checkpoint) or {}).get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def add_env_arguments(parser: argparse.ArgumentParser) -> None:
    """Options that choose the environment and its data."""
    parser.add_argument("--env", default="SearchQA-v0", help="environment id")
    parser.add_argument("--dataset", default=None, help="FlashRAG folder (default: the generated world)")
    parser.add_argument("--world-seed", type=int, default=0, help="seed of the generated world")
    parser.add_argument("--split", default="test", help="question split")
    parser.add_argument("--tokenizer", default=None, help="tokenizer name or path (default: built-in)")
    parser.add_argument(
        "--retriever",
        default="bm25",
        help="bm25, rank_bm25, dense:INDEX_DIR, hybrid:INDEX_DIR, or the URL of a /retrieve server",
    )
    add_retriever_patience(parser)
    add_episode_size_arguments(parser)


def add_episode_size_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--topk``, ``--max-turns``, ``--max-turn-tokens``, ``--max-context-tokens``: what one episode may hold."""
    parser.add_argument("--topk", type=int, default=3, help="passages per search")
    parser.add_argument("--max-turns", type=int, default=4, help="turn budget")
    parser.add_argument(
        "--max-turn-tokens",
        type=int,
        default=None,
        help="policy tokens per turn (default: the env's 512, or the training value of a checkpoint: agent)",
    )
    parser.add_argument(
        "--max-context-tokens",
        type=int,
        default=None,
        help="transcript size (default: the env's 2048, or the training value of a checkpoint: agent)",
    )


def add_transcript_arguments(parser: argparse.ArgumentParser, prompt_help: str) -> None:
    """``--max-obs-tokens``, ``--reward``, ``--prompt-style``: how an exported episode is written and scored."""
    from searchgym.agents.training.config import REWARDS

    parser.add_argument(
        "--max-obs-tokens", type=int, default=None, help="cut each tool observation to N tokens"
    )
    parser.add_argument("--reward", choices=list(REWARDS), default="em", help="episode reward")
    parser.add_argument("--prompt-style", choices=["base", "chat"], default="base", help=prompt_help)


def add_retriever_patience(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--retriever-patience``: how long a command waits for a URL retriever that stops answering."""
    parser.add_argument(
        "--retriever-patience",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="seconds to wait for a URL retriever that stops answering (a restart) before failing; the run "
        "then goes on as if nothing happened (0: fail once the client's retries are spent)",
    )


def env_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The ``gym.make`` keyword arguments of :func:`add_env_arguments` options."""
    kwargs = {
        "dataset": args.dataset,
        "world_seed": args.world_seed,
        "split": args.split,
        "tokenizer": args.tokenizer,
        "retriever": args.retriever,
        "retriever_patience": args.retriever_patience,
        "topk": args.topk,
        "max_turns": args.max_turns,
    }
    for name in ("max_turn_tokens", "max_context_tokens"):  # unset: keep the env's own default
        if getattr(args, name, None) is not None:
            kwargs[name] = getattr(args, name)
    return kwargs


def make_env(args: argparse.Namespace, **overrides: Any) -> Any:
    import gymnasium as gym

    import searchgym  # noqa: F401 - registers the env ids

    return gym.make(args.env, **{**env_kwargs(args), **overrides})


def load_agent(name: str, env: Any, seed: int = 0) -> Any:
    """Builds an agent by name (``random``, ``oracle``, ``heuristic``), ``checkpoint:PATH``, ``sb3:PATH`` or
    ``package.module:Class``.

    ``random`` draws uniformly from the env's ``Discrete`` actions (token ids, or macro actions); ``oracle``
    is the macro oracle on ``SearchQAMacro-v0``; ``checkpoint:PATH`` plays a trained LLM greedily (a trainer's
    ``checkpoint.pt`` or a Hugging Face folder); ``sb3:PATH`` plays a stable-baselines3 model saved at PATH.
    A user class is called as ``Class(env)``: it receives the (wrapped) env and reads what it needs.
    """
    from searchgym.agents import MacroOracleAgent, OracleAgent, RandomAgent

    base = env.unwrapped
    if name == "random":
        return RandomAgent(int(env.action_space.n), seed=seed)
    if name == "oracle":
        if hasattr(base, "action_for"):
            return MacroOracleAgent(env)
        return OracleAgent.from_env(env)  # queries checked against the env's retriever: a true upper bound
    if name.startswith("checkpoint:"):
        return _checkpoint_agent(name[len("checkpoint:") :], base)
    if name.startswith("sb3:"):
        from searchgym.agents.sb3 import SB3Agent

        return SB3Agent.load(name[len("sb3:") :], env)
    if name == "heuristic":
        from searchgym.agents.heuristic import HeuristicAgent

        return HeuristicAgent(base.tokenizer)
    if ":" in name:
        import os
        import sys

        module_name, _, attr = name.partition(":")
        # As `python -m` does: a module in the current directory is importable, for this import only.
        saved_path = list(sys.path)
        sys.path.insert(0, os.getcwd())
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"cannot load agent {name!r}: {e}") from e
        finally:
            sys.path[:] = saved_path
        if not isinstance(cls, type):
            raise ConfigError(
                f"--agent {name}: {attr} is a {type(cls).__name__}, not a class; package.module:Class names an "
                "agent class, built as Class(env)"
            )
        agent = cls(env)
        if not callable(getattr(agent, "act", None)):
            raise ConfigError(
                f"--agent {name}: {attr} has no act(observation, info) method; it is not an agent"
            )
        return agent
    raise ConfigError(
        f"unknown agent {name!r}; choose one of {list(BUILTIN_AGENTS)}, checkpoint:PATH, sb3:PATH, or "
        "package.module:Class"
    )


def _checkpoint_agent(path: str, base: Any) -> Any:
    """A trained LLM (``checkpoint.pt`` or a Hugging Face folder) playing greedily in ``base``'s tokenizer."""
    from searchgym.agents.training.export import load_policy

    policy = load_policy(path, max_turn_tokens=base.config.max_turn_tokens)
    if policy.tokenizer.token_bytes != base.tokenizer.token_bytes:
        raise ConfigError(
            f"{path} was trained with tokenizer {policy.tokenizer.name!r} but the env uses "
            f"{base.tokenizer.name!r}; pass --tokenizer {policy.tokenizer.name} to the env"
        )
    return policy


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A plain-text table with a header row; floats get 3 decimals."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3f}"
        return "-" if value is None else str(value)

    table = [list(columns)] + [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
