"""The retrieval server's ASGI app: ``POST /retrieve`` and ``GET /health`` over a :class:`Retriever`.

:func:`create_app` renders answers from document fragments encoded once at start-up and bounds the work in
flight (parsing and answering slots, a write deadline enforced through the connection's abort hook,
:data:`ABORT_KEY`). See :mod:`searchgym.server` for the wire format and the limits.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import math
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from searchgym.data.types import Passage
from searchgym.errors import MissingDependencyError, RetrieverError
from searchgym.retrieval.base import Hit, Retriever

from .guards import BodyLimit
from .wire import RequestError, RetrieveRequest, ServerLimits, parse_request

# The key, in each request's ``scope["state"]``, of the server's hook that drops the connection at once.
ABORT_KEY = "searchgym.abort"


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
    app.add_middleware(BodyLimit, max_body_bytes=limits.max_body_bytes, read_timeout=limits.read_timeout)
    app.state.answer_bound = documents.answer_bound
    # Semaphores belong to the event loop that serves the app (one app may be served by several in turn).
    slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Slots] = weakref.WeakKeyDictionary()

    def error(status: int, message: str) -> Response:
        return JSONResponse({"detail": message}, status_code=status)

    def answer(req: RetrieveRequest) -> bytes:
        """Scores and renders one request (a worker thread: CPU work kept off the event loop)."""
        results = retriever.search(req.queries, req.topk)
        return documents.render(results, req.return_scores, limits.max_response_bytes)

    async def retrieve(request: Request) -> Any:
        loop_slots = slots.get(asyncio.get_running_loop())
        if loop_slots is None:
            loop_slots = slots[asyncio.get_running_loop()] = _Slots(limits.max_concurrent)
        try:
            body = await request.body()  # bounded in size and time by BodyLimit, before the route runs
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
