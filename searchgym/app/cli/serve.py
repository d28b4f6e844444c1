"""``searchgym serve``: a Search-R1-compatible ``/retrieve`` server over a FlashRAG corpus."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

COMMAND = ("serve",)
HELP = "serve a FlashRAG corpus over HTTP with Search-R1's POST /retrieve protocol (and GET /health)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--corpus", required=True, help="FlashRAG folder (with corpus.jsonl) or a corpus.jsonl"
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument(
        "--retriever",
        default="bm25",
        help="bm25, rank_bm25, dense:INDEX_DIR (an index of this corpus built by searchgym index dense), or "
        "hybrid:INDEX_DIR (BM25 and that index fused by reciprocal rank)",
    )
    parser.add_argument(
        "--device", default="cpu", help="torch device of a dense retriever's query encoder (cpu, cuda ...)"
    )
    parser.add_argument(
        "--index",
        default=None,
        help="bm25 index folder: loaded when it matches the corpus, built and saved there when the folder is "
        "empty or absent (a folder holding other files, or a stale index, needs --overwrite)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="let --index write into a folder that holds other files, or rebuild a stale index there",
    )
    parser.add_argument("--default-topk", type=int, default=3, help="topk of requests that give none")
    parser.add_argument("--topk-max", type=int, default=100, help="largest topk a request may ask")
    parser.add_argument(
        "--max-queries",
        type=int,
        default=4096,
        help="most queries per request (a Search-R1 step sends 2,560)",
    )
    parser.add_argument(
        "--max-query-tokens", type=int, default=256, help="longer queries are cut to this many words"
    )
    parser.add_argument(
        "--max-response-mb",
        type=int,
        default=64,
        help="largest answer in MiB; a request whose answer could be larger (each query's topk largest "
        "passages) gets 413 before scoring",
    )
    parser.add_argument(
        "--max-concurrent",
        type=int,
        default=2,
        help="requests scored, rendered and sent at the same time (others wait)",
    )
    add_connection_arguments(parser, body_mb=16)
    parser.add_argument(
        "--write-timeout",
        type=float,
        default=30.0,
        help="seconds a client has to read its answer (disconnected after; the answer holds a "
        "--max-concurrent slot until then)",
    )
    parser.add_argument("--log-level", default="info", help="uvicorn log level")


def add_connection_arguments(parser: argparse.ArgumentParser, body_mb: int) -> None:
    """``--read-timeout``, ``--max-connections`` and ``--max-body-mb``: the guards both servers share
    (``searchgym serve``, ``searchgym openenv serve``); ``body_mb`` is this server's default body limit."""
    parser.add_argument(
        "--read-timeout",
        type=float,
        default=10.0,
        help="seconds a client has to send a request's headers (closed after), and its body (408 after)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=1024,
        help="open connections at most (fewer if ulimit -n leaves less room); one more closes the "
        "connection waiting longest for a request",
    )
    parser.add_argument(
        "--max-body-mb",
        type=float,
        default=float(body_mb),
        help="largest request body in MiB (413 over it); each request in progress may hold this much",
    )


def connection_limits(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~searchgym.server.ServerLimits` fields of :func:`add_connection_arguments`' options.

    Raises:
        ConfigError: ``--max-body-mb`` is not a positive number (the other fields are checked by
            :class:`~searchgym.server.ServerLimits`).
    """
    import math

    from searchgym.errors import ConfigError

    body_mb = args.max_body_mb
    if not (math.isfinite(body_mb) and body_mb > 0 and int(body_mb * 2**20) >= 1):
        raise ConfigError(f"--max-body-mb must be a positive number of MiB, got {body_mb!r}")
    return {
        "read_timeout": args.read_timeout,
        "max_connections": args.max_connections,
        "max_body_bytes": int(body_mb * 2**20),
    }


def run(args: argparse.Namespace) -> int:
    from searchgym.app.cli._index import check_index_folder
    from searchgym.data.flashrag import read_corpus
    from searchgym.data.jsonl import iter_jsonl
    from searchgym.errors import ConfigError
    from searchgym.retrieval import BM25Retriever, Retriever, make_retriever
    from searchgym.retrieval.dense import retriever_from_spec
    from searchgym.server import ServerLimits, create_app, run_server

    limits = ServerLimits(
        default_topk=args.default_topk,
        topk_max=args.topk_max,
        max_queries=args.max_queries,
        max_query_tokens=args.max_query_tokens,
        max_response_bytes=args.max_response_mb * 2**20,
        max_concurrent=args.max_concurrent,
        write_timeout=args.write_timeout,
        **connection_limits(args),
    )
    path = Path(args.corpus).expanduser()
    corpus_path = path / "corpus.jsonl" if path.is_dir() else path
    if not corpus_path.is_file():
        raise ConfigError(f"no corpus at {corpus_path} (give a FlashRAG folder or a corpus.jsonl)")
    passages = read_corpus(corpus_path)
    # The records' contents as stored, served byte for byte (read_corpus normalises the title line).
    contents = {str(rec["id"]): rec["contents"] for _, rec in iter_jsonl(corpus_path)}
    if args.index is not None and args.retriever != "bm25":
        raise ConfigError("--index applies to the bm25 retriever only")
    retriever: Retriever
    found = retriever_from_spec(args.retriever, passages, device=args.device)
    if found is not None:
        retriever = found
        print(f"loaded the dense index of --retriever {args.retriever}")
    elif args.index is not None and (Path(args.index) / "bm25.json").is_file() and not args.overwrite:
        # Memory-mapped: server replicas on one machine share one copy. A stale index is a ConfigError.
        retriever = BM25Retriever.load(args.index, passages, mmap=True)
        print(f"loaded the BM25 index in {args.index}")
    else:
        if args.index is not None:  # the rule of `index bm25 --out`: other files are replaced only when asked
            check_index_folder(args.index, args.overwrite, "--index")
        retriever = make_retriever(args.retriever, passages)
        if args.index is not None and isinstance(retriever, BM25Retriever):
            retriever.save(args.index)
            print(f"saved the BM25 index to {args.index}")
    app = create_app(retriever, passages, limits, contents=contents)

    def ready(url: str) -> None:  # called once the port is bound
        print(f"serving {len(passages)} passages with {retriever.name} on {url}/retrieve", flush=True)

    run_server(app, host=args.host, port=args.port, log_level=args.log_level, on_ready=ready)
    return 0
