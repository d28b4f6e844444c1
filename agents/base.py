"""The agent interface: token-level agents, and batched agents that generate whole segments."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["Agent", "SegmentAgent"]

Observation = dict[str, np.ndarray]


class Agent(ABC):
    """An agent that writes one token per call.

    The evaluation harness calls :meth:`reset` with the env's reset ``info`` at the start of every episode,
    then :meth:`act` once per step with the latest observation and ``info``. ``info["turn_end"]`` is True on
    the step after a turn ended (the env then holds fresh tool output, if any).
    """

    name: str = "agent"
    """What tables call the agent (``searchgym eval`` and ``benchmark`` show it, not the ``--agent`` text)."""

    @classmethod
    def from_env(cls, env: Any, **options: Any) -> Agent:
        """The agent for ``env`` (wrapped or not): how ``searchgym eval --agent`` builds every agent class.

        By default ``cls(env, **options)``, so an agent of your own needs only ``__init__(self, env)`` (and a
        ``seed`` keyword, which the command then passes, to be seeded); a class whose constructor takes what
        it reads from the env (a tokenizer, an action count) overrides this, and the command uses the override
        only for a class that defines no constructor of its own below it (a subclass with its own
        ``__init__(self, env)`` is built as ``Class(env)``).
        """
        return cls(env, **options)  # type: ignore[call-arg]

    def reset(self, info: dict[str, Any], seed: int | None = None) -> None:  # noqa: B027 - optional hook
        """Starts an episode. ``seed`` (when given) makes stochastic agents reproducible."""

    @abstractmethod
    def act(self, observation: Observation, info: dict[str, Any]) -> int:
        """Returns the next token id."""


class SegmentAgent(Agent):
    """An agent that can also generate whole segments for many episodes at once (batched rollouts).

    :meth:`generate` receives one observation per episode and returns one token segment per episode; the
    turn-level wrapper and the vector env feed the segments token by token and stop each one exactly where
    the environment would. The default :meth:`act` plays segments one token at a time.
    """

    def __init__(self) -> None:
        self._pending: list[int] = []

    @abstractmethod
    def generate(
        self, observations: Sequence[Observation], infos: Sequence[dict[str, Any]]
    ) -> list[list[int]]:
        """Returns one token segment per observation (typically one turn each)."""

    def reset(self, info: dict[str, Any], seed: int | None = None) -> None:
        """Drops tokens left over from the previous episode's last segment."""
        self._pending = []

    def act(self, observation: Observation, info: dict[str, Any]) -> int:
        if info.get("turn_end") or not self._pending:
            self._pending = list(self.generate([observation], [info])[0])
            if not self._pending:
                raise ValueError(f"{type(self).__name__}.generate returned an empty segment")
        return self._pending.pop(0)
