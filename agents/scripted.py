"""Scripted baselines that need no learning: random tokens, and the gold-passage oracle."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from searchgym.data import Dataset, Passage
from searchgym.envs.spec import EnvSpec
from searchgym.errors import ConfigError
from searchgym.retrieval import Retriever
from searchgym.rewards import normalize_answer
from searchgym.tokenization import Tokenizer

from .base import Agent, Observation

__all__ = [
    "PIN_WORDS",
    "MacroOracleAgent",
    "OracleAgent",
    "RandomAgent",
    "ShortcutAgent",
    "oracle_turns",
    "pin_query",
    "shortcut_turns",
]


class RandomAgent(Agent):
    """Uniformly random actions (token ids for the token-level env): the floor every method must beat.

    Args:
        vocab_size: Number of actions to draw from (``env.action_space.n``), or the env itself.
        seed: Seed of the agent's own generator (re-seeded by ``reset(seed=...)``).
    """

    name = "random"

    def __init__(self, vocab_size: int | gym.Env[Any, Any], seed: int = 0) -> None:
        if isinstance(vocab_size, gym.Env):  # RandomAgent(env), as every agent is built
            vocab_size = int(vocab_size.action_space.n)  # type: ignore[attr-defined]
        self.vocab_size = vocab_size
        self.rng = np.random.default_rng(seed)

    @classmethod
    def from_env(cls, env: gym.Env[Any, Any], seed: int = 0) -> RandomAgent:  # type: ignore[override]
        """Random actions of ``env``'s ``Discrete`` action space."""
        return cls(int(env.action_space.n), seed=seed)  # type: ignore[attr-defined]

    def reset(self, info: dict[str, Any], seed: int | None = None) -> None:
        if seed is not None:
            self.rng = np.random.default_rng(seed)

    def act(self, observation: Observation, info: dict[str, Any]) -> int:
        return int(self.rng.integers(self.vocab_size))


#: Words of passage text added to a title, in turn, until the query retrieves the passage (0: the title).
PIN_WORDS = (0, 16, 32, 64)


def pin_query(passage: Passage, words: int) -> str:
    """A query for ``passage``: its title, followed by the first ``words`` words of its text."""
    return " ".join([passage.title, *passage.text.split()[:words]]).strip()


def oracle_turns(
    dataset: Dataset,
    question_id: str,
    split: str,
    max_turns: int,
    retriever: Retriever | None = None,
    topk: int = EnvSpec.topk,
) -> list[str]:
    """The oracle's turns for a question: searches that retrieve every supporting passage, then an answer.

    Without a retriever, each search is a supporting passage's title. With one, each query is the shortest
    of :func:`pin_query`'s forms (title; title plus 16, 32, 64 words) that puts the passage in the top
    ``topk`` — titles shared by several passages, or that BM25 ranks below another passage, get words of
    the passage's text. When the question has more supporting passages than the ``max_turns - 1`` search
    turns, several passages share one query (at most ``topk`` each, their pinning queries joined). The
    answer always fits the turn budget.
    """
    question = dataset.find_question(split, question_id)
    passages = [dataset.passage_index[pid] for pid in question.supporting_ids if pid in dataset.passage_index]
    searches = max(0, max_turns - 1)
    if searches and len(passages) > searches:
        size = min(topk, -(-len(passages) // searches))  # ceil, bounded by what one search returns
        groups = [passages[i : i + size] for i in range(0, len(passages), size)][:searches]
    else:
        groups = [[p] for p in passages][:searches]
    turns = [f"<search> {_group_query(group, retriever, topk)} </search>" for group in groups]
    answer = question.golden_answers[0] if question.golden_answers else ""
    turns.append(f"<answer> {answer} </answer>")
    return turns


def _group_query(group: list[Passage], retriever: Retriever | None, topk: int) -> str:
    if retriever is None:
        return " ".join(p.title for p in group)
    for words in PIN_WORDS:
        query = " ".join(pin_query(p, words) for p in group)
        found = {h.passage_id for h in retriever.search([query], topk)[0]}
        if all(p.id in found for p in group):
            return query
    return query  # the longest form: the best this retriever allows


def shortcut_turns(
    dataset: Dataset,
    question_id: str,
    split: str,
    retriever: Retriever | None = None,
    topk: int = EnvSpec.topk,
) -> list[str] | None:
    """The shortcut teacher's turns for a bridge question: search the first hop, answer the bridge entity.

    A bridge question (*In which country was X born?*) needs two passages: the first names the bridge entity
    (X's birth city), the second holds the answer. The shortcut searches the first passage, as the oracle
    would, and answers the second passage's title — a plausible, always-wrong answer that a policy can learn
    to replace by the second search it has seen the oracle make. ``None`` when the question is not a bridge
    question with two known supporting passages: the shortcut has no move there.
    """
    question = dataset.find_question(split, question_id)
    passages = [dataset.passage_index[pid] for pid in question.supporting_ids if pid in dataset.passage_index]
    if question.kind != "bridge" or len(passages) != 2:
        return None
    first, bridge = passages
    return [
        f"<search> {_group_query([first], retriever, topk)} </search>",
        f"<answer> {bridge.title} </answer>",
    ]


NO_EVIDENCE = "unknown"
"""What the oracle answers when its searches did not bring the gold passages (an ablated or failing retriever)."""


class OracleAgent(Agent):
    """Searches for the gold supporting passages, then answers the first golden answer — when the searches
    retrieved every gold passage (the env's ``info["gold_all_retrieved"]``), else :data:`NO_EVIDENCE`: it is
    the upper bound of an agent that answers from what it retrieves, so with an empty retriever it scores 0
    and its reliance on search equals its exact match. A question that names no gold passages gets no search
    and the golden answer, and so does an episode whose turns are too short for a query to run (no search
    executed: the demonstrations of a tiny test env still end with the answer).

    The upper bound of every table, and the source of token-level demonstrations for supervised
    warm-start. It reads the question's gold data from the dataset, so it needs the env's dataset and split.
    Given the env's retriever (:meth:`from_env` does that), its queries are checked to retrieve the
    passages (see :func:`oracle_turns`); without one it searches the bare titles.

    ``OracleAgent(env)`` is :meth:`from_env`: the env (wrapped or not) gives every argument.

    Args:
        dataset: The env's dataset (``env.unwrapped.dataset``), or the env itself.
        split: The env's split (required with a dataset).
        tokenizer: The env's tokenizer (required with a dataset).
        max_turns: The env's turn budget.
        retriever: The env's retriever, to pin each supporting passage with its query (optional).
        topk: The env's passages per search.
    """

    name = "oracle"
    evidence_only = True
    """Answer :data:`NO_EVIDENCE` when its searches did not retrieve every gold passage."""

    def __init__(
        self,
        dataset: Dataset | gym.Env[Any, Any],
        split: str | None = None,
        tokenizer: Tokenizer | None = None,
        max_turns: int = EnvSpec.max_turns,
        retriever: Retriever | None = None,
        topk: int = EnvSpec.topk,
    ) -> None:
        if isinstance(dataset, gym.Env):  # OracleAgent(env), as every agent is built: the env gives the rest
            base: Any = dataset.unwrapped
            dataset, split, tokenizer, retriever = base.dataset, base.split, base.tokenizer, base.retriever
            max_turns, topk = base.env_spec.max_turns, base.env_spec.topk
        if not isinstance(dataset, Dataset) or split is None or tokenizer is None:
            raise TypeError(f"{type(self).__name__} needs an env, or a dataset with its split and tokenizer")
        self.dataset: Dataset = dataset
        self.split = split
        self.tokenizer = tokenizer
        self.max_turns = max_turns
        self.retriever = retriever
        self.topk = topk
        self._turns: list[list[int]] = []
        self._pos = 0

    @classmethod
    def from_env(cls, env: gym.Env[Any, Any]) -> OracleAgent:  # type: ignore[override]
        """The oracle for a SearchQA env (wrapped or not), with its retriever, turn budget and top-k."""
        return cls(env)

    def reset(self, info: dict[str, Any], seed: int | None = None) -> None:
        texts = oracle_turns(
            self.dataset, info["question_id"], self.split, self.max_turns, self.retriever, self.topk
        )
        self._turns = [self.tokenizer.encode(t) for t in texts]
        self._pos = 0

    def act(self, observation: Observation, info: dict[str, Any]) -> int:
        if info.get("turn_end") and self._pos > 0:
            # The env closed the turn: move on, even if it closed before the script expected.
            self._turns.pop(0)
            self._pos = 0
            searched = int(info.get("searches", 0)) > 0
            if (
                self.evidence_only
                and searched
                and len(self._turns) == 1
                and info.get("gold_all_retrieved") is False
            ):
                # Its searches ran and did not bring every gold passage: it answers only what it found.
                self._turns[0] = self.tokenizer.encode(f"<answer> {NO_EVIDENCE} </answer>")
        if not self._turns:
            eos = self.tokenizer.eos_token_id
            return int(eos if eos is not None else 0)
        turn = self._turns[0]
        if self._pos >= len(turn):  # the env did not stop at the end of the script's turn
            self._turns.pop(0)
            self._pos = 0
            return self.act(observation, {})
        token = turn[self._pos]
        self._pos += 1
        return token


class ShortcutAgent(OracleAgent):
    """The shortcut teacher (:func:`shortcut_turns`) on bridge questions, the oracle everywhere else.

    A demonstrator with designed headroom: imitating it gives a policy that answers bridge questions after
    one hop, wrongly, while the episode allows the second hop that the oracle's demonstrations show. After
    each ``reset``, :attr:`took_shortcut` says which of the two played. Arguments as :class:`OracleAgent`.
    """

    name = "shortcut"
    took_shortcut = False

    def reset(self, info: dict[str, Any], seed: int | None = None) -> None:
        texts = shortcut_turns(self.dataset, info["question_id"], self.split, self.retriever, self.topk)
        self.took_shortcut = texts is not None
        self.evidence_only = texts is None  # the shortcut answers its bridge entity whatever it found
        if texts is None:
            super().reset(info, seed)
            return
        self._turns = [self.tokenizer.encode(t) for t in texts]
        self._pos = 0


class MacroOracleAgent(Agent):
    """The best the macro view allows: answers a golden answer once a slot holds one, else searches gold titles.

    Reads the gold data of the question, like :class:`~searchgym.agents.scripted.OracleAgent`; it measures
    whether the candidates cover the answers (the ceiling of any macro-view policy).

    Args:
        env: A ``SearchQAMacro-v0`` env (wrapped or not).
    """

    name = "macro-oracle"

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        self.env = env.unwrapped
        if not hasattr(self.env, "action_for"):
            raise ConfigError("MacroOracleAgent needs the SearchQAMacro-v0 env")

    def act(self, observation: Any, info: dict[str, Any]) -> int:
        env: Any = self.env
        question = env.episode.question
        for gold in question.golden_answers:
            action = env.action_for(gold, "answer")
            if action is not None:
                return int(action)
        searched = {normalize_answer(q) for q in env.episode.queries}
        for pid in question.supporting_ids:
            if pid not in env.dataset.passage_index:
                continue
            title = env.dataset.passage_index[pid].title
            action = env.action_for(title, "search")
            if normalize_answer(title) not in searched and action is not None:
                return int(action)
        # No gold in reach: search the question once, then answer the first slot.
        return 0 if not searched else int(env.n_queries)
