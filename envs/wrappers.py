"""Wrappers over SearchQA-v0."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from searchgym.envs.episode import check_segment

__all__ = ["TurnLevelWrapper"]


class TurnLevelWrapper(gym.Wrapper[dict[str, np.ndarray], Any, dict[str, np.ndarray], Any]):
    """One action = a segment of tokens (typically one generated turn).

    The wrapper feeds the segment to the token-level env one token at a time and stops exactly where the env
    ends the turn (or the episode). Tokens after that point are not fed: ``info["discarded_tokens"]`` lists
    them and ``info["consumed_tokens"]`` counts the fed ones. A segment that ends before the turn does leaves
    the turn open; the next segment continues it. Feeding a segment and feeding its tokens one by one give
    identical episodes. The reward is the sum of the fed steps' rewards.

    The action space is ``Sequence(Discrete(vocab_size))``; any sequence of ints (list, tuple, 1-D array) is
    accepted. The whole segment is checked before any token is fed: an empty segment, a non-integer, or an
    id outside the vocabulary raises :class:`~searchgym.errors.InvalidActionError` and changes nothing.
    """

    def __init__(self, env: gym.Env[dict[str, np.ndarray], int]) -> None:
        super().__init__(env)
        vocab = int(env.action_space.n)  # type: ignore[attr-defined]
        self.action_space = spaces.Sequence(spaces.Discrete(vocab))

    def step(self, action: Sequence[int]) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        segment = check_segment(action, int(self.env.action_space.n))  # type: ignore[attr-defined]
        total = 0.0
        result: tuple[dict[str, np.ndarray], Any, bool, bool, dict[str, Any]] | None = None
        consumed = 0
        for token in segment:
            result = self.env.step(token)
            consumed += 1
            total += float(result[1])
            if result[2] or result[3] or result[4].get("turn_end"):
                break
        assert result is not None
        obs, _, terminated, truncated, info = result
        info = {**info, "consumed_tokens": consumed, "discarded_tokens": segment[consumed:]}
        return obs, total, terminated, truncated, info
