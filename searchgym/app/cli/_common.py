"""Helpers shared by CLI commands: env options, agent loading, table printing."""

from __future__ import annotations

import argparse
import difflib
import importlib
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from searchgym.errors import ConfigError

__all__ = [
    "add_env_arguments",
    "env_kwargs",
    "env_spec_from_args",
    "format_table",
    "interrupted_message",
    "load_agent",
    "make_env",
    "positive_int",
    "run_env_defaults",
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


def add_env_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    defaults: Any = None,
    *,
    env_id: bool = True,
    tokenizer: bool = True,
    title: str = "environment",
    unset: tuple[str, ...] = (),
    skip: tuple[str, ...] = (),
    only: tuple[str, ...] | None = None,
) -> None:
    """One option per :class:`~searchgym.envs.EnvSpec` field (``--topk``, ``--max-turns``, …: every field, from
    its declaration), and ``--tokenizer`` (and ``--env``, the env id, with ``env_id``), in a ``--help``
    group of their own.

    The options default to ``defaults``' values (an ``EnvSpec``; default: its own defaults), those named in
    ``unset`` to ``None``: :func:`env_spec_from_args` takes those from ``defaults`` unless given (a caller may
    first put other values there, e.g. the sizes a checkpoint was trained with). Fields named in ``skip`` are
    the command's own options (e.g. ``benchmark``'s ``--retriever`` per dataset); with ``only``, just those
    fields are added.
    """
    from searchgym.app.cli._options import add_field_arguments
    from searchgym.envs import EnvSpec

    spec = defaults if defaults is not None else EnvSpec()
    group = parser.add_argument_group(title) if isinstance(parser, argparse.ArgumentParser) else parser
    if env_id:
        group.add_argument("--env", default="SearchQA-v0", help="environment id")
    if tokenizer:
        group.add_argument("--tokenizer", default=None, help="tokenizer name or path (default: built-in)")
    names = [n for n in EnvSpec.field_names() if n not in skip and (only is None or n in only)]
    add_field_arguments(group, EnvSpec, spec, unset=unset, names=names)


def run_env_defaults(**changes: Any) -> Any:
    """The environment a command plays unless told otherwise: :class:`~searchgym.envs.EnvSpec`'s defaults with
    a patient retriever (:data:`~searchgym.envs.spec.RUN_PATIENCE`), and ``changes``."""
    from searchgym.envs import EnvSpec
    from searchgym.envs.spec import RUN_PATIENCE

    return EnvSpec(**{"retriever_patience": RUN_PATIENCE, **changes})


def env_spec_from_args(args: argparse.Namespace, defaults: Any = None, **overrides: Any) -> Any:
    """The :class:`~searchgym.envs.EnvSpec` of :func:`add_env_arguments` options: ``defaults`` with the
    options given (and then ``overrides``) changed."""
    from searchgym.envs import EnvSpec

    spec = defaults if defaults is not None else EnvSpec()
    given = {n: getattr(args, n) for n in EnvSpec.field_names() if getattr(args, n, None) is not None}
    return spec.replace(**{**given, **overrides})


def env_kwargs(args: argparse.Namespace, defaults: Any = None, **overrides: Any) -> dict[str, Any]:
    """The ``gym.make`` keyword arguments of :func:`add_env_arguments` options: every spec field, and the
    tokenizer."""
    spec = env_spec_from_args(args, defaults, **overrides)
    return {**spec.to_dict(), "tokenizer": getattr(args, "tokenizer", None)}


def make_env(args: argparse.Namespace, defaults: Any = None, **overrides: Any) -> Any:
    """The env ``args.env`` of :func:`add_env_arguments` options (``defaults`` for those not given), with
    ``overrides`` changed."""
    import gymnasium as gym

    import searchgym  # noqa: F401 - registers the env ids

    return gym.make(args.env, **env_kwargs(args, defaults, **overrides))


def load_agent(name: str, env: Any, seed: int = 0) -> Any:
    """Builds an agent by name (``random``, ``oracle``, ``heuristic``), ``checkpoint:PATH``, ``sb3:PATH`` or
    ``package.module:Class``.

    ``random`` draws uniformly from the env's ``Discrete`` actions (token ids, or macro actions); ``oracle``
    is the macro oracle on ``SearchQAMacro-v0``; ``checkpoint:PATH`` plays a trained LLM greedily (a trainer's
    ``checkpoint.pt`` or a Hugging Face folder); ``sb3:PATH`` plays a stable-baselines3 model saved at PATH.
    The named agents and a user's class are built by one rule, :func:`build_agent_class`.
    """
    from searchgym.agents import HeuristicAgent, MacroOracleAgent, OracleAgent, RandomAgent

    base = env.unwrapped
    if name in BUILTIN_AGENTS:
        oracle = MacroOracleAgent if hasattr(base, "action_for") else OracleAgent
        cls = {"random": RandomAgent, "oracle": oracle, "heuristic": HeuristicAgent}[name]
        return build_agent_class(cls, env, name, seed=seed)
    if name.startswith("checkpoint:"):
        return _checkpoint_agent(name[len("checkpoint:") :], base)
    if name.startswith("sb3:"):
        from searchgym.agents.sb3 import SB3Agent

        return SB3Agent.load(name[len("sb3:") :], env)
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
            close = difflib.get_close_matches(module_name, AGENT_PREFIXES, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}:{attr}?)" if close and isinstance(e, ImportError) else ""
            raise ConfigError(f"cannot load agent {name!r}: {e}{hint}") from e
        finally:
            sys.path[:] = saved_path
        if not isinstance(cls, type):
            raise ConfigError(
                f"--agent {name}: {attr} is a {type(cls).__name__}, not a class; package.module:Class names an "
                f"agent class, built as {AGENT_RULE}"
            )
        agent = build_agent_class(cls, env, name, seed=seed)
        if not callable(getattr(agent, "act", None)):
            raise ConfigError(
                f"--agent {name}: {attr} has no act(observation, info) method; it is not an agent"
            )
        return agent
    raise ConfigError(unknown_agent(name))


AGENT_PREFIXES = ("checkpoint", "sb3", "openai")
"""The ``PREFIX:`` forms of ``--agent`` (a trained or served model)."""


def unknown_agent(name: str) -> str:
    """The one line for an ``--agent`` that is no form it takes: the closest built-in name, or, for a dotted
    path without a colon, the ``package.module:Class`` spelling; then every form."""
    forms = f"{', '.join(BUILTIN_AGENTS)}, checkpoint:PATH, sb3:PATH, openai:MODEL or package.module:Class"
    close = difflib.get_close_matches(name.lower(), BUILTIN_AGENTS, n=1, cutoff=0.6)
    if close:
        return f"unknown agent {name!r} (did you mean {close[0]!r}?); --agent takes {forms}"
    module, dot, attr = name.rpartition(".")
    if dot and module and attr.isidentifier():
        return (
            f"unknown agent {name!r}: a class of your own is named with a colon before the class, "
            f"package.module:Class (did you mean {module}:{attr}?); --agent takes {forms}"
        )
    return f"unknown agent {name!r}; --agent takes {forms}"


AGENT_RULE = (
    "Class(env), or Class(env, seed=SEED) when its __init__ takes a seed (Class.from_env(env) if it has one)"
)
"""How ``--agent`` builds every agent class, for the messages."""


def build_agent_class(cls: type, env: Any, spec: str, seed: int = 0) -> Any:
    """An agent of class ``cls`` for ``env``: the one rule every ``--agent`` class follows, the built-in ones
    included.

    ``cls.from_env(env)`` when the class defines its constructor and ``from_env`` together (a built-in agent
    whose constructor takes what it reads from the env, a tokenizer or an action count), else ``cls(env)``
    (:meth:`Agent.from_env <searchgym.agents.Agent.from_env>`'s default; so a subclass of a built-in agent with
    its own ``__init__(self, env)`` is built as that); ``seed=seed`` is passed too when that call takes a
    ``seed`` parameter.

    Raises:
        ConfigError: the call does not take ``(env)``; the message names the signature it has and the one
            required.
    """
    import inspect

    from searchgym.agents import Agent

    mro = cls.__mro__
    owners = {a: next((k for k in mro if a in vars(k)), object) for a in ("from_env", "__init__")}
    own_factory = owners["from_env"] not in (object, Agent) and mro.index(owners["from_env"]) <= mro.index(
        owners["__init__"]
    )
    call: Any = cls.from_env if own_factory else cls  # type: ignore[attr-defined]
    try:
        signature = inspect.signature(call)
    except (TypeError, ValueError):  # a built-in or C type: no signature to check, the call says
        signature = None
    options = {"seed": seed} if signature is not None and "seed" in signature.parameters else {}
    if signature is not None:
        try:
            signature.bind(env, **options)
        except TypeError as e:
            shown = f"{cls.__name__}.from_env" if own_factory else f"{cls.__name__}.__init__"
            raise ConfigError(
                f"--agent {spec}: {shown}{signature} cannot be called with the env ({e}); an agent class is "
                f"built as {AGENT_RULE}: give it def __init__(self, env)"
            ) from None
    return call(env, **options)


def _checkpoint_agent(path: str, base: Any) -> Any:
    """A trained LLM (``checkpoint.pt`` or a Hugging Face folder) playing greedily in ``base``'s tokenizer.

    Raises:
        ConfigError: ``path`` is a run folder (the message names the ``checkpoint:`` spec of what it holds),
            or the model's tokenizer is not the env's.
    """
    import os

    from searchgym.agents.training.export import load_policy, loadable_in_run

    inside = (
        loadable_in_run(path) if os.path.isdir(path) and not os.path.isfile(f"{path}/config.json") else []
    )
    if inside:
        specs = " or ".join(f"checkpoint:{p}" for p in inside)
        raise ConfigError(f"--agent checkpoint:{path} names a run folder, not a model; did you mean {specs}?")
    policy = load_policy(path, max_turn_tokens=base.env_spec.max_turn_tokens)
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
