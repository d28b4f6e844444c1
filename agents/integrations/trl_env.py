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

The settings are an :class:`~searchgym.envs.EnvSpec`, the env's own: every field is accepted, by the same
rule as ``SearchQAEnv(spec, **fields)``. What differs from the token-level env, by the nature of tool
calling: the transcript is rendered by the model's chat template (TRL tokenises the tool results), so it is
not token-exact in searchgym's sense; the episode's budget is ``max_turns`` tool turns, the answer included
(``max_turns - 1`` searches), within TRL's ``max_tool_calling_iterations``; and the fields of
:data:`NOT_APPLIED` (token budgets and the prompt's form, which TRL's own settings and the chat template
decide here) are held in :attr:`SearchQAToolEnv.spec` but change nothing. For Search-R1's tags and
token-exact transcripts, use :class:`~searchgym.agents.integrations.trl.SearchQARollout`.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

from searchgym.data import Dataset, Question, load_dataset
from searchgym.envs.spec import EnvSpec, make_spec
from searchgym.errors import ConfigError, EpisodeFinishedError, RetrieverError, UnknownQuestionError
from searchgym.protocol import format_documents, format_search_failure
from searchgym.retrieval.base import Retriever
from searchgym.retrieval.faults import FaultyRetriever
from searchgym.rewards import exact_match, f1_score, get_metric

__all__ = ["NOT_APPLIED", "TOOL_INSTRUCTION", "SearchQAToolEnv", "tool_env_dataset"]

NOT_APPLIED = ("max_turn_tokens", "max_context_tokens", "max_obs_tokens", "prompt_style")
"""The :class:`~searchgym.envs.EnvSpec` fields a tool-calling episode has no use for: its transcript is
rendered and tokenised by the trainer through the model's chat template, so the token budgets are the
trainer's settings (TRL's ``max_completion_length``, verl's ``response_length``) and the prompt is always a
chat message. They are accepted (a spec shared with ``SearchQA-v0`` builds every front end) and change
nothing."""

TOOL_INSTRUCTION = (
    "Answer the given question. You can call the search tool to look up passages in a knowledge base, as "
    "often as you need. When you know the answer, call the answer tool with the answer only, without "
    "detailed explanations. Question: {question}"
)
"""The user message :meth:`SearchQAToolEnv.reset` returns (Search-R1's instruction, for tools)."""

_LOCK = threading.Lock()
# (dataset, world seed, retriever, patience) -> (dataset, retriever): built once per process.
_SHARED: dict[tuple[str, int, str, float], tuple[Dataset, Retriever]] = {}


def _shared(spec: EnvSpec) -> tuple[Dataset, Retriever]:
    """The dataset and its retriever of ``spec``, shared by every instance of the process."""
    from searchgym.retrieval.leases import acquire_retriever

    if not isinstance(spec.retriever, str | None):
        raise ConfigError("SearchQAToolEnv takes a retriever name or URL (instances are built by TRL)")
    key = (str(spec.dataset), spec.world_seed, str(spec.retriever), spec.retriever_patience)
    with _LOCK:
        if key not in _SHARED:
            data = load_dataset(spec.dataset, world_seed=spec.world_seed)
            # Held for the life of the process: TRL creates and drops instances at will.
            found, _ = acquire_retriever(data, spec.retriever, spec.retriever_patience)
            _SHARED[key] = (data, found)
        return _SHARED[key]


class SearchQAToolEnv:
    """One SearchQA question at a time, with a ``search`` tool, an ``answer`` tool and a reward.

    Args:
        spec: The episode's settings (default: :class:`~searchgym.envs.EnvSpec`'s defaults), as
            ``SearchQA-v0`` takes them: the dataset, world seed and split asked from; the retriever, its
            patience and injected faults (one fault generator per instance, seeded by the faults' ``seed``);
            ``on_retrieval_error`` (``"observe"``: a failed search answers ``Search failed: …``, else it
            raises, which TRL shows the model as an error); ``topk`` passages per search, each cut to
            ``max_passage_words``; ``max_turns`` tool turns, the answer included, so ``max_turns - 1``
            searches, then ``search`` answers with an error; the ``reward`` metric; and
            ``append_question_mark``. The fields of :data:`NOT_APPLIED` change nothing.
        seed: Seed of the question draw when a row names no question.
        **fields: :class:`~searchgym.envs.EnvSpec` fields changed from ``spec`` (e.g. ``topk=5``).

    Raises:
        ConfigError: an unknown field (the valid ones are listed), an invalid value, or a split without
            questions.

    Attributes:
        spec: The settings, checked.
        question: The current question (after :meth:`reset`).
        queries: The searches made so far.
        hit_ids: The passage ids each search returned.
        given_answer: The answer given through the ``answer`` tool, or ``None``.
    """

    def __init__(self, spec: EnvSpec | None = None, *, seed: int = 0, **fields: Any) -> None:
        self.spec = make_spec(spec, fields)
        self._metric = get_metric(self.spec.reward)
        self._data, self._retriever = _shared(self.spec)
        if self.spec.retriever_faults is not None:
            self._retriever = FaultyRetriever(
                self._retriever, self.spec.retriever_faults, self._data.passages
            )
        self._questions = self._data.questions(self.spec.split)
        if not self._questions:
            raise ConfigError(f"split {self.spec.split!r} of {self._data.name!r} has no questions")
        self._by_id = {q.id: q for q in self._questions}
        self._rng = random.Random(seed)
        self.question: Question | None = None
        self.queries: list[str] = []
        self.hit_ids: list[list[str]] = []
        self.given_answer: str | None = None

    @property
    def max_searches(self) -> int:
        """Searches allowed per question: every turn but the answer's."""
        return self.spec.max_turns - 1

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
        if self.spec.append_question_mark and text and not text.endswith("?"):
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
        if len(self.queries) >= self.max_searches:
            raise EpisodeFinishedError(f"no searches left ({self.max_searches} allowed): call answer")
        try:
            hits = self._retriever.search([query], self.spec.topk)[0]
            text = format_documents([h.contents for h in hits], self.spec.max_passage_words)
        except RetrieverError as e:
            if self.spec.on_retrieval_error == "raise":
                raise
            hits, text = [], format_search_failure(str(e))
        self.queries.append(query)
        self.hit_ids.append([h.passage_id for h in hits])
        return text.strip()

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


def tool_env_dataset(spec: EnvSpec | None = None, *, limit: int | None = None, **fields: Any) -> Any:
    """A ``datasets.Dataset`` for :class:`SearchQAToolEnv`: ``prompt`` an empty user turn, ``question_id``.

    The questions are the split of ``spec`` with ``fields`` changed (the same arguments as
    :class:`SearchQAToolEnv`'s; e.g. ``tool_env_dataset(dataset=FOLDER, split="test")``), the first ``limit``
    of them. The environment's ``reset`` supplies the user message (instruction and question); TRL appends
    it to the empty turn. Needs the ``datasets`` package (installed with TRL).
    """
    import datasets

    spec = make_spec(spec, fields)
    questions = load_dataset(spec.dataset, world_seed=spec.world_seed).questions(spec.split)[:limit]
    return datasets.Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": ""}] for _ in questions],
            "question_id": [q.id for q in questions],
        }
    )
