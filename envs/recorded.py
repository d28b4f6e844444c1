"""Environments rebuilt from what a file records: searchgym's own env ids, with their own arguments only.

A run's ``config.json`` names the env its model plays. Handed to ``gym.make`` as they are, a file's env id
and arguments could run code: ``gym.make("pkg.module:EnvId")`` imports ``pkg.module`` first, and wrapper
arguments (``entry_point``, ``additional_wrappers``…) reach further. :func:`make_recorded_env` builds only
the env ids searchgym registers, with arguments that their constructors declare, each a JSON scalar (or, for
``retriever_faults``, a flat object of scalars); a retriever that would write a file (a recording cassette) is
refused too. :func:`check_recorded_env` applies the same checks without building the env.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import gymnasium as gym

from searchgym.errors import ConfigError

__all__ = ["RECORDED_ENV_IDS", "check_recorded_env", "make_recorded_env"]

RECORDED_ENV_IDS = ("SearchQA-v0", "SearchQAMacro-v0")
"""The env ids a file may name."""

_SCALARS = (str, int, float, bool, type(None))


def _arguments(env_id: str) -> set[str]:
    """The keyword arguments the env's constructor declares (the macro env's include the token env's)."""
    from searchgym.envs.macro import SearchQAMacroEnv
    from searchgym.envs.search_qa import SearchQAEnv

    classes: list[type] = [SearchQAEnv] if env_id == "SearchQA-v0" else [SearchQAMacroEnv, SearchQAEnv]
    from searchgym.envs.spec import EnvSpec

    names: set[str] = {f.name for f in dataclasses.fields(EnvSpec)}  # what ``**fields`` accepts
    for cls in classes:
        for p in inspect.signature(cls).parameters.values():
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "spec":
                names.add(p.name)
    return names


def make_recorded_env(env_id: Any, kwargs: Any, source: str) -> gym.Env[Any, Any]:
    """``gym.make(env_id, **kwargs)`` for an env id and arguments read from ``source`` (a file).

    Raises:
        ConfigError: as :func:`check_recorded_env`.
    """
    check_recorded_env(env_id, kwargs, source)
    import searchgym  # noqa: F401 - registers the env ids

    return gym.make(env_id, **kwargs)


def check_recorded_env(env_id: Any, kwargs: Any, source: str) -> None:
    """Checks an env id and arguments read from ``source`` (a file) before anything is built from them.

    Raises:
        ConfigError: ``env_id`` is not one of :data:`RECORDED_ENV_IDS`, or an argument is not one the env
            declares, holds a value that is not plain data, or names a recording cassette.
    """
    if not isinstance(env_id, str) or env_id not in RECORDED_ENV_IDS:
        raise ConfigError(
            f"{source}: env_id {env_id!r:.80} is not a registered searchgym env "
            f"({', '.join(RECORDED_ENV_IDS)}); a file may not name another (gym.make's module:EnvId form would "
            "import that module); pass env= to build any other env yourself"
        )
    if not isinstance(kwargs, dict):
        raise ConfigError(f"{source}: the env arguments are a {type(kwargs).__name__}, not an object")
    allowed = _arguments(env_id)
    for name, value in kwargs.items():
        if name not in allowed:
            raise ConfigError(
                f"{source}: {name!r:.60} is not an argument of {env_id} "
                f"(it takes {', '.join(sorted(allowed))})"
            )
        if isinstance(value, dict) and name == "retriever_faults":
            plain = all(isinstance(k, str) and isinstance(v, _SCALARS) for k, v in value.items())
        else:
            plain = isinstance(value, _SCALARS)
        if not plain:
            raise ConfigError(
                f"{source}: env argument {name!r} holds a {type(value).__name__}, not plain data"
            )
        if name == "retriever" and isinstance(value, str) and value.startswith("cassette:") and ";" in value:
            raise ConfigError(
                f"{source}: env argument 'retriever' is {value!r:.80}, a recording cassette, which writes a "
                "file; a file may name a cassette to replay only (cassette:PATH)"
            )
