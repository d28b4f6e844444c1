"""A Search-R1-compatible retrieval server: ``POST /retrieve`` and ``GET /health`` over any :class:`Retriever`.

Wire format, as Search-R1's ``retrieval_server.py`` (so Search-R1, verl and searchgym clients work unchanged)::

    POST /retrieve  {"queries": ["q1", ...], "topk": 3, "return_scores": true}
    200             {"result": [[{"document": {"id": "12", "contents": "\\"Title\\"\\ntext"}, "score": 7.1}, ...], ...]}

* ``queries`` may be empty: the answer is ``{"result": []}``.
* ``topk`` may be omitted or ``null`` (the server's ``default_topk``); otherwise an integer in
  ``[1, topk_max]``.
* ``return_scores`` defaults to false, as in Search-R1; then each result list holds the bare documents
  (``[[{"id": ..., "contents": ...}, ...]]``), exactly Search-R1's answer. Unknown keys are ignored.
* ``contents`` is the corpus record's string, byte for byte (when the server is given the raw records, as
  ``searchgym serve`` does).
* A long query is not refused: it is cut to its first ``max_query_tokens`` words and ``max_query_chars``
  characters (the retriever's query budget) and answered; the ``X-Searchgym-Truncated-Queries`` header
  counts the queries cut.
* An invalid request gets a 4xx answer ``{"detail": "<what is wrong>"}``, never a 500: 413 for a body over
  ``max_body_bytes``, more than ``max_queries`` queries, or an answer that would exceed
  ``max_response_bytes``; 400 for a body that is not a JSON object; 422 for a field of the wrong type or
  out of bounds (``topk`` outside ``[1, topk_max]``). A retriever failure
  (:class:`~searchgym.errors.RetrieverError`, e.g. of a proxied upstream) is a 502.

Scoring and rendering run in worker threads, at most ``max_concurrent`` requests at a time, and documents
are rendered from JSON fragments encoded once at start-up, so a large answer neither blocks the event loop
(``/health`` stays responsive) nor builds millions of Python objects.

FastAPI and uvicorn come with the ``server`` extra and are imported only when a server is built.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from searchgym.data.types import Passage
from searchgym.errors import ConfigError, MissingDependencyError, RetrieverError
from searchgym.retrieval.base import Hit, Retriever

__all__ = [
    "RequestError",
    "RetrieveRequest",
    "ServerLimits",
    "ServerThread",
    "bind_socket",
    "create_app",
    "parse_request",
    "run_server",
    "truncate_query",
]

_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask; validated once.

    The defaults carry a full default Search-R1 step (512 prompts x 5 responses = 2,560 queries in one
    request, top 3) with room to spare.

    Attributes:
        default_topk: ``topk`` of a request that gives none.
        topk_max: Largest ``topk`` accepted.
        max_queries: Most queries in one request.
        max_query_tokens: A query is cut to its first this many words (``\\w+`` tokens) before retrieval.
        max_query_chars: A query is cut to at most this many characters before retrieval.
        max_body_bytes: Largest request body, in bytes.
        max_response_bytes: Largest answer body, in bytes; a request whose answer would be larger gets 413
            (it asks too many queries times ``topk`` for the corpus's passage size).
        max_concurrent: Requests scored and rendered at the same time; others wait their turn.
    """

    default_topk: int = 3
    topk_max: int = 100
    max_queries: int = 4096
    max_query_tokens: int = 256
    max_query_chars: int = 4096
    max_body_bytes: int = 16 * 1024 * 1024
    max_response_bytes: int = 64 * 1024 * 1024
    max_concurrent: int = 2

    def __post_init__(self) -> None:
        for name in (
            "default_topk",
            "topk_max",
            "max_queries",
            "max_query_tokens",
            "max_query_chars",
            "max_body_bytes",
            "max_response_bytes",
            "max_concurrent",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if self.default_topk > self.topk_max:
            raise ConfigError(f"default_topk ({self.default_topk}) must be <= topk_max ({self.topk_max})")


@dataclass(frozen=True)
class RetrieveRequest:
    """A validated ``/retrieve`` request (queries already cut to the query budget)."""

    queries: list[str]
    topk: int
    return_scores: bool
    truncated: int = 0


class RequestError(Exception):
    """An invalid request: the HTTP status to answer and the message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def truncate_query(query: str, max_tokens: int, max_chars: int) -> str:
    """``query`` cut to its first ``max_tokens`` words (``\\w+`` tokens) and at most ``max_chars`` characters.

    >>> truncate_query("one two three", 2, 100)
    'one two'
    """
    query = query[:max_chars]
    for n, match in enumerate(_WORD.finditer(query), start=1):
        if n == max_tokens:
            return query[: match.end()]
    return query


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
    if len(queries) > limits.max_queries:
        raise RequestError(413, f"too many queries: {len(queries)} > {limits.max_queries} per request")
    cut: list[str] = []
    for i, query in enumerate(queries):
        if not isinstance(query, str):
            raise RequestError(422, f"'queries'[{i}] must be a string, got {type(query).__name__}")
        cut.append(truncate_query(query, limits.max_query_tokens, limits.max_query_chars))
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
    truncated = sum(len(a) != len(b) for a, b in zip(queries, cut, strict=True))
    return RetrieveRequest(queries=cut, topk=topk, return_scores=return_scores, truncated=truncated)


class _Documents:
    """Every passage's ``{"id": ..., "contents": ...}`` JSON, encoded once; renders answers from them."""

    def __init__(self, passages: Sequence[Passage], contents: Mapping[str, str] | None) -> None:
        self.fragments: dict[str, bytes] = {}
        for p in passages:
            raw = contents.get(p.id) if contents is not None else None
            self.fragments[p.id] = _fragment(p.id, raw if raw is not None else p.contents)
        sizes = [len(f) for f in self.fragments.values()]
        self.mean_bytes = sum(sizes) / len(sizes) if sizes else 0.0

    def fragment(self, hit: Hit) -> bytes:
        known = self.fragments.get(hit.passage_id)
        return known if known is not None else _fragment(hit.passage_id, hit.contents)

    def render(self, results: list[list[Hit]], return_scores: bool, max_bytes: int) -> bytes:
        """The JSON answer; raises :class:`RequestError` (413) when it would exceed ``max_bytes``."""
        parts: list[bytes] = [b'{"result": [']
        size = 0
        for i, hits in enumerate(results):
            items = []
            for hit in hits:
                doc = self.fragment(hit)
                items.append(
                    b'{"document": ' + doc + b', "score": ' + _number(hit.score) + b"}"
                    if return_scores
                    else doc
                )
            chunk = (b", [" if i else b"[") + b", ".join(items) + b"]"
            size += len(chunk)
            if size > max_bytes:
                raise RequestError(
                    413, f"the answer would exceed {max_bytes} bytes; ask fewer queries or a smaller topk"
                )
            parts.append(chunk)
        parts.append(b"]}")
        return b"".join(parts)


def _fragment(pid: str, contents: str) -> bytes:
    try:
        return json.dumps({"id": pid, "contents": contents}, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: JSON's \u escapes carry it
        return json.dumps({"id": pid, "contents": contents}).encode("ascii")


def _number(score: float) -> bytes:
    return (repr(float(score)) if math.isfinite(score) else json.dumps(score)).encode()


def create_app(
    retriever: Retriever,
    passages: Sequence[Passage],
    limits: ServerLimits | None = None,
    contents: Mapping[str, str] | None = None,
) -> Any:
    """The FastAPI application serving ``retriever`` over ``passages``.

    Args:
        retriever: Answers the searches; called from worker threads, so it must be thread-safe for
            reading (the BM25 backends are).
        passages: The corpus behind ``retriever`` (documents are rendered from it; ``/health`` reports its
            size).
        limits: Request limits (defaults: :class:`ServerLimits`).
        contents: The corpus's ``contents`` strings by passage id, exactly as stored; documents are served
            with them byte for byte. Without it, a passage's contents are ``'"title"\\ntext'``.

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
    documents = _Documents(passages, contents)
    app = FastAPI(title="searchgym retrieval server", docs_url=None, redoc_url=None)
    # Created lazily: the semaphore must belong to the event loop that serves the app.
    gate: list[asyncio.Semaphore] = []

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

    def answer(req: RetrieveRequest) -> bytes:
        """Scores and renders one request (a worker thread: CPU work kept off the event loop)."""
        results = retriever.search(req.queries, req.topk)
        return documents.render(results, req.return_scores, limits.max_response_bytes)

    async def retrieve(request: Request) -> Response:
        try:
            req = parse_request(await read_body(request), limits)
            if not req.queries:
                return Response(b'{"result": []}', media_type="application/json")
            estimate = len(req.queries) * req.topk * documents.mean_bytes
            if estimate > limits.max_response_bytes:  # refused before any scoring
                raise RequestError(
                    413,
                    f"{len(req.queries)} queries x topk {req.topk} would make an answer of about "
                    f"{estimate / 2**20:.0f} MiB, over the {limits.max_response_bytes / 2**20:.0f} MiB "
                    "limit; ask fewer queries or a smaller topk",
                )
            if not gate:
                gate.append(asyncio.Semaphore(limits.max_concurrent))
            async with gate[0]:
                body = await run_in_threadpool(answer, req)
        except RequestError as e:
            return error(e.status, e.message)
        except RetrieverError as e:
            return error(502, f"retrieval failed: {e}")
        headers = {"X-Searchgym-Truncated-Queries": str(req.truncated)} if req.truncated else None
        return Response(body, media_type="application/json", headers=headers)

    async def health(request: Request) -> Response:
        return JSONResponse(
            {
                "status": "ok",
                "retriever": retriever.name,
                "passages": len(documents.fragments),
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


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``SO_REUSEADDR``; port 0 picks a free one).

    Raises:
        ConfigError: the address cannot be bound (in use, not local, no permission).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def run_server(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serves ``app`` with uvicorn until interrupted (Ctrl-C).

    The socket is bound first, so ``on_ready`` (called with the base URL) runs only once the address is
    really held; a bind failure raises before it.

    Raises:
        ConfigError: the address cannot be bound.
    """
    uvicorn = _uvicorn()
    sock = bind_socket(host, port)
    bound = sock.getsockname()[1]
    if on_ready is not None:
        on_ready(f"http://{f'[{host}]' if ':' in host else host}:{bound}")
    try:
        uvicorn.Server(uvicorn.Config(app, log_level=log_level)).run(sockets=[sock])
    finally:
        sock.close()


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
        sock = bind_socket(self.host, self.port)
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
