"""A Search-R1-compatible retrieval server: ``POST /retrieve`` and ``GET /health`` over any :class:`Retriever`.

Wire format, as Search-R1's ``retrieval_server.py`` (so Search-R1, verl and searchgym clients work unchanged)::

    POST /retrieve  {"queries": ["q1", ...], "topk": 3, "return_scores": true}
    200             {"result": [[{"document": {"id": "12", "contents": "\\"Title\\"\\ntext"}, "score": 7.1}, ...], ...]}

* ``queries`` may be empty: the answer is ``{"result": []}``.
* ``{"query": "q1", ...}`` (one string, as SkyRL-Gym's and verl's search tools send) is answered as the
  one-query batch ``{"queries": ["q1"], ...}``, in the same ``result`` shape; a body with both fields, or
  neither, is a 422 naming them.
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
  ``max_body_bytes`` or holding more than ``max_queries + 1024`` JSON values, more than ``max_queries``
  queries, or an answer that could exceed ``max_response_bytes``; 400 for a body that is not a JSON
  object; 422 for a field of the wrong type or out of bounds (``topk`` outside ``[1, topk_max]``); 408 for
  a body that does not arrive within ``read_timeout``. A retriever failure
  (:class:`~searchgym.errors.RetrieverError`, e.g. of a proxied upstream) is a 502.

Slow or hostile clients cannot stall the event loop or hold memory beyond the limits:

* Bodies are parsed in worker threads (``max_concurrent`` at a time) by a parser that stops at the value
  budget, so a 16 MiB body of tiny values neither holds the GIL for seconds (as ``json.loads`` would)
  nor builds millions of objects.
* A request is refused (413) before any scoring when its answer *could* exceed ``max_response_bytes``:
  the bound takes each query's ``topk`` largest passages, so it is conservative (raise the limit,
  ``--max-response-mb``, when it refuses requests you need).
* Scoring, rendering and sending run under one of ``max_concurrent`` slots, held until the answer's last
  byte is handed to the socket: at most ``max_concurrent`` answers exist at a time, however slowly clients
  read, and a client that has not taken its answer within ``write_timeout`` is disconnected.
* Documents are rendered from JSON fragments encoded once at start-up (no millions of Python objects).
* With :func:`run_server` and :class:`ServerThread`, a connection gets ``read_timeout`` to send a request's
  head, and at most ``max_connections`` are open (see :mod:`searchgym._server_connections`).

FastAPI and uvicorn come with the ``server`` extra and are imported only when a server is built.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import math
import re
import socket
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from json.scanner import make_scanner
from typing import Any

from searchgym.data.types import Passage
from searchgym.errors import ConfigError, MissingDependencyError, RetrieverError
from searchgym.retrieval.base import Hit, Retriever

__all__ = [
    "ABORT_KEY",
    "RequestError",
    "RetrieveRequest",
    "ServerLimits",
    "ServerThread",
    "bind_socket",
    "create_app",
    "loads_bounded",
    "parse_request",
    "run_server",
    "truncate_query",
]

_WORD = re.compile(r"\w+")
# The key, in each request's ``scope["state"]``, of the server's hook that drops the connection at once.
ABORT_KEY = "searchgym.abort"


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
        max_concurrent: Requests scored, rendered and sent at the same time (a slot is held until the
            answer's last byte is handed to the socket); others wait their turn. Also the bodies parsed at
            the same time.
        read_timeout: Seconds a client has to send a request's head (from connecting, or from its previous
            answer) and, separately, its body; a late head closes the connection, a late body gets 408.
        write_timeout: Seconds a client has to take its answer once sending starts; a slower reader is
            disconnected, so that it holds its slot no longer.
        max_connections: Connections open at once (fewer if ``ulimit -n`` leaves less room); one more
            closes the connection that has waited longest without a request.
    """

    default_topk: int = 3
    topk_max: int = 100
    max_queries: int = 4096
    max_query_tokens: int = 256
    max_query_chars: int = 4096
    max_body_bytes: int = 16 * 1024 * 1024
    max_response_bytes: int = 64 * 1024 * 1024
    max_concurrent: int = 2
    read_timeout: float = 10.0
    write_timeout: float = 30.0
    max_connections: int = 1024

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
            "max_connections",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("read_timeout", "write_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ConfigError(f"{name} must be a number of seconds > 0, got {value!r}")
        if self.default_topk > self.topk_max:
            raise ConfigError(f"default_topk ({self.default_topk}) must be <= topk_max ({self.topk_max})")

    @property
    def max_body_values(self) -> int:
        """JSON values a body may hold: the queries and room for the other fields (a bigger body is 413)."""
        return self.max_queries + 1024


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
    data = loads_bounded(body, limits.max_body_values)
    if not isinstance(data, dict):
        raise RequestError(400, f"request body must be a JSON object, got {type(data).__name__}")
    if "queries" in data and "query" in data:
        raise RequestError(422, "send 'queries' (a list of strings) or 'query' (one string), not both")
    if "query" in data:  # the single-query form of SkyRL's and verl's search tools: a one-query batch
        if not isinstance(data["query"], str):
            raise RequestError(422, f"'query' must be a string, got {type(data['query']).__name__}")
        queries = [data["query"]]
    elif "queries" in data:
        queries = data["queries"]
    else:
        raise RequestError(422, "missing 'queries' (a list of strings) or 'query' (one string)")
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


_WHITESPACE = re.compile(r"[ \t\n\r]*")
# Parses the one value at an index (C where available); typeshed misdeclares its argument.
_SCAN_SCALAR = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]
_MAX_DEPTH = 64


def _skip(text: str, i: int) -> int:
    """The index of the first character at or after ``i`` that is not JSON white space."""
    return _WHITESPACE.match(text, i).end()  # type: ignore[union-attr]  # it matches everywhere


def loads_bounded(body: bytes, max_values: int) -> Any:
    """``json.loads(body)``, refusing a body of more than ``max_values`` values before building them all.

    Containers are walked here, scalars parsed by ``json``'s own scanner, so the work stops at the budget
    and the GIL is released between values: ``json.loads`` of 16 MiB of ``[],[],...`` builds 5.6 million
    lists and holds the GIL for about 5 s, blocking every other thread (the event loop's ``/health``
    included). For a body within the budget the result equals ``json.loads``'s, except that nesting is
    limited to 64 levels.

    Raises:
        RequestError: 400 for a body that is not JSON (or nested too deeply), 413 over the budget.
    """
    bad = RequestError(400, "request body must be a JSON object")
    try:
        text = body.decode(json.detect_encoding(body), "surrogatepass")  # as json.loads decodes bytes
    except UnicodeDecodeError:
        raise bad from None
    count = 0

    def value(i: int, depth: int) -> tuple[Any, int]:
        nonlocal count
        count += 1
        if count > max_values:
            raise RequestError(413, f"request body holds more than {max_values} JSON values")
        opener = text[i : i + 1]
        if opener not in ("[", "{"):
            try:
                return _SCAN_SCALAR(text, i)
            except (StopIteration, ValueError):  # no value here; an integer of over 4,300 digits
                raise bad from None
        if depth == _MAX_DEPTH:
            raise bad
        closer = "]" if opener == "[" else "}"
        items: list[Any] = []
        fields: dict[str, Any] = {}
        i = _skip(text, i + 1)
        if text[i : i + 1] == closer:
            return (items if opener == "[" else fields), i + 1
        while True:
            if opener == "[":
                item, i = value(i, depth + 1)
                items.append(item)
            else:
                if text[i : i + 1] != '"':
                    raise bad
                key, i = _SCAN_SCALAR(text, i)
                i = _skip(text, i)
                if text[i : i + 1] != ":":
                    raise bad
                i = _skip(text, i + 1)
                fields[key], i = value(i, depth + 1)
            i = _skip(text, i)
            separator = text[i : i + 1]
            if separator == closer:
                return (items if opener == "[" else fields), i + 1
            if separator != ",":
                raise bad
            i = _skip(text, i + 1)

    try:
        data, end = value(_skip(text, 0), 0)
    except json.JSONDecodeError:  # a bad string (control character, escape)
        raise bad from None
    if _skip(text, end) != len(text):
        raise bad
    return data


_ANSWER_FRAME = len(b'{"result": []}')
_LONGEST_NUMBER = len(repr(-2.2250738585072014e-308))  # 24: no float's repr is longer ("-Infinity": 9)


class _Documents:
    """Every passage's ``{"id": ..., "contents": ...}`` JSON, encoded once; renders answers from them."""

    def __init__(
        self, passages: Sequence[Passage], contents: Mapping[str, str] | None, topk_max: int
    ) -> None:
        self.fragments: dict[str, bytes] = {}
        for p in passages:
            raw = contents.get(p.id) if contents is not None else None
            self.fragments[p.id] = _fragment(p.id, raw if raw is not None else p.contents)
        largest = heapq.nlargest(topk_max, (len(f) for f in self.fragments.values()))
        # _top_sums[k]: the bytes of the k largest fragments, the most k distinct passages can take.
        self._top_sums = list(itertools.accumulate(largest, initial=0))

    def answer_bound(self, n_queries: int, topk: int, return_scores: bool) -> int:
        """The most bytes :meth:`render` can make of ``n_queries`` lists of ``topk`` distinct corpus passages.

        Exact for the worst case (each list holds the ``topk`` largest passages, each score the longest
        number); hits outside the corpus are not covered, so :meth:`render` still checks as it goes.
        """
        per_hit = len(b", ") + (len(b'{"document": , "score": }') + _LONGEST_NUMBER if return_scores else 0)
        per_query = len(b", []") + self._top_sums[min(topk, len(self._top_sums) - 1)] + topk * per_hit
        return _ANSWER_FRAME + n_queries * per_query

    def fragment(self, hit: Hit) -> bytes:
        known = self.fragments.get(hit.passage_id)
        return known if known is not None else _fragment(hit.passage_id, hit.contents)

    def render(self, results: list[list[Hit]], return_scores: bool, max_bytes: int) -> bytes:
        """The JSON answer; raises :class:`RequestError` (413) when it would exceed ``max_bytes``."""
        parts: list[bytes] = [b'{"result": [']
        size = _ANSWER_FRAME
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
    documents = _Documents(passages, contents, limits.topk_max)
    app = FastAPI(title="searchgym retrieval server", docs_url=None, redoc_url=None)
    app.state.limits = limits  # run_server and ServerThread apply the connection limits
    app.state.answer_bound = documents.answer_bound
    # Semaphores belong to the event loop that serves the app (one app may be served by several in turn).
    slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Slots] = weakref.WeakKeyDictionary()

    def error(status: int, message: str) -> Response:
        # A 408 leaves the request body unread: the connection cannot carry another request.
        headers = {"connection": "close"} if status == 408 else None
        return JSONResponse({"detail": message}, status_code=status, headers=headers)

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

    async def retrieve(request: Request) -> Any:
        loop_slots = slots.get(asyncio.get_running_loop())
        if loop_slots is None:
            loop_slots = slots[asyncio.get_running_loop()] = _Slots(limits.max_concurrent)
        try:
            try:
                body = await asyncio.wait_for(read_body(request), limits.read_timeout)
            except TimeoutError:
                raise RequestError(
                    408, f"the request body did not arrive within {limits.read_timeout:g} s"
                ) from None
            async with loop_slots.parsing:
                req = await run_in_threadpool(parse_request, body, limits)
            del body
            if not req.queries:
                return Response(b'{"result": []}', media_type="application/json")
            bound = documents.answer_bound(len(req.queries), req.topk, req.return_scores)
            if bound > limits.max_response_bytes:  # refused before any scoring
                raise RequestError(
                    413,
                    f"{len(req.queries)} queries x topk {req.topk} could make an answer of up to "
                    f"{bound / 2**20:.1f} MiB (each query's {req.topk} largest passages), over the "
                    f"{limits.max_response_bytes / 2**20:.1f} MiB limit; ask fewer queries or a smaller "
                    "topk, or raise the server's limit (searchgym serve --max-response-mb)",
                )
        except RequestError as e:
            return error(e.status, e.message)
        headers = [(b"x-searchgym-truncated-queries", b"%d" % req.truncated)] if req.truncated else []

        async def respond(scope: Any, receive: Any, send: Any) -> None:
            async with loop_slots.answering:  # held from scoring until the last byte is handed over
                try:
                    body = await run_in_threadpool(answer, req)
                except RequestError as e:
                    return await error(e.status, e.message)(scope, receive, send)
                except RetrieverError as e:
                    return await error(502, f"retrieval failed: {e}")(scope, receive, send)
                await _send_answer(scope, send, body, headers, limits.write_timeout)

        return respond

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


class _Slots:
    """The semaphores of one event loop: answers in progress, and bodies being parsed."""

    def __init__(self, max_concurrent: int) -> None:
        self.answering = asyncio.Semaphore(max_concurrent)
        self.parsing = asyncio.Semaphore(max_concurrent)


_CHUNK = 64 * 1024


async def _send_answer(
    scope: Any, send: Any, body: bytes, headers: list[tuple[bytes, bytes]], timeout: float
) -> None:
    """Sends a 200 answer in chunks, each as the client makes room, within ``timeout`` seconds.

    The transport buffers at most one chunk beyond its high-water mark, so the answer's memory is the
    caller's until the last chunk is handed over. A client that has not taken it by the deadline is
    disconnected through the server's abort hook (:data:`ABORT_KEY`); without one, sending just stops and
    the server closes the connection.
    """
    start = {
        "type": "http.response.start",
        "status": 200,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            *headers,
        ],
    }
    try:
        async with asyncio.timeout(timeout):
            await send(start)
            for at in range(0, max(len(body), 1), _CHUNK):
                more = at + _CHUNK < len(body)
                await send({"type": "http.response.body", "body": body[at : at + _CHUNK], "more_body": more})
    except TimeoutError:
        abort = scope.get("state", {}).get(ABORT_KEY)
        if abort is not None:
            abort()
            await asyncio.sleep(0)  # the connection is lost before the app returns: no "incomplete" error


def _uvicorn_server(app: Any, **options: Any) -> Any:
    """A uvicorn server for ``app``, with the connection limits of its :class:`ServerLimits`.

    The limits are those :func:`create_app` recorded on the app (the defaults for any other app): a
    deadline for each request's head and a cap on open connections (:mod:`searchgym._server_connections`).
    """
    try:
        import uvicorn

        from searchgym._server_connections import uvicorn_options
    except ImportError:
        raise MissingDependencyError("uvicorn", "server", "The retrieval server") from None
    limits = getattr(getattr(app, "state", None), "limits", None)
    if not isinstance(limits, ServerLimits):
        limits = ServerLimits()
    guards = uvicorn_options(limits.read_timeout, limits.max_connections, ABORT_KEY)
    return uvicorn.Server(uvicorn.Config(app, **guards, **options))


class _Listener(socket.socket):
    """A listening socket whose accept queue stays at least 2,048 connections long.

    uvicorn's ``backlog`` is also how many connections asyncio accepts per turn of its loop; the server
    keeps that small (:data:`searchgym._server_connections.ACCEPT_BURST`) without shortening the queue.
    """

    def listen(self, backlog: int = 2048, /) -> None:
        super().listen(max(backlog, 2048))


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``SO_REUSEADDR``; port 0 picks a free one).

    Raises:
        ConfigError: the address cannot be bound (in use, not local, no permission).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = _Listener(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen()
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
    server = _uvicorn_server(app, log_level=log_level)
    sock = bind_socket(host, port)
    bound = sock.getsockname()[1]
    if on_ready is not None:
        on_ready(f"http://{f'[{host}]' if ':' in host else host}:{bound}")
    try:
        server.run(sockets=[sock])
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
        server = _uvicorn_server(self.app, log_level="warning", access_log=False, lifespan="off")
        sock = bind_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        self._socket = sock
        self._server = server
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
