"""Token-level demonstrations for supervised warm-start, as JSONL: the oracle's, or a mixture of teachers.

``--demonstrator`` names who plays each episode: ``oracle`` (the default: gold searches, then the gold
answer), ``shortcut`` (answers a bridge question after its first hop; the oracle elsewhere), or a mixture
``mix:oracle=0.1,shortcut=0.9`` that draws one teacher per episode with those weights. A mixture with a rare
good teacher is *headroom by design*: its imitation is worse than what the episode allows, and the better
strategy is in the data for RL to find.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

from searchgym.data.jsonl import iter_jsonl, replace_on_success
from searchgym.errors import ConfigError, DataFormatError

from .evaluate import run_episode
from .scripted import OracleAgent, ShortcutAgent

__all__ = [
    "TEACHERS",
    "Demonstration",
    "generate_demonstrations",
    "parse_demonstrator",
    "read_demonstrations",
    "write_demonstrations",
]

TEACHERS: dict[str, type[OracleAgent]] = {"oracle": OracleAgent, "shortcut": ShortcutAgent}
"""The named teachers a demonstrator draws from."""


def parse_demonstrator(spec: str) -> dict[str, float]:
    """The teachers of a ``--demonstrator`` value and their probabilities (summing to 1).

    ``oracle`` and ``shortcut`` name one teacher; ``mix:oracle=0.1,shortcut=0.9`` a mixture (weights are
    normalised, so ``mix:oracle=1,shortcut=9`` is the same mixture).

    Raises:
        ConfigError: an unknown teacher, a malformed mixture, or weights that are negative or all zero.
    """
    if spec in TEACHERS:
        return {spec: 1.0}
    kind, sep, body = spec.partition(":")
    if kind != "mix" or not sep:
        raise ConfigError(
            f"unknown demonstrator {spec!r}; use one of {list(TEACHERS)} or mix:NAME=WEIGHT,... "
            "(e.g. mix:oracle=0.1,shortcut=0.9)"
        )
    weights: dict[str, float] = {}
    for part in body.split(","):
        name, eq, value = part.strip().partition("=")
        if name not in TEACHERS or not eq:
            raise ConfigError(
                f"demonstrator {spec!r}: {part!r} is not TEACHER=WEIGHT with a teacher in {list(TEACHERS)}"
            )
        if name in weights:
            raise ConfigError(f"demonstrator {spec!r} names {name!r} twice")
        try:
            weight = float(value)
        except ValueError:
            raise ConfigError(
                f"demonstrator {spec!r}: the weight of {name!r} is not a number ({value!r})"
            ) from None
        if not weight >= 0 or weight == float("inf"):
            raise ConfigError(f"demonstrator {spec!r}: weights must be finite and >= 0, got {name}={value}")
        weights[name] = weight
    total = sum(weights.values())
    if total <= 0:
        raise ConfigError(f"demonstrator {spec!r}: the weights sum to 0")
    return {name: w / total for name, w in weights.items()}


@dataclass
class Demonstration:
    """One oracle episode as the env recorded it.

    Attributes:
        question_id: The question.
        tokens: The whole transcript's token ids (prompt, policy and tool tokens).
        sources: Who wrote each token (1 prompt, 2 policy, 3 tool); train on policy tokens only.
        reward: The episode's reward.
        demonstrator: The teacher that played it (``oracle``, ``shortcut``).
        kind: The question's kind (``attribute``, ``bridge``, ``comparison`` in the generated world); empty
            where the dataset or the file names none.
    """

    question_id: str
    tokens: list[int]
    sources: list[int]
    reward: float
    demonstrator: str = field(default="oracle")
    kind: str = field(default="")


def generate_demonstrations(
    env: gym.Env[Any, Any], episodes: int, seed: int = 0, demonstrator: str = "oracle"
) -> Iterator[Demonstration]:
    """Plays the demonstrator on the first ``episodes`` questions of the env's split (cycling) and yields
    transcripts.

    With a mixture, episode ``i``'s teacher is drawn from the mixture's weights by a generator seeded with
    ``(seed, i)``, so a file is the same whatever its length. A teacher with no move for the question (the
    shortcut on a question that is not a bridge question) hands it to the oracle, and the record says
    ``oracle``.

    Raises:
        ConfigError: ``demonstrator`` is not a demonstrator (see :func:`parse_demonstrator`).
    """
    import numpy as np

    mixture = parse_demonstrator(demonstrator)
    names, probs = list(mixture), np.array(list(mixture.values()))
    base: Any = env.unwrapped
    teachers = {
        name: TEACHERS[name](base.dataset, base.split, base.tokenizer, base.env_spec.max_turns)
        for name in names
    }
    for i in range(episodes):
        name = (
            names[int(np.random.default_rng([seed, i]).choice(len(names), p=probs))]
            if len(names) > 1
            else names[0]
        )
        teacher = teachers[name]
        index = i % len(base.questions)
        record = run_episode(env, teacher, seed=seed + i, options={"question_index": index})
        if isinstance(teacher, ShortcutAgent) and not teacher.took_shortcut:
            name = "oracle"
        ep = base.episode
        yield Demonstration(
            question_id=record.info["question_id"],
            tokens=ep.tokens[: ep.length].tolist(),
            sources=ep.sources[: ep.length].tolist(),
            reward=record.reward,
            demonstrator=name,
            kind=base.questions[index].kind,
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
                demonstrator=record.get("demonstrator", "oracle"),
                kind=record.get("kind", ""),
            )
            if not isinstance(demo.kind, str):
                raise ValueError(f"kind must be a string, got {demo.kind!r}")
            if demo.demonstrator not in TEACHERS:
                raise ValueError(f"demonstrator must be one of {list(TEACHERS)}, got {demo.demonstrator!r}")
        except (KeyError, TypeError, ValueError) as e:
            raise DataFormatError(str(path), lineno, f"not a demonstration record ({e!r})") from None
        if len(demo.tokens) != len(demo.sources):
            raise DataFormatError(str(path), lineno, "tokens and sources differ in length")
        demos.append(demo)
    return demos
