"""A SearchQA OpenEnv server as TRL's ``environment_factory``: each instance is one client session.

:class:`SearchQARemoteTools` has the contract of
:class:`~searchgym.agents.integrations.trl_env.SearchQAToolEnv` (``reset(**row)`` returns the user message,
the public methods ``search`` and ``answer`` are the model's tools, ``get_reward()`` scores the rollout),
but the episode runs on the server: the trainer needs no dataset or index, only the server's URL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from searchgym.errors import EpisodeFinishedError, InvalidActionError

from .client import SearchQAEnvClient
from .models import SearchQAAction, SearchQAObservation

__all__ = ["SearchQARemoteTools"]


class SearchQARemoteTools:
    """One session of a SearchQA OpenEnv server, with a ``search`` tool, an ``answer`` tool and a reward.

    Args:
        base_url: The server, e.g. ``http://127.0.0.1:8000``.
        message_timeout_s: Seconds to wait for each answer of the server.

    Attributes:
        observation: The last observation (``None`` before :meth:`reset`).
    """

    def __init__(self, base_url: str, *, message_timeout_s: float = 60.0) -> None:
        # The sync wrapper runs the client's event loop in its own thread: TRL calls tools from its own.
        self._client = SearchQAEnvClient(base_url=base_url, message_timeout_s=message_timeout_s).sync()
        self._client.connect()
        self.observation: SearchQAObservation | None = None

    @classmethod
    def factory(cls, base_url: str, **kwargs: Any) -> Callable[[], SearchQARemoteTools]:
        """A no-argument callable for ``GRPOTrainer(environment_factory=...)`` opening sessions on ``base_url``."""

        def make() -> SearchQARemoteTools:
            return cls(base_url, **kwargs)

        return make

    def reset(self, question_id: str | None = None, **_: Any) -> str:
        """Starts the row's question (``question_id``, else one the server draws). Returns the user message."""
        self.observation = self._client.reset(question_id=question_id).observation
        return self.observation.text

    def search(self, query: str) -> str:
        """Searches the knowledge base for passages about a query.

        Args:
            query: What to look for, e.g. a name or a short phrase.

        Returns:
            The best passages, each as "Doc i(Title: title) text".
        """
        if not query.strip():  # refused here, as the local tool env refuses it: nothing sent, nothing spent
            raise InvalidActionError("the query is empty: search needs words to look for")
        return self._play(SearchQAAction.search(query))

    def answer(self, answer: str) -> str:
        """Gives the final answer to the question. Call it once, at the end.

        Args:
            answer: The answer only, a few words, without explanation.

        Returns:
            A confirmation.
        """
        return self._play(SearchQAAction.answer(answer))

    def get_reward(self) -> float:
        """The server's reward of the episode: the answer metric once it has ended, else 0."""
        if self.observation is None or not self.observation.done:
            return 0.0
        return float(self.observation.reward or 0.0)

    def _play(self, action: SearchQAAction) -> str:
        if self.observation is None or self.observation.done:
            raise EpisodeFinishedError("the episode has ended")
        self.observation = self._client.step(action).observation
        if self.observation.error is not None:  # TRL shows a tool's exception to the model as its result
            raise EpisodeFinishedError(self.observation.error)
        return self.observation.text
