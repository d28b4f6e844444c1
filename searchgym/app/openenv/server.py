"""The SearchQA OpenEnv server: the app from OpenEnv's ``create_app``, served with searchgym's guards.

OpenEnv's app holds one :class:`~searchgym.app.openenv.environment.SearchQAEnvironment` per WebSocket session
(``/ws``, what :class:`~searchgym.app.openenv.client.SearchQAEnvClient` uses), and serves ``/health``,
``/schema``, ``/metadata``, ``/state``, the stateless ``/reset`` and ``/step``, and ``/mcp``. It is served as
``searchgym serve`` is (:mod:`searchgym.server.guards`, :mod:`searchgym.server.connections`): request heads
and bodies within ``read_timeout``, bodies within ``max_body_bytes``, connections capped, a session silent
for ``session_timeout`` closed, bad input (an unknown question id, a step with no episode) one 4xx line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openenv.core.env_server.http_server import create_app  # type: ignore[import-untyped]

from searchgym.envs.spec import EnvSpec, make_spec
from searchgym.errors import ConfigError, EpisodeFinishedError, SearchGymError, UnknownQuestionError
from searchgym.server.guards import BodyLimit, SessionIdleTimeout
from searchgym.server.wire import ServerLimits

from .environment import SearchQAEnvironment
from .models import SearchQAAction, SearchQAObservation, SearchQAState

__all__ = ["create_searchqa_app", "serve"]

ENV_NAME = "searchqa"


SESSION_TIMEOUT_S = 300.0
"""Default seconds a WebSocket session may stay silent before it is closed (a model writing its next turn
on a CPU takes seconds, not minutes)."""

OPENENV_LIMITS = ServerLimits(max_body_bytes=1 << 20)
"""The OpenEnv server's request limits: an action is a short text, so bodies stop at 1 MiB."""


def create_searchqa_app(
    spec: EnvSpec | None = None,
    *,
    seed: int = 0,
    index: str | Path | None = None,
    max_sessions: int = 64,
    limits: ServerLimits | None = None,
    session_timeout: float | None = SESSION_TIMEOUT_S,
    **fields: Any,
) -> Any:
    """The FastAPI app of a SearchQA OpenEnv server.

    One environment is built here, so that a bad option fails now and the dataset and retriever are loaded
    before the first session opens.

    Args:
        spec: The settings of every session's episodes (:class:`~searchgym.envs.EnvSpec`; default: its
            defaults), as :class:`~searchgym.app.openenv.environment.SearchQAEnvironment` takes them.
        seed: Seed of each session's question draw.
        index: A BM25 index folder of the dataset's corpus (``searchgym index bm25``): loaded, memory-mapped,
            instead of indexing the corpus at start. It is served by searchgym's ``/retrieve`` server on a
            loopback port of this process (the environment takes a retriever name or URL), started here
            and stopped when the app shuts down.
        max_sessions: WebSocket sessions open at once (each is one episode at a time).
        limits: The guards of ``searchgym serve`` (:class:`~searchgym.server.ServerLimits`): the read
            deadline and the connection cap (applied by :func:`serve`), and the body limit (default
            :data:`OPENENV_LIMITS`).
        session_timeout: Seconds a WebSocket session may stay silent before it is closed and its slot freed
            (``None``: never).
        **fields: :class:`~searchgym.envs.EnvSpec` fields changed from ``spec`` (e.g. ``topk=5``).

    Raises:
        ConfigError: a bad option, or an index with a retriever other than ``bm25`` or not of this corpus.
    """
    spec = make_spec(spec, fields)
    limits = limits or OPENENV_LIMITS
    if max_sessions < 1:
        raise ConfigError(f"max_sessions must be >= 1, got {max_sessions}")
    if session_timeout is not None and not (
        isinstance(session_timeout, int | float) and 0 < session_timeout < 1e9
    ):
        raise ConfigError(f"session_timeout must be a number of seconds > 0 or None, got {session_timeout!r}")
    stop_backend: Callable[[], None] | None = None
    if index is not None:
        spec, stop_backend = _index_backend(spec, Path(index))
    try:
        SearchQAEnvironment(spec, seed=seed).close()
        app = create_app(
            functools.partial(SearchQAEnvironment, spec, seed=seed),
            SearchQAAction,
            SearchQAObservation,
            env_name=ENV_NAME,
            max_concurrent_envs=max_sessions,
            state_cls=SearchQAState,
        )
    except BaseException:
        if stop_backend is not None:
            stop_backend()
        raise
    if stop_backend is not None:
        app.router.on_shutdown.append(stop_backend)
    _guard(app, limits, session_timeout)
    return app


def _guard(app: Any, limits: ServerLimits, session_timeout: float | None) -> None:
    """The guards ``searchgym serve`` has (:mod:`searchgym.server.guards`), on OpenEnv's app: bounded bodies,
    idle sessions closed, and bad input answered with one 4xx line instead of a 500 and a traceback."""
    from fastapi.responses import JSONResponse

    app.state.limits = limits  # serve() applies the read deadline and the connection cap
    app.add_middleware(SessionIdleTimeout, timeout=session_timeout)
    app.add_middleware(BodyLimit, max_body_bytes=limits.max_body_bytes, read_timeout=limits.read_timeout)

    async def bad_input(request: Any, error: Exception) -> Any:
        status = 422  # a bad option or value
        if isinstance(error, UnknownQuestionError):
            status = 404
        elif isinstance(error, EpisodeFinishedError):
            status = 409  # a step with no episode running
        return JSONResponse({"detail": str(error)}, status_code=status)

    app.add_exception_handler(SearchGymError, bad_input)


def _index_backend(spec: EnvSpec, index: Path) -> tuple[EnvSpec, Callable[[], None]]:
    """Serves a saved BM25 index on loopback; returns the spec that searches it, and how to stop it."""
    from searchgym.data import load_dataset
    from searchgym.retrieval import BM25Retriever
    from searchgym.server import ServerThread
    from searchgym.server import create_app as create_retrieval_app

    if spec.retriever not in (None, "bm25"):
        raise ConfigError(f"--index applies to the bm25 retriever only, not {spec.retriever!r}")
    passages = load_dataset(spec.dataset, world_seed=spec.world_seed).passages
    retriever = BM25Retriever.load(index, passages, mmap=True)  # a stale index is a ConfigError
    backend = ServerThread(create_retrieval_app(retriever, passages)).start()
    return spec.replace(retriever=f"{backend.url}/retrieve"), backend.stop


def serve(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serves ``app`` until interrupted; ``on_ready`` gets the base URL once the port is bound.

    The server of ``searchgym serve`` (:func:`searchgym.server.run_server`): a deadline for each request's
    head, connections capped below the descriptor limit, repeated log lines rate-limited; the app carries
    the body limit and the sessions' idle timeout (:func:`create_searchqa_app`).

    Raises:
        ConfigError: the address cannot be bound.
    """
    from searchgym.server import run_server

    run_server(app, host=host, port=port, log_level=log_level, on_ready=on_ready)
