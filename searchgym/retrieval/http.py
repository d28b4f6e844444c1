"""A client of Search-R1-compatible retrieval servers (``POST /retrieve``), as a :class:`Retriever`.

Wire format (Search-R1's ``retrieval_server.py``, also spoken by ``searchgym serve``)::

    POST /retrieve  {"queries": ["q1", ...], "topk": 3, "return_scores": true}
    200             {"result": [[{"document": {"id": "12", "contents": "\\"Title\\"\\ntext"}, "score": 7.1}, ...], ...]}

With ``return_scores`` false, Search-R1 answers each list with the bare documents; the client reads both
shapes. Failures are never returned as text: after bounded retries the client raises
:class:`~searchgym.errors.RetrieverError` with the reason.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from searchgym.data.flashrag import parse_contents
from searchgym.errors import ConfigError, MissingDependencyError, RetrieverError
from searchgym.retrieval.base import Hit, Retriever

__all__ = ["RETRY_STATUSES", "HttpRetriever"]

#: HTTP statuses worth retrying: overload and gateway trouble are transient, and a retrieval request is
#: idempotent. Other 4xx/5xx answers are final (the request itself is wrong, or the server is broken).
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class HttpRetriever(Retriever):
    """Searches through a remote ``/retrieve`` endpoint, one HTTP request per batch of queries.

    One ``httpx.Client`` is kept open, so consecutive calls reuse the connection. A failed attempt (no
    connection, a timeout, a dropped connection, or a status in :data:`RETRY_STATUSES`) is retried up to
    ``retries`` times, sleeping ``backoff * 2**attempt`` seconds (capped at ``max_backoff``) in between.
    Every attempt is bounded by ``timeout``, so a call returns or raises within :attr:`time_budget`
    seconds (plus the time to read a response that keeps arriving).

    Args:
        url: The endpoint, e.g. ``"http://127.0.0.1:8000/retrieve"``; a URL without a path gets
            ``/retrieve``.
        timeout: Seconds allowed for each phase of one attempt (connect, send, each read).
        retries: Extra attempts after the first (``0``: fail at once).
        backoff: First pause between attempts, in seconds; doubles at each retry.
        max_backoff: Longest pause between attempts.
        max_batch: Most queries per request; larger batches are split (servers cap their payloads).

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
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if not (isinstance(retries, int) and retries >= 0):
            raise ConfigError(f"retries must be an integer >= 0, got {retries!r}")
        if not (backoff >= 0 and max_backoff >= 0):
            raise ConfigError(f"backoff and max_backoff must be >= 0, got {backoff!r}, {max_backoff!r}")
        if not (isinstance(max_batch, int) and max_batch >= 1):
            raise ConfigError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        self.url = urlunsplit(parts)
        self.timeout = float(timeout)
        self.retries = retries
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.max_batch = max_batch
        self._httpx = httpx
        self._client = httpx.Client(timeout=httpx.Timeout(self.timeout))

    @property
    def time_budget(self) -> float:
        """Upper bound, in seconds, of one request's attempts and pauses (each attempt's phases bounded)."""
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
        self._client.close()

    def __enter__(self) -> HttpRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one request -------------------------------------------------------------------------------------

    def _search_batch(self, queries: list[str], k: int) -> list[list[Hit]]:
        payload = {"queries": queries, "topk": k, "return_scores": True}
        body = self._post(payload)
        return self._parse(body, len(queries), k)

    def _post(self, payload: dict[str, Any]) -> Any:
        """POSTs ``payload`` with retries; returns the decoded JSON body of a 200 answer."""
        httpx = self._httpx
        attempts = self.retries + 1
        last = ""
        for attempt in range(attempts):
            if attempt:
                time.sleep(self._pause(attempt - 1))
            try:
                response = self._client.post(self.url, json=payload)
            except httpx.TransportError as e:  # refused, reset, timed out, protocol error
                last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                continue
            except httpx.HTTPError as e:  # not transient (e.g. a body that cannot be decoded)
                raise RetrieverError(f"retrieval server {self.url}: {type(e).__name__}: {e}") from None
            if response.status_code in RETRY_STATUSES:
                last = f"HTTP {response.status_code}: {_detail(response)}"
                continue
            if response.status_code != 200:
                raise RetrieverError(
                    f"retrieval server {self.url} rejected the request: HTTP {response.status_code}: "
                    f"{_detail(response)}"
                )
            try:
                return response.json()
            except ValueError:
                raise RetrieverError(f"retrieval server {self.url} answered with invalid JSON") from None
        raise RetrieverError(
            f"retrieval server {self.url} failed after {attempts} attempt{'s' * (attempts > 1)} "
            f"(timeout {self.timeout:g}s each); last error: {last}"
        )

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
        if not isinstance(document, dict) or "id" not in document:
            raise RetrieverError(f"retrieval server {self.url}: result {i} holds a document without an 'id'")
        if isinstance(document.get("contents"), str):
            title, text = parse_contents(document["contents"])
        elif isinstance(document.get("title"), str) and isinstance(document.get("text"), str):
            title, text = document["title"], document["text"]  # corpora stored as title/text columns
        else:
            raise RetrieverError(
                f"retrieval server {self.url}: result {i} holds a document without 'contents'"
            )
        if not isinstance(score, int | float) or isinstance(score, bool):
            raise RetrieverError(f"retrieval server {self.url}: result {i} holds a non-numeric score")
        return Hit(str(document["id"]), title, text, float(score))


def _detail(response: Any) -> str:
    """The server's error message: FastAPI's ``detail`` when present, else the start of the body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200] or response.reason_phrase
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])[:500]
    return str(body)[:200]
