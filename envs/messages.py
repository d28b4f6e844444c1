"""SearchQA at the message level: two tools, ``search(query)`` and ``answer(text)``, one episode per question.

The token-level ``SearchQA-v0`` parses ``<search>`` and ``<answer>`` tags from the policy's tokens; tool-calling
front ends (TRL's ``environment_factory``, the OpenEnv server, the ``verifiers`` environment) receive the
calls already parsed. :class:`SearchQAMessages` is the one implementation they share: the same datasets,
retriever (built once per process and shared), seeded retriever faults, passage text (Search-R1's
``Doc i(Title: …)`` block), turn budget and answer metric as ``SearchQA-v0``, on an
:class:`~searchgym.envs.EnvSpec`.

Two ways to play an episode:

* :meth:`SearchQAMessages.play` is a whole turn with ``SearchQA-v0``'s rules: ``max_turns`` turns, the
  answer included; a turn that calls no tool (a malformed call) gets the env's corrective message and is
  spent (so is a search with an empty query); the last turn must answer (a search there is refused and the episode ends at the budget with
  reward 0); an answer ends the episode with the metric as reward. The OpenEnv server and the ``verifiers``
  environment play this way.
* :meth:`SearchQAMessages.search` and :meth:`SearchQAMessages.answer` are the bare tool calls, for a trainer
  that runs the conversation loop itself (TRL): ``max_turns - 1`` searches, then ``search`` raises; a search
  with an empty query raises too (where :meth:`SearchQAMessages.play` and ``SearchQA-v0`` read it as a turn
  that calls no tool, it runs no retrieval); a refused call spends nothing.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from searchgym.data import Dataset, Question, load_dataset
from searchgym.envs.search_qa import fault_rng
from searchgym.envs.spec import EnvSpec, make_spec
from searchgym.errors import (
    ConfigError,
    EpisodeFinishedError,
    InvalidActionError,
    RetrieverError,
    UnknownQuestionError,
)
from searchgym.protocol import INVALID_TURN_MESSAGE, format_documents, format_search_failure
from searchgym.retrieval.base import Retriever
from searchgym.retrieval.faults import FaultyRetriever
from searchgym.rewards import exact_match, f1_score, get_metric

__all__ = [
    "NOT_APPLIED",
    "NO_TOOL_MESSAGE",
    "TOOLS",
    "TOOL_INSTRUCTION",
    "MessageTurn",
    "SearchQAMessages",
]

TOOLS = ("search", "answer")
"""The tools an agent sees, in this order: nothing else (task discovery, state) is a tool."""

NOT_APPLIED = ("max_turn_tokens", "max_context_tokens", "max_obs_tokens", "prompt_style")
"""The :class:`~searchgym.envs.EnvSpec` fields a message-level episode has no use for: its transcript is
rendered and tokenised by the trainer through the model's chat template, so the token budgets are the
trainer's settings (TRL's ``max_completion_length``, verl's ``response_length``) and the prompt is always a
chat message. They are accepted (a spec shared with ``SearchQA-v0`` builds every front end) and change
nothing."""

TOOL_INSTRUCTION = (
    "Answer the given question. You can call the search tool to look up passages in a knowledge base, as "
    "often as you need. When you know the answer, call the answer tool with the answer only, without "
    "detailed explanations. Question: {question}"
)
"""The user message :meth:`SearchQAMessages.reset` returns (Search-R1's instruction, for tools)."""

NO_TOOL_MESSAGE = INVALID_TURN_MESSAGE.strip()
"""What a turn that calls no tool gets back: ``SearchQA-v0``'s corrective message for an invalid turn."""

_LOCK = threading.Lock()
# (dataset, world seed, retriever, patience) -> (dataset, retriever): built once per process.
_SHARED: dict[tuple[str, int, str, float], tuple[Dataset, Retriever]] = {}


def shared_parts(spec: EnvSpec) -> tuple[Dataset, Retriever]:
    """The dataset and its retriever of ``spec``, shared by every message-level episode of the process.

    Raises:
        ConfigError: the retriever is an object (front ends build their episodes themselves, so it must be
            a name or a URL), or the dataset or retriever cannot be built.
    """
    from searchgym.retrieval.leases import acquire_retriever

    if not isinstance(spec.retriever, str | None):
        raise ConfigError(
            "a message-level SearchQA takes a retriever name or URL (front ends build episodes)"
        )
    key = (str(spec.dataset), spec.world_seed, str(spec.retriever), spec.retriever_patience)
    with _LOCK:
        if key not in _SHARED:
            data = load_dataset(spec.dataset, world_seed=spec.world_seed)
            # Held for the life of the process: trainers create and drop episodes at will.
            found, _ = acquire_retriever(data, spec.retriever, spec.retriever_patience)
            _SHARED[key] = (data, found)
        return _SHARED[key]


@dataclass
class MessageTurn:
    """What one :meth:`SearchQAMessages.play` turn returns.

    Attributes:
        text: For the model: the passages after a search, a confirmation after the answer, the corrective
            message after a turn that called no tool, the reason after a refused search.
        done: Whether the episode has ended.
        reward: 0 until the episode ends, then the answer metric (0 without an answer).
        end_reason: ``"answered"`` or ``"turn_budget"`` once the episode has ended, else ``None``.
        passage_ids: The passages this search returned (empty otherwise).
        error: Why the turn was refused (a search on the last turn), else ``None``.
    """

    text: str
    done: bool
    reward: float
    end_reason: str | None
    passage_ids: list[str] = field(default_factory=list)
    error: str | None = None


class SearchQAMessages:
    """One SearchQA question at a time, with a ``search`` tool, an ``answer`` tool and a reward.

    Args:
        spec: The episode's settings (default: :class:`~searchgym.envs.EnvSpec`'s defaults), as
            ``SearchQA-v0`` takes them: the dataset, world seed and split asked from; the retriever, its
            patience and injected faults (their generator seeded by the faults' ``seed`` and reseeded by
            ``reset(seed=...)``, as ``SearchQA-v0``'s); ``on_retrieval_error`` (``"observe"``: a failed
            search answers ``Search failed: …``, else it raises); ``topk`` passages per search, each cut to
            ``max_passage_words``; ``max_turns`` turns, the answer included; the ``reward`` metric; and
            ``append_question_mark``. The fields of :data:`NOT_APPLIED` change nothing.
        seed: Seed of the question draw when :meth:`reset` names no question.
        **fields: :class:`~searchgym.envs.EnvSpec` fields changed from ``spec`` (e.g. ``topk=5``).

    Raises:
        ConfigError: an unknown field (the valid ones are listed), an invalid value, or a split without
            questions.

    Attributes:
        spec: The settings, checked.
        retriever: What searches ask (the shared retriever, behind the faults when the spec injects some).
        questions: The split's questions.
        by_id: The split's questions by id.
        question: The current question (after :meth:`reset`).
        queries: The searches made so far.
        hit_ids: The passage ids each search returned (``[]`` for a failed one).
        given_answer: The answer given, or ``None``.
        turns: Turns played through :meth:`play`.
        end_reason: Why the episode ended (``"answered"``, ``"turn_budget"``), ``None`` while it runs.
    """

    def __init__(self, spec: EnvSpec | None = None, *, seed: int = 0, **fields: Any) -> None:
        self.spec = make_spec(spec, fields)
        self._metric = get_metric(self.spec.reward)
        self.dataset, retriever = shared_parts(self.spec)
        self.retriever: Retriever = retriever
        if self.spec.retriever_faults is not None:
            self.retriever = FaultyRetriever(retriever, self.spec.retriever_faults, self.dataset.passages)
        self.questions: list[Question] = self.dataset.questions(self.spec.split)
        if not self.questions:
            raise ConfigError(f"split {self.spec.split!r} of {self.dataset.name!r} has no questions")
        self.by_id = {q.id: q for q in self.questions}
        self._rng = random.Random(seed)
        self.question: Question | None = None
        self.queries: list[str] = []
        self.hit_ids: list[list[str]] = []
        self.given_answer: str | None = None
        self.turns = 0
        self.end_reason: str | None = None

    @property
    def max_searches(self) -> int:
        """Searches allowed per question: every turn but the answer's."""
        return self.spec.max_turns - 1

    @property
    def done(self) -> bool:
        """Whether the episode has ended (answered, or out of turns)."""
        return self.end_reason is not None

    # -- the episode ---------------------------------------------------------------------------------------

    def reset(self, question_id: str | None = None, *, seed: int | None = None) -> str:
        """Starts a question: ``question_id``, else one drawn at random. Returns the user message.

        Args:
            question_id: The question's id in the split.
            seed: Reseeds the question draw and the retriever faults' generator (as ``SearchQA-v0``'s
                ``reset(seed=...)`` does).

        Raises:
            UnknownQuestionError: ``question_id`` is not in the split.
        """
        if seed is not None:
            self._rng = random.Random(seed)
            if isinstance(self.retriever, FaultyRetriever) and self.spec.retriever_faults is not None:
                self.retriever.rng = fault_rng(self.spec.retriever_faults, seed)
        if question_id is None:
            question = self._rng.choice(self.questions)
        elif question_id in self.by_id:
            question = self.by_id[question_id]
        else:
            raise UnknownQuestionError(f"question {question_id!r} is not in this split")
        self.question = question
        self.queries, self.hit_ids, self.given_answer = [], [], None
        self.turns, self.end_reason = 0, None
        return self.prompt(question)

    def prompt(self, question: Question) -> str:
        """The user message of ``question``: the instruction and the question."""
        text = question.question.strip()
        if self.spec.append_question_mark and text and not text.endswith("?"):
            text += "?"
        return TOOL_INSTRUCTION.format(question=text)

    def search(self, query: str) -> str:
        """The ``search`` tool: the best passages for ``query``, as Search-R1's ``<information>`` block.

        Raises:
            EpisodeFinishedError: the question is already answered, or no searches are left.
            InvalidActionError: the query is empty or blank (no retrieval is run; nothing is spent).
            RetrieverError: the retrieval failed and ``on_retrieval_error`` is ``"raise"``.
        """
        if self.given_answer is not None:
            raise EpisodeFinishedError("the question is already answered")
        if not query.strip():
            raise InvalidActionError("the query is empty: search needs words to look for")
        if len(self.queries) >= self.max_searches:
            raise EpisodeFinishedError(f"no searches left ({self.max_searches} allowed): call answer")
        try:
            hits = self.retriever.search([query], self.spec.topk)[0]
            text = format_documents([h.contents for h in hits], self.spec.max_passage_words)
        except RetrieverError as e:
            if self.spec.on_retrieval_error == "raise":
                raise
            hits, text = [], format_search_failure(str(e))
        self.queries.append(query)
        self.hit_ids.append([h.passage_id for h in hits])
        return text.strip()

    def answer(self, text: str) -> str:
        """The ``answer`` tool: records the final answer.

        Raises:
            EpisodeFinishedError: the question is already answered.
        """
        if self.given_answer is not None:
            raise EpisodeFinishedError("the question is already answered")
        self.given_answer = text
        return "Answer recorded."

    def play(self, tool: Literal["search", "answer"] | None, text: str = "") -> MessageTurn:
        """Plays one turn with ``SearchQA-v0``'s rules (see the module's docstring).

        Args:
            tool: ``"search"``, ``"answer"``, or ``None`` for a turn that called no tool.
            text: The query, the answer, or what the model wrote instead of a call.

        Raises:
            EpisodeFinishedError: no episode is running (before the first reset, or after the end).
            ConfigError: ``tool`` is not one of :data:`TOOLS` or ``None``.
        """
        if self.question is None or self.done:
            raise EpisodeFinishedError("no episode is running: call reset")
        if tool is not None and tool not in TOOLS:
            raise ConfigError(f"unknown tool {tool!r}; the tools are {list(TOOLS)}")
        self.turns += 1
        last_turn = self.turns >= self.spec.max_turns
        passage_ids: list[str] = []
        error = None
        if tool == "search" and not text.strip():  # an empty query is an invalid turn, as in SearchQA-v0
            tool = None
        if tool == "answer":
            reply = self.answer(text)
            self.end_reason = "answered"
        elif tool == "search" and last_turn:  # the last turn must answer: a search there is not run
            reply = error = f"no searches left ({self.max_searches} allowed): call answer"
        elif tool == "search":
            reply = self.search(text)
            passage_ids = list(self.hit_ids[-1])
        else:
            reply = NO_TOOL_MESSAGE
        if self.end_reason is None and last_turn:
            self.end_reason = "turn_budget"
        reward = self.reward() if self.done else 0.0
        return MessageTurn(reply, self.done, reward, self.end_reason, passage_ids, error)

    def reward(self) -> float:
        """The answer metric of the given answer against the golden answers (0 without an answer)."""
        if self.question is None or self.given_answer is None:
            return 0.0
        return float(self._metric(self.given_answer, self.question.golden_answers))

    @property
    def info(self) -> dict[str, Any]:
        """The episode's question, answer, golden answers, EM, F1 and searches."""
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
