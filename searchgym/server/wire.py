"""The retrieval protocol's requests: what one may ask (:class:`ServerLimits`), and a bounded parser for it.

:func:`parse_request` turns a ``POST /retrieve`` body into a :class:`RetrieveRequest` or a
:class:`RequestError` carrying the 4xx status and message the client gets; :func:`loads_bounded` is the JSON
parser under it that stops at a value budget. See :mod:`searchgym.server` for the wire format.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from json.scanner import make_scanner
from typing import Any

from searchgym.errors import ConfigError

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
