"""``searchgym openenv serve``: SearchQA as an OpenEnv environment server (extra ``searchgym[openenv]``)."""

from __future__ import annotations

import argparse
from typing import Any

from searchgym.cli._common import add_env_arguments, run_env_defaults
from searchgym.cli.serve import add_connection_arguments, connection_limits

COMMAND = ("openenv", "serve")
HELP = (
    "serve turn-level SearchQA (search and answer actions, the answer metric as reward) as an OpenEnv "
    "environment: WebSocket sessions for EnvClient, /health, /schema, /reset, /step"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default=None, help="FlashRAG folder (default: the generated world)")
    parser.add_argument("--world-seed", type=int, default=0, help="seed of the generated world")
    parser.add_argument("--split", default="train", help="question split")
    parser.add_argument(
        "--retriever",
        default="bm25",
        help="bm25, rank_bm25, dense:INDEX_DIR, hybrid:INDEX_DIR, or the URL of a /retrieve server",
    )
    add_env_arguments(
        parser,
        run_env_defaults(),
        env_id=False,
        tokenizer=False,
        title="retrieval",
        only=("retriever_patience",),
    )
    parser.add_argument(
        "--index",
        default=None,
        help="a BM25 index folder of the dataset's corpus (searchgym index bm25), loaded instead of "
        "indexing the corpus at start (bm25 retriever only)",
    )
    parser.add_argument("--topk", type=int, default=3, help="passages per search")
    parser.add_argument(
        "--max-turns",
        type=int,
        default=4,
        help="turns per episode, the answer included (searches: one fewer)",
    )
    parser.add_argument(
        "--max-passage-words",
        type=int,
        default=None,
        help="cut each passage to this many words (default: no cut)",
    )
    parser.add_argument("--reward", default="em", choices=("em", "subem", "f1"), help="answer metric")
    parser.add_argument("--seed", type=int, default=0, help="seed of each session's question draw")
    parser.add_argument("--max-sessions", type=int, default=64, help="WebSocket sessions open at once")
    parser.add_argument(
        "--session-timeout",
        type=float,
        default=300.0,
        help="seconds a WebSocket session may stay silent before it is closed and its slot freed",
    )
    add_connection_arguments(parser, body_mb=1)
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument("--log-level", default="info", help="uvicorn log level")


def build_app(args: argparse.Namespace) -> Any:
    """The OpenEnv app of these options (also what ``searchgym.openenv.app`` serves)."""
    from searchgym.openenv.environment import SearchQAEnvOptions
    from searchgym.openenv.server import create_searchqa_app
    from searchgym.server import ServerLimits

    options = SearchQAEnvOptions(
        dataset=args.dataset,
        world_seed=args.world_seed,
        split=args.split,
        retriever=args.retriever,
        retriever_patience=args.retriever_patience,
        topk=args.topk,
        max_turns=args.max_turns,
        max_passage_words=args.max_passage_words,
        reward=args.reward,
        seed=args.seed,
    )
    return create_searchqa_app(
        options,
        index=args.index,
        max_sessions=args.max_sessions,
        limits=ServerLimits(**connection_limits(args)),
        session_timeout=args.session_timeout,
    )


def run(args: argparse.Namespace) -> int:
    from searchgym.openenv.server import serve

    app = build_app(args)

    def ready(url: str) -> None:  # called once the port is bound
        print(f"serving SearchQA (OpenEnv) on {url} (WebSocket {url}/ws)", flush=True)

    serve(app, host=args.host, port=args.port, log_level=args.log_level, on_ready=ready)
    return 0
