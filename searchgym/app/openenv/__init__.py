"""SearchQA as an OpenEnv environment (extra ``searchgym[openenv]``): served over HTTP and WebSocket.

A turn-level SearchQA: the agent sends ``search(query)`` and ``answer(text)`` actions; the reward is the
answer metric (exact match by default) against the golden answers. Episodes are those of
:class:`~searchgym.envs.messages.SearchQAMessages`, the message-level view the TRL tool env and the
``verifiers`` environment share; this package puts them behind OpenEnv's ``Environment``, ``create_app`` and
``EnvClient``.

* :mod:`~searchgym.app.openenv.models`: ``SearchQAAction``, ``SearchQAObservation``, ``SearchQAState``;
* :mod:`~searchgym.app.openenv.client`: ``SearchQAEnvClient``, an OpenEnv ``EnvClient``;
* :mod:`~searchgym.app.openenv.environment`: ``SearchQAEnvironment``, its settings an ``EnvSpec``;
* :mod:`~searchgym.app.openenv.server`: ``create_searchqa_app`` and ``serve`` (``searchgym openenv serve``);
* :mod:`~searchgym.app.openenv.tools`: ``SearchQARemoteTools``, a server session as TRL's ``environment_factory``.

Like :mod:`searchgym.app.cli`, this package belongs to the application layer: it imports ``searchgym.agents``,
and nothing in searchgym's core, envs or agents imports it. Importing it imports the client side only.
See ``docs/openenv.md``.
"""

from __future__ import annotations

from searchgym.errors import MissingDependencyError

try:
    import openenv  # type: ignore[import-untyped]  # noqa: F401
except ImportError:
    raise MissingDependencyError("openenv", "openenv", "searchgym's OpenEnv environment") from None

from .client import SearchQAEnvClient
from .models import SearchQAAction, SearchQAObservation, SearchQAState

__all__ = ["SearchQAAction", "SearchQAEnvClient", "SearchQAObservation", "SearchQAState"]
