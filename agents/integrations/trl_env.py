"""SearchQA as an environment for TRL's ``environment_factory``: tool calls instead of Search-R1's tags.

TRL's ``GRPOTrainer(environment_factory=...)`` trains tool-calling chat models without a rollout function:
the model calls the environment's public methods as tools through its chat template, and TRL masks the
tool results out of the loss. :class:`SearchQAToolEnv` puts a searchgym question behind that interface,
with the same datasets, the same retriever (built once per process and shared by every instance), the same
passage text (Search-R1's ``Doc i(Title: …)`` block) and the same answer metrics as ``SearchQA-v0``.

The contract, read from TRL 1.16.0 (``trl/trainer/grpo_trainer.py``):

* the factory is called with no argument, once per rollout running at the same time; instances are
  pooled and reset between rollouts (:meth:`SearchQAToolEnv.factory` binds the settings);
* ``reset(**row)`` receives the dataset row's columns and returns a string that TRL appends to the last
  user message of the row's prompt;
* every public method other than ``reset`` and ``get_reward`` is a tool: its name, type hints and
  Google-style docstring become the tool's schema, and an exception becomes ``{"error": ...}`` for the
  model;
* ``get_reward()``, with no argument, scores the finished rollout (logged under the class name); then
  ``reward_funcs`` may be omitted.

What differs from the token-level env, by the nature of tool calling: the transcript is rendered by the
model's chat template (TRL tokenises the tool results), so it is not token-exact in searchgym's sense, and
the turn budget is TRL's ``max_tool_calling_iterations`` plus this env's ``max_searches``. For Search-R1's
tags and token-exact transcripts, use :class:`~searchgym.agents.integrations.trl.SearchQARollout`.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

from searchgym.data import Dataset, Question, load_dataset
from searchgym.errors import ConfigError, EpisodeFinishedError, UnknownQuestionError
from searchgym.protocol import format_documents
from searchgym.retrieval.base import Retriever
from searchgym.rewards import exact_match, f1_score, get_metric

__all__ = ["TOOL_INSTRUCTION", "SearchQAToolEnv", "tool_env_dataset"]

TOOL_INSTRUCTION = (
    "Answer the given question. You can call the search tool to look up passages in a knowledge base, as "
    "often as you need. When you know the answer, call the answer tool with the answer only, without "
    "detailed explanations. Question: {question}"
)
"""The user message :meth:`SearchQAToolEnv.reset` returns (Search-R1's instruction, for tools)."""

_LOCK = threading.Lock()
# (dataset spec, world seed, retriever spec, patience) -> (dataset, retriever): built once per process.
_SHARED: dict[tuple[str, int, str, float], tuple[Dataset, Retriever]] = {}


def _shared(dataset: Any, world_seed: int, retriever: Any, patience: float) -> tuple[Dataset, Retriever]:
    """The dataset and its retriever for these settings, shared by every instance of the process."""
    from searchgym.retrieval.leases import acquire_retriever

    if not isinstance(retriever, str | None):
        raise ConfigError("SearchQAToolEnv takes a retriever name or URL (instances are built by TRL)")
    key = (str(dataset), world_seed, str(retriever), float(patience))
    with _LOCK:
        if key not in _SHARED:
            data = load_dataset(dataset, world_seed=world_seed)
            # Held for the life of the process: TRL creates and drops instances at will.
            found, _ = acquire_retriever(data, retriever, patience)
            _SHARED[key] = (data, found)
        return _SHARED[key]


class SearchQAToolEnv:
    """One SearchQA question at a time, with a ``search`` tool, an ``answer`` tool and a reward.

    Args:
        dataset: A FlashRAG folder, a Search-R1 parquet folder, or ``None`` for the generated world.
        world_seed: Seed of the generated world (ignored with ``dataset``).
        split: The split whose questions are asked.
        retriever: Retriever backend name or ``/retrieve`` URL (as ``SearchQA-v0``).
        retriever_patience: Seconds to wait for a URL retriever that stops answering (as ``SearchQA-v0``).
        topk: Passages per search.
        max_searches: Searches allowed per question; then ``search`` answers with an error.
        max_passage_words: Cut each passage's text to this many words (``None``: no cut).
        reward: The answer metric: ``"em"``, ``"subem"`` or ``"f1"``.
        seed: Seed of the question draw when a row names no question.

    Attributes:
        question: The current question (after :meth:`reset`).
        queries: The searches made so far.
        hit_ids: The passage ids each search returned.
        given_answer: The answer given through the ``answer`` tool, or ``None``.
    """

    def __init__(
        self,
        dataset: Any = None,
        *,
        world_seed: int = 0,
        split: str = "train",
        retriever: str | None = "bm25",
        retriever_patience: float = 0.0,
        topk: int = 3,
        max_searches: int = 4,
        max_passage_words: int | None = None,
        reward: str = "em",
        seed: int = 0,
    ) -> None:
        if topk < 1 or max_searches < 0:
            raise ConfigError(f"topk must be >= 1 and max_searches >= 0, got {topk} and {max_searches}")
        self._metric = get_metric(reward)
        self._data, self._retriever = _shared(dataset, world_seed, retriever, retriever_patience)
        self._questions = self._data.questions(split)
        if not self._questions:
            raise ConfigError(f"split {split!r} of {self._data.name!r} has no questions")
        self._by_id = {q.id: q for q in self._questions}
        self._rng = random.Random(seed)
        self._topk = topk
        self._max_searches = max_searches
        self._max_passage_words = max_passage_words
        self.question: Question | None = None
        self.queries: list[str] = []
        self.hit_ids: list[list[str]] = []
        self.given_answer: str | None = None

    @classmethod
    def factory(cls, **kwargs: Any) -> Callable[[], SearchQAToolEnv]:
        """A no-argument callable for ``GRPOTrainer(environment_factory=...)`` with these settings."""
        # Built once here, so that a bad setting fails when the factory is made, not inside TRL.
        cls(**kwargs)

        def make() -> SearchQAToolEnv:
            return cls(**kwargs)

        return make

    def reset(self, question_id: str | None = None, **_: Any) -> str:
        """Starts a question: the row's ``question_id``, else one drawn at random. Returns the user message.

        Raises:
            UnknownQuestionError: ``question_id`` is not in the split.
        """
        if question_id is None:
            self.question = self._rng.choice(self._questions)
        elif question_id in self._by_id:
            self.question = self._by_id[question_id]
        else:
            raise UnknownQuestionError(f"question {question_id!r} is not in this split")
        self.queries, self.hit_ids, self.given_answer = [], [], None
        text = self.question.question.strip()
        if text and not text.endswith("?"):
            text += "?"
        return TOOL_INSTRUCTION.format(question=text)

    def search(self, query: str) -> str:
        """Searches the knowledge base for passages about a query.

        Args:
            query: What to look for, e.g. a name or a short phrase.

        Returns:
            The best passages, each as "Doc i(Title: title) text".
        """
        if self.given_answer is not None:
            raise EpisodeFinishedError("the question is already answered")
        if len(self.queries) >= self._max_searches:
            raise EpisodeFinishedError(f"no searches left ({self._max_searches} allowed): call answer")
        hits = self._retriever.search([query], self._topk)[0]
        self.queries.append(query)
        self.hit_ids.append([h.passage_id for h in hits])
        return format_documents([h.contents for h in hits], self._max_passage_words).strip()

    def answer(self, answer: str) -> str:
        """Gives the final answer to the question. Call it once, at the end.

        Args:
            answer: The answer only, a few words, without explanation.

        Returns:
            A confirmation.
        """
        if self.given_answer is not None:
            raise EpisodeFinishedError("the question is already answered")
        self.given_answer = answer
        return "Answer recorded."

    def get_reward(self) -> float:
        """The answer metric of the given answer against the golden answers (0 without an answer)."""
        if self.question is None or self.given_answer is None:
            return 0.0
        return float(self._metric(self.given_answer, self.question.golden_answers))

    @property
    def info(self) -> dict[str, Any]:
        """The rollout's question, answer, EM, F1 and searches (a property: TRL exposes no tool for it)."""
        golden = self.question.golden_answers if self.question is not None else []
        given = self.given_answer
        return {
            "question_id": self.question.id if self.question is not None else None,
            "answer": given,
            "golden_answers": list(golden),
            "em": float(exact_match(given, golden)) if given is not None else 0.0,
            "f1": float(f1_score(given, golden)) if given is not None else 0.0,
            "searches": len(self.queries),
        }


def tool_env_dataset(
    dataset: Any = None, *, world_seed: int = 0, split: str = "train", limit: int | None = None
) -> Any:
    """A ``datasets.Dataset`` for :class:`SearchQAToolEnv`: ``prompt`` an empty user turn, ``question_id``.

    The environment's ``reset`` supplies the user message (instruction and question); TRL appends it to
    the empty turn. Needs the ``datasets`` package (installed with TRL).
    """
    import datasets

    questions = load_dataset(dataset, world_seed=world_seed).questions(split)[:limit]
    return datasets.Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": ""}] for _ in questions],
            "question_id": [q.id for q in questions],
        }
    )
