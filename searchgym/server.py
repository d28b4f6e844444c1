"""A Search-R1-compatible retrieval server: ``POST /retrieve`` and ``GET /health`` over any :class:`Retriever`.

Wire format, as Search-R1's ``retrieval_server.py`` (so Search-R1, verl and searchgym clients work unchanged)::

    POST /retrieve  {"queries": ["q1", ...], "topk": 3, "return_scores": true}
    200             {"result": [[{"document": {"id": "12", "contents": "\\"Title\\"\\ntext"}, "score": 7.1}, ...], ...]}

* ``topk`` may be omitted or ``null`` (the server's ``default_topk``); otherwise an integer in
  ``[1, topk_max]``.
* ``return_scores`` defaults to false, as in Search-R1; then each result list holds the bare documents
  (``[[{"id": ..., "contents": ...}, ...]]``), exactly Search-R1's answer. Unknown keys are ignored.
* An invalid request gets a 4xx answer ``{"detail": "<what is wrong>"}``, never a 500: 413 for a body over
  ``max_body_bytes`` or more than ``max_queries`` queries, 400 for a body that is not a JSON object, 422 for
  a field of the wrong type or out of bounds (empty query list, query over ``max_query_chars``, ``topk``
  outside ``[1, topk_max]``). A retriever failure (:class:`~searchgym.errors.RetrieverError`, e.g. of a
  proxied upstream) is a 502.

FastAPI and uvicorn come with the ``server`` extra and are imported only when a server is built.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from searchgym.data.types import Passage
from searchgym.errors import ConfigError, MissingDependencyError, RetrieverError
from searchgym.retrieval.base import Hit, Retriever

__all__ = ["RequestError", "RetrieveRequest", "ServerLimits", "ServerThread", "create_app", "parse_request"]


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask; validated once.

    Attributes:
        default_topk: ``topk`` of a request that gives none.
        topk_max: Largest ``topk`` accepted.
        max_queries: Most queries in one request.
        max_query_chars: Longest query, in characters.
        max_body_bytes: Largest request body, in bytes.
    """

    default_topk: int = 3
    topk_max: int = 100
    max_queries: int = 1024
    max_query_chars: int = 4096
    max_body_bytes: int = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("default_topk", "topk_max", "max_queries", "max_query_chars", "max_body_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if self.default_topk > self.topk_max:
            raise ConfigError(f"default_topk ({self.default_topk}) must be <= topk_max ({self.topk_max})")


@dataclass(frozen=True)
class RetrieveRequest:
    """A validated ``/retrieve`` request."""

    queries: list[str]
    topk: int
    return_scores: bool


class RequestError(Exception):
    """An invalid request: the HTTP status to answer and the message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def parse_request(body: bytes, limits: ServerLimits) -> RetrieveRequest:
    """Validates a ``/retrieve`` body (a pure function, so every rule is testable without a server).

    Raises:
        RequestError: the request is invalid; its status and message are what the client gets.
    """
    if len(body) > limits.max_body_bytes:
        raise RequestError(413, f"request body over {limits.max_body_bytes} bytes")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # bad JSON, bad UTF-8, absurd nesting
        raise RequestError(400, "request body must be a JSON object") from None
    if not isinstance(data, dict):
        raise RequestError(400, f"request body must be a JSON object, got {type(data).__name__}")
    queries = data.get("queries")
    if not isinstance(queries, list):
        raise RequestError(422, "'queries' must be a list of strings")
    if not queries:
        raise RequestError(422, "'queries' must hold at least one query")
    if len(queries) > limits.max_queries:
        raise RequestError(413, f"too many queries: {len(queries)} > {limits.max_queries} per request")
    for i, query in enumerate(queries):
        if not isinstance(query, str):
            raise RequestError(422, f"'queries'[{i}] must be a string, got {type(query).__name__}")
        if len(query) > limits.max_query_chars:
            raise RequestError(422, f"'queries'[{i}] is over {limits.max_query_chars} characters")
    topk = data.get("topk")
    if topk is None:
        topk = limits.default_topk
    elif not isinstance(topk, int) or isinstance(topk, bool):
        raise RequestError(422, f"'topk' must be an integer, got {type(topk).__name__}")
    elif not 1 <= topk <= limits.topk_max:
        raise RequestError(422, f"'topk' must be in [1, {limits.topk_max}], got {topk}")
    return_scores = data.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise RequestError(422, f"'return_scores' must be true or false, got {type(return_scores).__name__}")
    return RetrieveRequest(queries=queries, topk=topk, return_scores=return_scores)


def _document(hit: Hit, passages: dict[str, Passage]) -> dict[str, str]:
    # The corpus record itself when known, so contents round-trip exactly as FlashRAG stores them.
    passage = passages.get(hit.passage_id)
    contents = passage.contents if passage is not None else f'"{hit.title}"\n{hit.text}'
    return {"id": hit.passage_id, "contents": contents}


def create_app(retriever: Retriever, passages: Sequence[Passage], limits: ServerLimits | None = None) -> Any:
    """The FastAPI application serving ``retriever`` over ``passages``.

    Args:
        retriever: Answers the searches; called from a worker thread, so it must be thread-safe for
            reading (the BM25 backends are).
        passages: The corpus behind ``retriever`` (documents are rendered from it; ``/health`` reports its
            size).
        limits: Request limits (defaults: :class:`ServerLimits`).

    Raises:
        MissingDependencyError: FastAPI is not installed (extra ``server``).
    """
    try:
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse, Response
        from starlette.concurrency import run_in_threadpool
    except ImportError:
        raise MissingDependencyError("fastapi", "server", "The retrieval server") from None

    limits = limits or ServerLimits()
    by_id = {p.id: p for p in passages}
    app = FastAPI(title="searchgym retrieval server", docs_url=None, redoc_url=None)

    def error(status: int, message: str) -> Response:
        return JSONResponse({"detail": message}, status_code=status)

    async def read_body(request: Request) -> bytes:
        """The body, refusing to buffer more than ``max_body_bytes`` (checked before and while reading)."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
            raise RequestError(413, f"request body over {limits.max_body_bytes} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.max_body_bytes:  # chunked uploads declare no length
                raise RequestError(413, f"request body over {limits.max_body_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def retrieve(request: Request) -> Response:
        try:
            req = parse_request(await read_body(request), limits)
        except RequestError as e:
            return error(e.status, e.message)
        try:
            # A worker thread: scoring is CPU work that must not block the event loop's other requests.
            results = await run_in_threadpool(retriever.search, req.queries, req.topk)
        except RetrieverError as e:
            return error(502, f"retrieval failed: {e}")
        if req.return_scores:
            payload: list[list[Any]] = [
                [{"document": _document(h, by_id), "score": h.score} for h in hits] for hits in results
            ]
        else:
            payload = [[_document(h, by_id) for h in hits] for hits in results]
        return Response(json.dumps({"result": payload}), media_type="application/json")

    async def health(request: Request) -> Response:
        return JSONResponse(
            {
                "status": "ok",
                "retriever": retriever.name,
                "passages": len(by_id),
                "default_topk": limits.default_topk,
                "topk_max": limits.topk_max,
                "max_queries": limits.max_queries,
            }
        )

    # Plain routes: the handlers read the raw request themselves (size limits, exact 4xx messages), so
    # FastAPI's parameter injection, which would need the annotations resolvable at module level, is skipped.
    app.add_route("/retrieve", retrieve, methods=["POST"])
    app.add_route("/health", health, methods=["GET"])
    return app


def _uvicorn() -> Any:
    try:
        import uvicorn
    except ImportError:
        raise MissingDependencyError("uvicorn", "server", "The retrieval server") from None
    return uvicorn


def run_server(app: Any, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Serves ``app`` with uvicorn until interrupted (Ctrl-C)."""
    _uvicorn().run(app, host=host, port=port, log_level=log_level)


class ServerThread:
    """Runs an app with uvicorn in a background thread: for tests, notebooks, and in-process training.

    The listening socket is bound before the thread starts, so ``port=0`` picks a free port with no race,
    and :attr:`url` is valid as soon as :meth:`start` returns. Use it as a context manager::

        with ServerThread(create_app(retriever, passages)) as server:
            client = HttpRetriever(server.url + "/retrieve")

    Args:
        app: The ASGI application.
        host: Interface to listen on (loopback by default).
        port: Port; 0 picks a free one. Rebinding a port just released works (``SO_REUSEADDR``).
        startup_timeout: Seconds to wait for the server to accept connections.
    """

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, startup_timeout: float = 10.0
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.startup_timeout = startup_timeout
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:54321``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> ServerThread:
        """Binds, starts serving, and waits until the server is up.

        Raises:
            RetrieverError: the server did not come up within ``startup_timeout``.
        """
        uvicorn = _uvicorn()
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self._socket = sock
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [sock]},
            name=f"searchgym-server-{self.port}",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RetrieverError(f"the retrieval server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stops serving (open connections are closed) and waits for the thread to end."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        self._server = None

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
