"""A client of Search-R1-compatible retrieval servers (``POST /retrieve``), as a :class:`Retriever`.

Wire format (Search-R1's ``retrieval_server.py``, also spoken by ``searchgym serve``)::

    POST /retrieve  {"queries": ["q1", ...], "topk": 3, "return_scores": true}
    200             {"result": [[{"document": {"id": "12", "contents": "\\"Title\\"\\ntext"}, "score": 7.1}, ...], ...]}

With ``return_scores`` false, Search-R1 answers each list with the bare documents; the client reads both
shapes, and documents without an ``id``. Failures are never returned as text: after bounded retries, each
within a total deadline, the client raises :class:`~searchgym.errors.RetrieverError` with the reason.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from searchgym.data.flashrag import parse_contents
from searchgym.errors import ConfigError, MissingDependencyError, RetrieverError
from searchgym.retrieval.base import Hit, Retriever

__all__ = ["RETRY_STATUSES", "HttpRetriever", "derived_id"]

#: HTTP statuses worth retrying: overload and gateway trouble are transient, and a retrieval request is
#: idempotent. Other 4xx/5xx answers are final (the request itself is wrong, or the server is broken).
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class _Abandoned(Exception):
    """Raised inside an attempt the caller has given up on (its deadline passed)."""


class _TooLarge(Exception):
    """The response body grew past ``max_response_bytes``."""


@dataclass
class _Outcome:
    """What one attempt's worker thread produced: a status and body, or the exception it raised."""

    status: int = 0
    body: bytes = b""
    reason: str = ""
    error: BaseException | None = None


_ANSWERED: set[str] = set()
"""The URLs whose server has answered (any HTTP status) in this process: patience waits only for those, so a
server that went away is waited for and an address where none ever answered fails in seconds."""


class HttpRetriever(Retriever):
    """Searches through a remote ``/retrieve`` endpoint, one HTTP request per batch of queries.

    One ``httpx.Client`` is kept open, so consecutive calls reuse the connection. A failed attempt (no
    connection, a timeout, a dropped connection, or a status in :data:`RETRY_STATUSES`) is retried up to
    ``retries`` times, sleeping ``backoff * 2**attempt`` seconds (capped at ``max_backoff``) in between.

    ``timeout`` is a **total deadline** for each attempt — connecting, sending and reading the whole answer
    — not a per-read timeout, so a server that drips its answer a byte at a time cannot hold a call
    longer than :attr:`time_budget`. Every failure (unreachable, timed out, an HTTP error status, a body
    that is not the wire format, an oversized body) raises :class:`~searchgym.errors.RetrieverError`, which
    is what the environments' ``on_retrieval_error`` option acts on.

    Documents without an ``id`` (a Search-R1 server over a corpus that has none) get a stable id derived
    from their contents: ``"sha1-"`` and the first 16 hex digits of the SHA-1 of the UTF-8 contents. The
    env's gold-retrieval figures then mean nothing, but episodes run.

    Args:
        url: The endpoint, e.g. ``"http://127.0.0.1:8000/retrieve"``; a URL without a path gets
            ``/retrieve``.
        timeout: Seconds allowed for one attempt, from connecting to the last byte of the answer.
        retries: Extra attempts after the first (``0``: fail at once).
        backoff: First pause between attempts, in seconds; doubles at each retry.
        max_backoff: Longest pause between attempts.
        max_batch: Most queries per request; larger batches are split (servers cap their payloads).
        max_response_bytes: Largest answer body read; a larger one is an error (and is not read further).
        patience: Seconds to keep waiting for a server that answered before and is now *not there* (no
            connection, a timeout, a status in :data:`RETRY_STATUSES`) once the ``retries`` are spent —
            a server that never answered fails once they are spent, in seconds —, retrying every
            ``max_backoff`` seconds: a server being restarted is waited for, and the call returns as if
            nothing happened. One line is written to ``log`` when the wait starts and one when the server
            answers again. A server that *answers wrong* (another 4xx, a malformed body) is never waited
            for. ``0`` (default): fail once the retries are spent.
        log: Where the waiting lines go (default: standard error).

    Raises:
        ConfigError: the URL or a number is invalid.
        MissingDependencyError: ``httpx`` is not installed (extra ``server``).
    """

    name = "http"

    def __init__(
        self,
        url: str,
        timeout: float = 10.0,
        retries: int = 2,
        backoff: float = 0.25,
        max_backoff: float = 4.0,
        max_batch: int = 256,
        max_response_bytes: int = 256 * 1024 * 1024,
        patience: float = 0.0,
        log: Callable[[str], None] | None = None,
    ) -> None:
        try:
            import httpx
        except ImportError:
            raise MissingDependencyError("httpx", "server", "The HTTP retriever") from None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"retriever URL must be http(s)://host[:port]/path, got {url!r}")
        if parts.path in ("", "/"):
            parts = parts._replace(path="/retrieve")
        if not (isinstance(timeout, int | float) and timeout > 0 and math.isfinite(timeout)):
            raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if not (isinstance(retries, int) and not isinstance(retries, bool) and retries >= 0):
            raise ConfigError(f"retries must be an integer >= 0, got {retries!r}")
        if not (backoff >= 0 and max_backoff >= 0):
            raise ConfigError(f"backoff and max_backoff must be >= 0, got {backoff!r}, {max_backoff!r}")
        if not (isinstance(patience, int | float) and patience >= 0 and math.isfinite(patience)):
            raise ConfigError(f"retriever patience must be a number of seconds >= 0, got {patience!r}")
        for name, value in (("max_batch", max_batch), ("max_response_bytes", max_response_bytes)):
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        self.url = urlunsplit(parts)
        self.timeout = float(timeout)
        self.retries = retries
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.max_batch = max_batch
        self.max_response_bytes = max_response_bytes
        self.patience = float(patience)
        self._log = log if log is not None else _to_stderr
        self._httpx = httpx
        self._lock = threading.Lock()
        self._client = self._new_client()

    def _new_client(self) -> Any:
        return self._httpx.Client(timeout=self._httpx.Timeout(self.timeout))

    @property
    def time_budget(self) -> float:
        """Upper bound, in seconds, of one request: every attempt's deadline plus the pauses between them."""
        pauses = sum(self._pause(attempt) for attempt in range(self.retries))
        return (self.retries + 1) * self.timeout + pauses

    def _pause(self, attempt: int) -> float:
        return min(self.backoff * 2**attempt, self.max_backoff)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if isinstance(queries, str):
            raise TypeError("queries must be a sequence of strings, not one string")
        results: list[list[Hit]] = []
        for start in range(0, len(queries), self.max_batch):
            results.extend(self._search_batch(list(queries[start : start + self.max_batch]), k))
        return results

    def close(self) -> None:
        with self._lock:
            self._client.close()

    def __enter__(self) -> HttpRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one request -------------------------------------------------------------------------------------

    def _search_batch(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:  # nothing to ask (a Search-R1 server answers {"result": []} anyway)
            return []
        payload = json.dumps({"queries": queries, "topk": k, "return_scores": True}).encode()
        body = self._post(payload)
        return self._parse(body, len(queries), k)

    def _post(self, payload: bytes) -> Any:
        """POSTs ``payload`` with retries (and ``patience``); returns the decoded JSON body of a 200 answer."""
        attempts = self.retries + 1
        last = ""
        waiting_since: float | None = None
        attempt = 0
        while True:
            if attempt:
                time.sleep(self._pause(attempt - 1))
            attempt += 1
            outcome = self._attempt(payload)
            if outcome.error is None:
                _ANSWERED.add(self.url)
            if outcome.error is not None:
                last = _describe(outcome.error)
                if not isinstance(outcome.error, self._httpx.TransportError | TimeoutError):
                    raise RetrieverError(f"retrieval server {self.url}: {last}") from outcome.error
            elif outcome.status in RETRY_STATUSES:
                last = f"HTTP {outcome.status}: {_detail(outcome)}"
            elif outcome.status != 200:
                raise RetrieverError(
                    f"retrieval server {self.url} rejected the request: HTTP {outcome.status}: "
                    f"{_detail(outcome)}"
                )
            else:
                if waiting_since is not None:
                    waited = time.monotonic() - waiting_since
                    self._log(f"retrieval server {self.url} is back after {waited:.0f}s; continuing")
                try:
                    return json.loads(outcome.body)
                except (ValueError, RecursionError):  # not JSON, not UTF-8, absurdly nested
                    raise RetrieverError(f"retrieval server {self.url} answered with invalid JSON") from None
            # not there (refused, reset, timed out, overloaded): transient
            if attempt < attempts:
                continue
            if self.url not in _ANSWERED:  # never up: a wrong address or a server not started, not a restart
                raise RetrieverError(
                    f"retrieval server {self.url} failed after {attempts} attempt{'s' * (attempts > 1)} "
                    f"(deadline {self.timeout:g}s each); last error: {last}; it never answered: is a server "
                    "running at that address? (--retriever-patience waits only for a server that answered before)"
                )
            if self.patience > 0 and waiting_since is None:
                waiting_since = time.monotonic()
                self._log(
                    f"retrieval server {self.url} is not answering ({last}); waiting up to "
                    f"{self.patience:g}s for it to come back (--retriever-patience)"
                )
            if waiting_since is None or time.monotonic() - waiting_since >= self.patience:
                then = "" if waiting_since is None else f", then waited {self.patience:g}s for it"
                raise RetrieverError(
                    f"retrieval server {self.url} failed after {attempts} attempt{'s' * (attempts > 1)} "
                    f"(deadline {self.timeout:g}s each){then}; last error: {last}"
                )

    def _attempt(self, payload: bytes) -> _Outcome:
        """One request, bounded by a total deadline of ``timeout`` seconds.

        The request runs in a worker thread; the caller waits at most ``timeout``. A worker that is still
        reading then is abandoned: it stops at its next chunk (or its next per-read timeout), closes its
        connection pool, and the retriever continues with a fresh one, so no stuck connection is reused.
        """
        with self._lock:
            client = self._client
        outcome = _Outcome()
        abandoned = threading.Event()
        deadline = time.monotonic() + self.timeout

        def run() -> None:
            try:
                self._exchange(client, payload, deadline, abandoned, outcome)
            except BaseException as e:  # handed to the caller, which raises it typed
                outcome.error = e
            finally:
                if abandoned.is_set():
                    client.close()

        worker = threading.Thread(target=run, name="searchgym-http", daemon=True)
        worker.start()
        worker.join(self.timeout)
        if worker.is_alive():
            abandoned.set()
            with self._lock:
                if self._client is client:
                    self._client = self._new_client()
            return _Outcome(error=TimeoutError(f"no complete answer within the {self.timeout:g}s deadline"))
        return outcome

    def _exchange(
        self, client: Any, payload: bytes, deadline: float, abandoned: threading.Event, outcome: _Outcome
    ) -> None:
        headers = {"content-type": "application/json"}
        with client.stream("POST", self.url, content=payload, headers=headers) as response:
            chunks, size = [], 0
            for chunk in response.iter_raw():
                if abandoned.is_set() or time.monotonic() > deadline:
                    raise _Abandoned
                size += len(chunk)
                if size > self.max_response_bytes:
                    raise _TooLarge(f"answer body over {self.max_response_bytes} bytes")
                chunks.append(chunk)
            outcome.status = response.status_code
            outcome.reason = response.reason_phrase
            outcome.body = b"".join(chunks)

    def _parse(self, body: Any, n_queries: int, k: int) -> list[list[Hit]]:
        """Reads the ``result`` lists of a response; any deviation from the wire format is an error."""
        result = body.get("result") if isinstance(body, dict) else None
        if not isinstance(result, list) or len(result) != n_queries:
            got = f"{len(result)} lists" if isinstance(result, list) else "no 'result' list"
            raise RetrieverError(f"retrieval server {self.url} answered {got} for {n_queries} queries")
        hits: list[list[Hit]] = []
        for i, entries in enumerate(result):
            if not isinstance(entries, list) or len(entries) > k:
                raise RetrieverError(
                    f"retrieval server {self.url}: result {i} must be a list of at most {k} documents"
                )
            hits.append([self._hit(entry, i) for entry in entries])
        return hits

    def _hit(self, entry: Any, i: int) -> Hit:
        # {"document": doc, "score": s} with scores; the bare document without (as Search-R1 answers).
        if isinstance(entry, dict) and "document" in entry:
            document, score = entry["document"], entry.get("score", math.nan)
        else:
            document, score = entry, math.nan
        if not isinstance(document, dict):
            raise RetrieverError(f"retrieval server {self.url}: result {i} holds a non-object document")
        raw: str | None = None
        if isinstance(document.get("contents"), str):
            raw = document["contents"]
            title, text = parse_contents(raw)
        elif isinstance(document.get("title"), str) and isinstance(document.get("text"), str):
            title, text = document["title"], document["text"]  # corpora stored as title/text columns
        else:
            raise RetrieverError(
                f"retrieval server {self.url}: result {i} holds a document without 'contents'"
            )
        if not isinstance(score, int | float) or isinstance(score, bool):
            raise RetrieverError(f"retrieval server {self.url}: result {i} holds a non-numeric score")
        pid = document.get("id")
        if pid is None:
            pid = derived_id(raw if raw is not None else f'"{title}"\n{text}')
        elif not isinstance(pid, str | int) or isinstance(pid, bool):
            raise RetrieverError(f"retrieval server {self.url}: result {i} holds an id that is not a string")
        return Hit(str(pid), title, text, float(score), raw)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def derived_id(contents: str) -> str:
    """The stable id given to a document that comes without one: ``"sha1-"`` + 16 hex digits of its SHA-1."""
    return "sha1-" + hashlib.sha1(contents.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _describe(error: BaseException) -> str:
    if isinstance(error, _Abandoned | TimeoutError):
        return "TimeoutError: no complete answer within the deadline"
    message = str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def _detail(outcome: _Outcome) -> str:
    """The server's error message: FastAPI's ``detail`` when present, else the start of the body."""
    try:
        body = json.loads(outcome.body)
    except (ValueError, RecursionError):
        return outcome.body[:200].decode("utf-8", "replace") or outcome.reason
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])[:500]
    return str(body)[:200]
