"""The server side: SearchQA turns behind OpenEnv's ``Environment`` interface.

An episode is :class:`~searchgym.envs.messages.SearchQAMessages`'s (the message-level view the TRL tool env
and the ``verifiers`` environment share), one :meth:`~searchgym.envs.messages.SearchQAMessages.play` turn
per ``step``: the same settings (an :class:`~searchgym.envs.EnvSpec`, every field accepted; the fields of
:data:`~searchgym.envs.messages.NOT_APPLIED` change nothing), datasets, retriever (built once per process and
shared by every session), passage text (Search-R1's ``Doc i(Title: …)`` block), turn budget and answer
metric. What this module adds is OpenEnv's contract: typed actions and observations, seeding on ``reset``,
and a state for ``/state``.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment  # type: ignore[import-untyped]
from openenv.core.env_server.types import EnvironmentMetadata  # type: ignore[import-untyped]

from searchgym import __version__
from searchgym.envs.messages import SearchQAMessages
from searchgym.envs.spec import EnvSpec, make_spec
from searchgym.errors import ConfigError, EpisodeFinishedError

from .models import SearchQAAction, SearchQAObservation, SearchQAState

__all__ = ["SearchQAEnvironment"]


class SearchQAEnvironment(Environment[SearchQAAction, SearchQAObservation, SearchQAState]):
    """SearchQA episodes with a ``search`` action and an ``answer`` action; the reward is the answer metric.

    ``reset(seed=None, episode_id=None, question_id=None)`` starts a question: ``question_id`` pins one of
    the split (how a GRPO group shares its question), otherwise one is drawn from the session's generator,
    which ``seed`` reseeds. ``step`` takes one :class:`SearchQAAction`: a search returns passages, an answer
    ends the episode with its reward. Each session has its own instance; they share the dataset and the
    retriever, which are read-only.

    Args:
        spec: The settings of the episodes (default: :class:`~searchgym.envs.EnvSpec`'s: the generated
            world's ``train`` split, BM25, top 3, 4 turns, EM). ``max_turns`` counts the answer: at most
            ``max_turns - 1`` searches, and an episode whose last turn does not answer ends with reward 0.
        seed: Seed of the question draw of a session until a ``reset(seed=...)`` reseeds it.
        **fields: :class:`~searchgym.envs.EnvSpec` fields changed from ``spec`` (e.g. ``topk=5``).

    Raises:
        ConfigError: an unknown field (the valid ones are listed) or an invalid value.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, spec: EnvSpec | None = None, *, seed: int = 0, **fields: Any) -> None:
        super().__init__()
        self.spec = make_spec(spec, fields)
        self._tool = SearchQAMessages(self.spec, seed=seed)
        self._state = SearchQAState(split=self.spec.split)

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        question_id: str | None = None,
        **kwargs: Any,
    ) -> SearchQAObservation:
        """Starts an episode; returns the instruction and question.

        Raises:
            ConfigError: an unknown keyword (the valid ones are named).
            UnknownQuestionError: ``question_id`` is not in the split.
        """
        if kwargs:
            raise ConfigError(
                f"unknown reset options {sorted(kwargs)}; SearchQA takes seed, episode_id and question_id"
            )
        prompt = self._tool.reset(question_id, seed=seed)
        assert self._tool.question is not None
        self._state = SearchQAState(
            episode_id=episode_id or str(uuid4()), question_id=self._tool.question.id, split=self.spec.split
        )
        return self._observation(prompt, passage_ids=[], error=None, reward=None)

    def step(
        self, action: SearchQAAction, timeout_s: float | None = None, **kwargs: Any
    ) -> SearchQAObservation:
        """Plays one turn.

        A search when none is left is refused: the observation carries the reason in ``error`` and the turn
        is spent (on the last turn only an answer is accepted).

        Raises:
            EpisodeFinishedError: no episode is running (before the first reset, or after the end).
        """
        state = self._state
        if state.question_id is None or state.done:
            raise EpisodeFinishedError("no episode is running: call reset")
        turn = self._tool.play(action.tool, action.text)
        state.step_count = self._tool.turns
        state.queries = list(self._tool.queries)
        state.hit_ids = [list(ids) for ids in self._tool.hit_ids]
        state.answer = self._tool.given_answer
        state.done = turn.done
        if turn.done:
            state.reward = turn.reward
        return self._observation(
            turn.text, passage_ids=turn.passage_ids, error=turn.error, reward=turn.reward
        )

    @property
    def state(self) -> SearchQAState:
        """The current episode (a copy: the server serialises it after this call returns)."""
        return self._state.model_copy(deep=True)

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="SearchQA",
            description="Search-R1-style question answering: search a knowledge base, then answer; the reward "
            f"is the answer's {self.spec.reward} against the golden answers",
            version=__version__,
        )

    def _observation(
        self, text: str, *, passage_ids: list[str], error: str | None, reward: float | None
    ) -> SearchQAObservation:
        state = self._state
        question = self._tool.question
        assert question is not None  # reset has run
        metadata: dict[str, Any] = {}
        if state.done:
            metadata = {**self._tool.info, "end_reason": self._tool.end_reason}
        return SearchQAObservation(
            text=text,
            question=question.question,
            question_id=question.id,
            passage_ids=passage_ids,
            turn=state.step_count,
            turns_left=self.spec.max_turns - state.step_count,
            error=error,
            done=state.done,
            reward=reward,
            metadata=metadata,
        )
