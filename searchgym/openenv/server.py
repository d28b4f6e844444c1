"""The SearchQA OpenEnv server: the app from OpenEnv's ``create_app``, served with uvicorn.

OpenEnv's app holds one :class:`~searchgym.openenv.environment.SearchQAEnvironment` per WebSocket session
(``/ws``, what :class:`~searchgym.openenv.client.SearchQAEnvClient` uses), and serves ``/health``,
``/schema``, ``/metadata``, ``/state``, the stateless ``/reset`` and ``/step``, and ``/mcp``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from openenv.core.env_server.http_server import create_app  # type: ignore[import-untyped]

from searchgym.errors import ConfigError

from .environment import SearchQAEnvironment, SearchQAEnvOptions
from .models import SearchQAAction, SearchQAObservation, SearchQAState

__all__ = ["create_searchqa_app", "serve"]

ENV_NAME = "searchqa"


def create_searchqa_app(
    options: SearchQAEnvOptions | None = None,
    *,
    index: str | Path | None = None,
    max_sessions: int = 64,
) -> Any:
    """The FastAPI app of a SearchQA OpenEnv server.

    One environment is built here, so that a bad option fails now and the dataset and retriever are loaded
    before the first session opens.

    Args:
        options: The settings of every session.
        index: A BM25 index folder of the dataset's corpus (``searchgym index bm25``): loaded, memory-mapped,
            instead of indexing the corpus at start. It is served by searchgym's ``/retrieve`` server on a
            loopback port of this process (the environment takes a retriever name or URL), started here
            and stopped when the app shuts down.
        max_sessions: WebSocket sessions open at once (each is one episode at a time).

    Raises:
        ConfigError: a bad option, or an index with a retriever other than ``bm25`` or not of this corpus.
    """
    options = options or SearchQAEnvOptions()
    if max_sessions < 1:
        raise ConfigError(f"max_sessions must be >= 1, got {max_sessions}")
    stop_backend: Callable[[], None] | None = None
    if index is not None:
        options, stop_backend = _index_backend(options, Path(index))
    try:
        SearchQAEnvironment(options).close()
        app = create_app(
            functools.partial(SearchQAEnvironment, options),
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
    return app


def _index_backend(options: SearchQAEnvOptions, index: Path) -> tuple[SearchQAEnvOptions, Callable[[], None]]:
    """Serves a saved BM25 index on loopback; returns the options that search it, and how to stop it."""
    from searchgym.data import load_dataset
    from searchgym.retrieval import BM25Retriever
    from searchgym.server import ServerThread
    from searchgym.server import create_app as create_retrieval_app

    if options.retriever not in (None, "bm25"):
        raise ConfigError(f"--index applies to the bm25 retriever only, not {options.retriever!r}")
    passages = load_dataset(options.dataset, world_seed=options.world_seed).passages
    retriever = BM25Retriever.load(index, passages, mmap=True)  # a stale index is a ConfigError
    backend = ServerThread(create_retrieval_app(retriever, passages)).start()
    return replace(options, retriever=f"{backend.url}/retrieve"), backend.stop


def serve(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serves ``app`` with uvicorn until interrupted; ``on_ready`` gets the base URL once the port is bound.

    Plain uvicorn, not searchgym's guarded retrieval server: OpenEnv sessions are WebSockets that stay idle
    while the model writes its next turn.

    Raises:
        ConfigError: the address cannot be bound.
    """
    import uvicorn

    from searchgym.server import bind_socket

    sock = bind_socket(host, port)
    bound = sock.getsockname()[1]
    if on_ready is not None:
        on_ready(f"http://{f'[{host}]' if ':' in host else host}:{bound}")
    try:
        uvicorn.Server(uvicorn.Config(app, log_level=log_level)).run(sockets=[sock])
    finally:
        sock.close()
