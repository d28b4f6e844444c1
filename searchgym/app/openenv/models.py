"""The typed messages of the OpenEnv SearchQA environment: its action, observation and state.

They are OpenEnv's pydantic models (``openenv.core.env_server.types``), shared by the server
(:mod:`searchgym.app.openenv.environment`) and the client (:mod:`searchgym.app.openenv.client`).
"""

from __future__ import annotations

from typing import Literal

from openenv.core.env_server.types import Action, Observation, State  # type: ignore[import-untyped]
from pydantic import Field

__all__ = ["SearchQAAction", "SearchQAObservation", "SearchQAState"]


class SearchQAAction(Action):
    """One turn: a search of the knowledge base, or the final answer (which ends the episode).

    Build one with :meth:`search` or :meth:`answer`.
    """

    tool: Literal["search", "answer"] = Field(description="search: look up passages; answer: end the episode")
    text: str = Field(description="the query of a search, or the answer")

    @classmethod
    def search(cls, query: str) -> SearchQAAction:
        """A search for ``query``."""
        return cls(tool="search", text=query)

    @classmethod
    def answer(cls, text: str) -> SearchQAAction:
        """The final answer ``text``."""
        return cls(tool="answer", text=text)


class SearchQAObservation(Observation):
    """What the agent sees after a reset or a turn; ``reward`` and ``done`` are OpenEnv's own fields.

    ``reward`` is ``None`` after a reset, 0 after a turn that does not end the episode, and the answer metric
    (exact match by default) of the given answer when the episode ends (0 without an answer). When the
    episode ends, ``metadata`` holds the question's golden answers, EM, F1, the searches and ``end_reason``.
    """

    text: str = Field(
        default="",
        description="for the model: the instruction and question after a reset, the passages after a search, "
        "a confirmation after the answer, the reason after a refused turn",
    )
    question: str = Field(default="", description="the question being asked")
    question_id: str = Field(default="", description="its id in the split")
    passage_ids: list[str] = Field(default_factory=list, description="the passages this search returned")
    turn: int = Field(default=0, ge=0, description="turns taken in this episode")
    turns_left: int = Field(default=0, ge=0, description="turns the budget still allows")
    error: str | None = Field(
        default=None, description="why this turn was refused (a search when none is left); the turn is spent"
    )


class SearchQAState(State):
    """The episode as the server holds it (``episode_id`` and ``step_count`` are OpenEnv's own fields)."""

    question_id: str | None = Field(
        default=None, description="the question's id; None before the first reset"
    )
    split: str = Field(default="", description="the split the questions come from")
    queries: list[str] = Field(default_factory=list, description="the searches made so far")
    hit_ids: list[list[str]] = Field(default_factory=list, description="the passage ids of each search")
    answer: str | None = Field(default=None, description="the answer given, if any")
    done: bool = Field(default=False, description="whether the episode has ended")
    reward: float | None = Field(default=None, description="the episode's reward once it has ended")
