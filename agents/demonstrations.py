"""Token-level demonstrations from the oracle, for supervised warm-start, as JSONL."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

from searchgym.data.jsonl import iter_jsonl, replace_on_success
from searchgym.errors import DataFormatError

from .evaluate import run_episode
from .scripted import OracleAgent

__all__ = ["Demonstration", "generate_demonstrations", "read_demonstrations", "write_demonstrations"]


@dataclass
class Demonstration:
    """One oracle episode as the env recorded it.

    Attributes:
        question_id: The question.
        tokens: The whole transcript's token ids (prompt, policy and tool tokens).
        sources: Who wrote each token (1 prompt, 2 policy, 3 tool); train on policy tokens only.
        reward: The episode's reward.
    """

    question_id: str
    tokens: list[int]
    sources: list[int]
    reward: float


def generate_demonstrations(env: gym.Env[Any, Any], episodes: int, seed: int = 0) -> Iterator[Demonstration]:
    """Plays the oracle on the first ``episodes`` questions of the env's split (cycling) and yields transcripts."""
    base: Any = env.unwrapped
    oracle = OracleAgent(base.dataset, base.split, base.tokenizer, base.config.max_turns)
    for i in range(episodes):
        record = run_episode(env, oracle, seed=seed + i, options={"question_index": i % len(base.questions)})
        ep = base.episode
        yield Demonstration(
            question_id=record.info["question_id"],
            tokens=ep.tokens[: ep.length].tolist(),
            sources=ep.sources[: ep.length].tolist(),
            reward=record.reward,
        )


def write_demonstrations(demos: Iterable[Demonstration], path: str | Path) -> int:
    """Writes demonstrations as JSONL; returns how many were written.

    The records go to ``PATH.partial`` as they come and the file is renamed to ``path`` once all are
    written: if generating them fails, an existing ``path`` is left as it was and the finished records
    stay in ``PATH.partial``.
    """
    n = 0
    with replace_on_success(path) as partial, partial.open("w", encoding="utf-8") as f:
        for demo in demos:
            f.write(json.dumps(asdict(demo)) + "\n")
            f.flush()
            n += 1
    return n


def _ints(values: Any, key: str) -> list[int]:
    """``values`` as a list of ints; floats, strings and booleans are refused rather than converted."""
    if not isinstance(values, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    ):
        raise ValueError(f"{key!r} must be a list of integers")
    return values


def read_demonstrations(path: str | Path) -> list[Demonstration]:
    """Reads demonstrations written by :func:`write_demonstrations`.

    Raises:
        DataFormatError: a line is malformed (the message names file and line).
    """
    path = Path(path)
    demos = []
    for lineno, record in iter_jsonl(path):
        try:
            demo = Demonstration(
                question_id=str(record["question_id"]),
                tokens=_ints(record["tokens"], "tokens"),
                sources=_ints(record["sources"], "sources"),
                reward=float(record["reward"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise DataFormatError(str(path), lineno, f"not a demonstration record ({e!r})") from None
        if len(demo.tokens) != len(demo.sources):
            raise DataFormatError(str(path), lineno, "tokens and sources differ in length")
        demos.append(demo)
    return demos
