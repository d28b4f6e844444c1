"""The client side: :class:`SearchQAEnvClient`, OpenEnv's ``EnvClient`` with SearchQA's typed messages."""

from __future__ import annotations

from typing import Any

from openenv.core.client_types import StepResult  # type: ignore[import-untyped]
from openenv.core.env_client import EnvClient  # type: ignore[import-untyped]

from .models import SearchQAAction, SearchQAObservation, SearchQAState

__all__ = ["SearchQAEnvClient"]


class SearchQAEnvClient(EnvClient[SearchQAAction, SearchQAObservation, SearchQAState]):
    """One session of a SearchQA OpenEnv server (``searchgym openenv serve``), over its WebSocket.

    Each client is its own episode on the server. OpenEnv's client is asynchronous; ``.sync()`` gives the
    blocking one::

        with SearchQAEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
            result = env.reset(seed=0)
            result = env.step(SearchQAAction.search(result.observation.question))
            result = env.step(SearchQAAction.answer("Paris"))
            print(result.reward, result.observation.metadata["golden_answers"])

    ``reset`` takes ``seed``, ``episode_id`` and ``question_id``.
    """

    def _step_payload(self, action: SearchQAAction) -> dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[SearchQAObservation]:
        observation = SearchQAObservation.model_validate(
            {
                **payload.get("observation", {}),
                "done": payload.get("done", False),
                "reward": payload.get("reward"),
            }
        )
        return StepResult(
            observation=observation,
            reward=observation.reward,
            done=observation.done,
            metadata=payload.get("metadata"),
        )

    def _parse_state(self, payload: dict[str, Any]) -> SearchQAState:
        return SearchQAState.model_validate(payload)
