"""A search-then-extract heuristic: no learning, one search, an answer span picked by a fixed rule."""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym
import numpy as np

from searchgym.protocol import Source
from searchgym.rewards import normalize_answer
from searchgym.tokenization import Tokenizer

from .base import Agent, Observation

__all__ = ["HeuristicAgent", "extract_answer", "parse_information"]

_DOC = re.compile(r'Doc \d+\(Title: "?(.*?)"?\) (.*?)(?=\nDoc \d+\(Title: |</information>|$)', re.DOTALL)
_YEAR = re.compile(r"\b(1[0-9]{3}|20[0-9]{2})\b")
_CAPS = re.compile(r"\b[A-Z][\w'-]*(?:\s+(?:of|the|de|and|&)?\s*[A-Z][\w'-]*)*")
_COMPARE = re.compile(r",\s*(.+?)\s+or\s+(.+?)\?\s*$")


def parse_information(text: str) -> list[tuple[str, str]]:
    """``(title, text)`` pairs of the last ``<information>`` block in ``text``."""
    block = text.rsplit("<information>", 1)[-1]
    return [(m.group(1), m.group(2).strip()) for m in _DOC.finditer(block)]


def _score(candidate: str, passages: list[tuple[str, str]]) -> float:
    return sum(1.0 / (rank + 1) for rank, (_, text) in enumerate(passages) if candidate in text)


def extract_answer(question: str, passages: list[tuple[str, str]]) -> str:
    """Picks an answer span from retrieved passages by a fixed rule.

    1. Comparison (``…, A or B?``): the option whose passage gives the earlier year (the one that mentions
       ``earlier`` / ``first``), else the first option.
    2. ``year`` / ``when`` questions: the year that appears in the best-ranked passages, weighting
       rank ``r`` by ``1 / (r + 1)``.
    3. Otherwise: the capitalised span (or, for ``occupation``, the word after ``is a``) with the highest
       rank-weighted count that is not part of the question.

    Returns an empty string when no candidate exists.
    """
    if not passages:
        return ""
    compare = _COMPARE.search(question)
    if compare:
        options = [compare.group(1).strip(), compare.group(2).strip()]
        years = []
        for option in options:
            found = next(
                (_YEAR.search(t) for title, t in passages if title == option or t.startswith(option)), None
            )
            years.append(int(found.group(1)) if found else None)
        if years[0] is not None and years[1] is not None:
            return options[0] if years[0] <= years[1] else options[1]
        return options[0]
    lowered = question.lower()
    text = " ".join(t for _, t in passages)
    if "year" in lowered or lowered.startswith("when"):
        candidates = list(dict.fromkeys(_YEAR.findall(text)))
    elif "occupation" in lowered:
        candidates = list(dict.fromkeys(re.findall(r"\bis an? ([a-z]+)", text)))
    else:
        in_question = normalize_answer(question)
        candidates = [
            span
            for span in dict.fromkeys(m.group(0).strip() for m in _CAPS.finditer(text))
            if normalize_answer(span) and normalize_answer(span) not in in_question
        ]
    if not candidates:
        return ""
    scores = [_score(c, passages) for c in candidates]
    return candidates[int(np.argmax(scores))]


class HeuristicAgent(Agent):
    """Searches the question once, then answers with :func:`extract_answer` on the returned passages.

    It reads the passages from the observation (the tool tokens of the transcript), like any policy.

    Args:
        tokenizer: The env's tokenizer, or the env itself (``HeuristicAgent(env)``).
    """

    name = "heuristic"

    def __init__(self, tokenizer: Tokenizer | gym.Env[Any, Any]) -> None:
        if isinstance(tokenizer, gym.Env):  # HeuristicAgent(env), as every agent is built
            base: Any = tokenizer.unwrapped
            tokenizer = base.tokenizer
        self.tokenizer: Tokenizer = tokenizer  # type: ignore[assignment]  # an env was replaced just above
        self._queue: list[int] = []
        self._question = ""
        self._searched = False

    @classmethod
    def from_env(cls, env: Any) -> HeuristicAgent:  # type: ignore[override]
        """The heuristic in ``env``'s tokenizer."""
        return cls(env.unwrapped.tokenizer)

    def reset(self, info: dict[str, Any], seed: int | None = None) -> None:
        self._question = info["question"]
        self._queue = self.tokenizer.encode(f"<search> {self._question} </search>")
        self._searched = False

    def act(self, observation: Observation, info: dict[str, Any]) -> int:
        if info.get("turn_end") and not self._searched:
            self._searched = True
            n = int(observation["length"][0])
            tool = observation["sources"][:n] == Source.TOOL
            passages = parse_information(self.tokenizer.decode(observation["tokens"][:n][tool]))
            answer = extract_answer(self._question, passages)
            self._queue = self.tokenizer.encode(f"<answer> {answer} </answer>")
        if not self._queue:
            return int(self.tokenizer.eos_token_id or 0)
        return self._queue.pop(0)
