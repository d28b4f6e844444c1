"""What identifies an agent spec's behaviour, for the caches that replay a run only when its agent is the same.

A cache keyed on the spec's text alone (``mypkg.agents:Mine``) would serve the old episodes after the class
was edited. So each form names what decides its play:

* ``checkpoint:PATH`` and ``sb3:PATH``: the SHA-256 of the file (of every file, for a folder);
* ``package.module:Class``: the SHA-256 of the Python source it comes from — the module's file when it is a
  top-level module, else every ``.py`` file of the packages along its dotted name (an edit to a helper
  module of the same package changes it too);
* ``openai:MODEL``: the model name, the server's base URL and the request settings (the sampling settings
  are in the run's own identity);
* the built-in names: ``None`` (they are the installed package's code, named by its version in the manifest).

Data files an agent reads at run time are not covered: a user agent that loads weights from its own file
should be given as ``checkpoint:`` or carry the file inside its package.

It also says what tables call an agent (:func:`agent_label`), and builds the agent of a command's options
(:func:`build_agent`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "add_sampling_arguments",
    "add_served_arguments",
    "agent_label",
    "agent_labels",
    "agent_sha256",
    "apply_sampling",
    "build_agent",
    "close_players",
    "sampling_settings",
    "served_identity",
    "served_players",
    "source_sha256",
]


def _tree_files(root: Path) -> list[Path]:
    return sorted(
        p for p in root.rglob("*.py") if "__pycache__" not in p.parts and not p.name.startswith(".")
    )


def _digest(files: list[tuple[str, Path]]) -> str:
    """One SHA-256 over the files' names (relative, so a moved checkout hashes the same) and contents."""
    h = hashlib.sha256()
    for name, path in files:
        data = path.read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def source_sha256(module_name: str) -> str | None:
    """The SHA-256 of the source of ``module_name`` (see the module docstring), found as the agent loader
    finds it (the current directory first); ``None`` when it has no source file (a built-in or frozen
    module), or cannot be found (the loader then reports the import error)."""
    saved = list(sys.path)
    sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(module_name)
        parts = module_name.split(".")
        roots: list[Path] = []
        for depth in range(1, len(parts)):  # every package along the dotted name, in its own folder(s)
            parent = importlib.util.find_spec(".".join(parts[:depth]))
            for location in (parent.submodule_search_locations or []) if parent else []:
                folder = Path(location).resolve()
                if not any(folder == r or r in folder.parents for r in roots):
                    roots.append(folder)
    except (ImportError, ValueError):
        return None
    finally:
        sys.path[:] = saved
    if spec is None or spec.origin is None or not os.path.isfile(spec.origin):
        return None
    origin = Path(spec.origin).resolve()
    if spec.submodule_search_locations:  # a package named directly: its own folder too
        roots.append(origin.parent)
    files = {origin: f"{module_name}:{origin.name}"}
    for i, root in enumerate(roots):
        for path in _tree_files(root):
            files.setdefault(path.resolve(), f"{i}/{path.relative_to(root).as_posix()}")
    return _digest(sorted(((name, path) for path, name in files.items()), key=lambda item: item[0]))


def _path_sha256(path: str) -> str | None:
    from searchgym.integrity import file_sha256

    if os.path.isfile(path):
        return file_sha256(path, remember=False)
    if os.path.isdir(path):
        root = Path(path)
        files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
        h = hashlib.sha256()  # of each file's digest: a folder's unchanged weights are not read again
        for p in files:
            h.update(f"{p.relative_to(root).as_posix()}\0{file_sha256(p)}\0".encode())
        return h.hexdigest()
    return None  # a missing path errors when the agent loads


def agent_sha256(spec: str) -> str | None:
    """What identifies the code or weights behind an ``--agent`` spec, as a SHA-256 (see the module docstring).

    ``openai:`` agents are identified by their settings instead (``searchgym.agents.served``), so they give
    ``None`` here.
    """
    if spec.startswith(("checkpoint:", "sb3:")):
        return _path_sha256(spec.split(":", 1)[1])
    if spec.startswith("openai:") or ":" not in spec:
        return None
    return source_sha256(spec.partition(":")[0])


# -- names ---------------------------------------------------------------------------------------------------

TRAINED_FORMS = ("checkpoint:", "sb3:", "openai:")
"""The spec forms of trained models: their class's name (llm, ppo, openai) is every such model's, so a table
names them by the spec, whose path or model name tells them apart."""


def agent_label(spec: str, agent: Any = None) -> str:
    """What a table calls the agent of ``--agent spec``: its ``name`` (the class attribute every
    :class:`~searchgym.agents.Agent` has; the class's own name when it sets none), for the built-in names and
    ``package.module:Class``; the spec itself for a trained model (:data:`TRAINED_FORMS`).

    ``agent`` is the built agent; without it (a benchmark pair read back from its cache) a class spec's
    module is imported for the class's ``name``, and a spec that cannot be is shown as it is.
    """
    if spec.startswith(TRAINED_FORMS):
        return spec
    if agent is None and ":" in spec:
        import importlib
        import sys

        module_name, _, attr = spec.partition(":")
        saved = list(sys.path)
        sys.path.insert(0, os.getcwd())  # where load_agent finds it
        try:
            agent = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError):
            return spec
        finally:
            sys.path[:] = saved
    if agent is None:
        return spec  # a built-in name, not built: the name is its label
    name = getattr(agent, "name", None)
    if isinstance(name, str) and name and name != "agent":  # "agent": the interface's placeholder
        return name
    return agent.__name__ if isinstance(agent, type) else type(agent).__name__


def agent_labels(specs: list[str], agents: dict[str, Any] | None = None) -> dict[str, str]:
    """Each spec's :func:`agent_label`, unique: agents that share a name are shown by their specs."""
    labels = {spec: agent_label(spec, (agents or {}).get(spec)) for spec in specs}
    shared = {label for label in labels.values() if list(labels.values()).count(label) > 1}
    return {spec: spec if label in shared else label for spec, label in labels.items()}


# -- sampling -----------------------------------------------------------------------------------------------


def _temperature(text: str) -> float:
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0 (0: greedy), got {text!r}")
    return value


def add_sampling_arguments(parser: Any) -> None:
    """``--temperature`` and ``--samples`` (``eval`` and ``benchmark``)."""
    from searchgym.app.cli._common import positive_int

    parser.add_argument(
        "--temperature",
        type=_temperature,
        default=0.0,
        metavar="T",
        help="sample the agent's tokens at temperature T (default 0: greedy, the field's metric); applies to "
        "agents that sample (checkpoint:, openai:, a class with a 'temperature' attribute)",
    )
    parser.add_argument(
        "--samples",
        type=positive_int,
        default=1,
        metavar="K",
        help="play each question K times, each with its own seed: em becomes mean@K, and pass_at_k and each "
        "question's count of successes are reported (default 1)",
    )


def sampling_settings(args: Any) -> dict[str, Any]:
    """``{"temperature": T, "samples": K}`` of a command's options (greedy, one sample, when it has none)."""
    return {
        "temperature": float(getattr(args, "temperature", 0.0)),
        "samples": int(getattr(args, "samples", 1)),
    }


def apply_sampling(agent: Any, spec: str, temperature: float) -> None:
    """Sets ``agent`` to sample at ``temperature`` (> 0); greedy (0) leaves it as it loaded.

    An agent samples when it has a ``temperature`` attribute (and a ``greedy`` switch, for the LLM policy).

    Raises:
        ConfigError: ``temperature > 0`` for an agent that has no temperature.
    """
    from searchgym.errors import ConfigError

    if temperature == 0:
        return
    if not hasattr(agent, "temperature"):
        raise ConfigError(
            f"--temperature {temperature:g}: agent {spec!r} does not sample by temperature (give it to "
            "checkpoint:, openai: or a class with a 'temperature' attribute; --samples alone replays any agent "
            "with other seeds)"
        )
    agent.temperature = temperature
    if hasattr(agent, "greedy"):
        agent.greedy = False


# -- served models ------------------------------------------------------------------------------------------


def add_served_arguments(parser: Any) -> None:
    """The options of an ``openai:MODEL`` agent (``eval`` and ``benchmark``); the API key is read from the
    environment only."""
    from searchgym.app.cli._common import positive_int

    group = parser.add_argument_group("served model (--agent openai:MODEL)")
    group.add_argument(
        "--base-url",
        default=None,
        metavar="URL",
        help="the server's OpenAI base URL, e.g. http://127.0.0.1:8001/v1",
    )
    group.add_argument(
        "--api",
        choices=("completions", "chat"),
        default="completions",
        help="the request kind: a completion of the whole context, or a chat continuing the assistant's message",
    )
    group.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        metavar="NAME",
        help="the environment variable holding the API key (unset: no key is sent; never logged)",
    )
    group.add_argument(
        "--request-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds one try of a request may take, whole: connecting, the answer's head and its body",
    )
    group.add_argument(
        "--max-response-mb",
        type=float,
        default=16.0,
        metavar="MB",
        help="largest answer body read, in MiB (an error page too); a larger one is refused (default 16)",
    )
    group.add_argument(
        "--retries",
        type=int,
        default=2,
        help="further tries of a request after a connection error, a timeout, 429 or 5xx",
    )
    group.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold of every request")
    group.add_argument(
        "--concurrency",
        type=positive_int,
        default=4,
        metavar="N",
        help="requests in flight at once: N episodes played at a time, each with its own env and connection "
        "(the records and figures are those of one at a time; default 4)",
    )
    group.add_argument(
        "--token-ids",
        action="store_true",
        help="send the context as token ids and play the ids the server returns (serve-policy, vLLM): "
        "token-exact, for a model that shares the env's tokenizer",
    )


def served_identity(args: Any) -> dict[str, Any] | None:
    """What identifies an ``openai:`` agent beyond its spec (``None`` for other agents)."""
    if not str(getattr(args, "agent", "")).startswith("openai:"):
        return None
    from searchgym.agents.served import ServedOptions

    return ServedOptions.from_args(args).identity()


def served_players(args: Any, new_env: Any) -> list[tuple[Any, Any]]:
    """The further (env, agent) pairs an ``openai:`` agent plays with at once: ``--concurrency`` - 1 of them,
    each with a fresh env from ``new_env()`` and its own connection (none for another agent, whose episodes
    are played one at a time). The caller closes them."""
    if not str(getattr(args, "agent", "")).startswith("openai:"):
        return []
    players: list[tuple[Any, Any]] = []
    for _ in range(int(getattr(args, "concurrency", 1)) - 1):
        env = new_env()
        players.append((env, build_agent(args, env)))
    return players


def close_players(players: list[tuple[Any, Any]]) -> None:
    """Closes the envs and agents of :func:`served_players`."""
    for env, agent in players:
        env.close()
        agent.close()


def build_agent(args: Any, env: Any) -> Any:
    """The agent ``args.agent`` names, at ``args.temperature``: an ``openai:MODEL`` agent from the served-model
    options, any other through :func:`~searchgym.app.cli._common.load_agent`.

    Raises:
        ConfigError: a bad spec or option (see :func:`apply_sampling` for the temperature).
    """
    from searchgym.app.cli._common import load_agent

    if args.agent.startswith("openai:"):
        from searchgym.agents.served import ServedAgent, ServedOptions

        base = env.unwrapped
        return ServedAgent(
            ServedOptions.from_args(args),
            base.tokenizer,
            base.env_spec.max_turn_tokens,
            temperature=getattr(args, "temperature", 0.0),
        )
    agent = load_agent(args.agent, env, seed=args.seed)
    apply_sampling(agent, args.agent, getattr(args, "temperature", 0.0))
    return agent
