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
  head, and at most ``max_connections`` are open (see :mod:`searchgym.server.connections`).

FastAPI and uvicorn come with the ``server`` extra and are imported only when a server is built.
"""

from .app import ABORT_KEY, create_app
from .process import ServerThread, bind_socket, run_server
from .wire import RequestError, RetrieveRequest, ServerLimits, loads_bounded, parse_request, truncate_query

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
