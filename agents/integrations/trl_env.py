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

from collections.abc import Callable
from typing import Any

from searchgym.data import Question, load_dataset
from searchgym.envs.messages import NOT_APPLIED, TOOL_INSTRUCTION, SearchQAMessages
from searchgym.envs.spec import EnvSpec, make_spec
from searchgym.retrieval.base import Retriever

__all__ = ["NOT_APPLIED", "TOOL_INSTRUCTION", "SearchQAToolEnv", "tool_env_dataset"]


class SearchQAToolEnv:
    """One SearchQA question at a time, with a ``search`` tool, an ``answer`` tool and a reward.

    The episode is :class:`~searchgym.envs.messages.SearchQAMessages`'s (the message-level view the OpenEnv
    server and the ``verifiers`` environment play too), through its bare tool calls: TRL runs the
    conversation, so a refused call raises (TRL shows the model the error) and spends nothing.

    Args:
        spec: The episode's settings (default: :class:`~searchgym.envs.EnvSpec`'s defaults), as
            ``SearchQA-v0`` takes them: the dataset, world seed and split asked from; the retriever, its
            patience and injected faults (one fault generator per instance, seeded by the faults' ``seed``);
            ``on_retrieval_error`` (``"observe"``: a failed search answers ``Search failed: …``, else it
            raises, which TRL shows the model as an error); ``topk`` passages per search, each cut to
            ``max_passage_words``; ``max_turns`` tool turns, the answer included, so ``max_turns - 1``
            searches, then ``search`` answers with an error (so does a search with an empty query, which
            ``SearchQA-v0`` reads as an invalid turn); the ``reward`` metric; and
            ``append_question_mark``. The fields of :data:`NOT_APPLIED` change nothing.
        seed: Seed of the question draw when a row names no question.
        **fields: :class:`~searchgym.envs.EnvSpec` fields changed from ``spec`` (e.g. ``topk=5``).

    Raises:
        ConfigError: an unknown field (the valid ones are listed), an invalid value, or a split without
            questions.

    Attributes:
        spec: The settings, checked.
        view: The message-level episode the tools play.
    """

    def __init__(self, spec: EnvSpec | None = None, *, seed: int = 0, **fields: Any) -> None:
        self.view = SearchQAMessages(spec, seed=seed, **fields)
        self.spec = self.view.spec

    # The episode's state, read from the view (TRL exposes no tool for it).
    @property
    def question(self) -> Question | None:
        """The current question (after :meth:`reset`)."""
        return self.view.question

    @property
    def queries(self) -> list[str]:
        """The searches made so far."""
        return self.view.queries

    @property
    def hit_ids(self) -> list[list[str]]:
        """The passage ids each search returned."""
        return self.view.hit_ids

    @property
    def given_answer(self) -> str | None:
        """The answer given through the ``answer`` tool, or ``None``."""
        return self.view.given_answer

    @property
    def _questions(self) -> list[Question]:
        return self.view.questions

    @property
    def _by_id(self) -> dict[str, Question]:
        return self.view.by_id

    @property
    def _retriever(self) -> Retriever:
        return self.view.retriever

    @_retriever.setter
    def _retriever(self, retriever: Retriever) -> None:
        self.view.retriever = retriever

    @property
    def max_searches(self) -> int:
        """Searches allowed per question: every turn but the answer's."""
        return self.view.max_searches

    @classmethod
    def factory(cls, **kwargs: Any) -> Callable[[], SearchQAToolEnv]:
        """A no-argument callable for ``GRPOTrainer(environment_factory=...)`` with these settings."""
        # Built once here, so that a bad setting fails when the factory is made, not inside TRL.
        cls(**kwargs)

        def make() -> SearchQAToolEnv:
            return cls(**kwargs)

        return make

    def reset(self, question_id: str | None = None, seed: int | None = None, **_: Any) -> str:
        """Starts a question: the row's ``question_id``, else one drawn at random. Returns the user message.

        A row's ``seed`` reseeds the question draw and the retriever faults, as ``SearchQA-v0``'s
        ``reset(seed=...)`` does.

        Raises:
            UnknownQuestionError: ``question_id`` is not in the split.
        """
        return self.view.reset(question_id, seed=seed)

    def search(self, query: str) -> str:
        """Searches the knowledge base for passages about a query.

        Args:
            query: What to look for, e.g. a name or a short phrase.

        Returns:
            The best passages, each as "Doc i(Title: title) text".
        """
        return self.view.search(query)

    def answer(self, answer: str) -> str:
        """Gives the final answer to the question. Call it once, at the end.

        Args:
            answer: The answer only, a few words, without explanation.

        Returns:
            A confirmation.
        """
        return self.view.answer(answer)

    def get_reward(self) -> float:
        """The answer metric of the given answer against the golden answers (0 without an answer)."""
        return self.view.reward()

    @property
    def info(self) -> dict[str, Any]:
        """The rollout's question, answer, EM, F1 and searches (a property: TRL exposes no tool for it)."""
        return self.view.info


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
