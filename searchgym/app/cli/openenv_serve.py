"""``searchgym openenv serve``: SearchQA as an OpenEnv environment server (extra ``searchgym[openenv]``)."""

from __future__ import annotations

import argparse
from typing import Any

from searchgym.app.cli._common import add_env_arguments, env_spec_from_args, run_env_defaults
from searchgym.app.cli.serve import add_connection_arguments, connection_limits

COMMAND = ("openenv", "serve")
HELP = (
    "serve turn-level SearchQA (search and answer actions, the answer metric as reward) as an OpenEnv "
    "environment: WebSocket sessions for EnvClient, /health, /schema, /reset, /step"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env = parser.add_argument_group(
        "environment",
        "every SearchQA-v0 option; the token budgets and --prompt-style change nothing here (a turn-level "
        "episode has no token transcript; the trainer's chat template renders the prompt)",
    )
    add_env_arguments(env, run_env_defaults(), env_id=False, tokenizer=False)
    parser.add_argument(
        "--index",
        default=None,
        help="a BM25 index folder of the dataset's corpus (searchgym index bm25), loaded instead of "
        "indexing the corpus at start (bm25 retriever only)",
    )
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
    """The OpenEnv app of these options (also what ``searchgym.app.openenv.app`` serves)."""
    from searchgym.app.openenv.server import create_searchqa_app
    from searchgym.server import ServerLimits

    return create_searchqa_app(
        env_spec_from_args(args, run_env_defaults()),
        seed=args.seed,
        index=args.index,
        max_sessions=args.max_sessions,
        limits=ServerLimits(**connection_limits(args)),
        session_timeout=args.session_timeout,
    )


def run(args: argparse.Namespace) -> int:
    from searchgym.app.openenv.server import serve

    app = build_app(args)

    def ready(url: str) -> None:  # called once the port is bound
        print(f"serving SearchQA (OpenEnv) on {url} (WebSocket {url}/ws)", flush=True)

    serve(app, host=args.host, port=args.port, log_level=args.log_level, on_ready=ready)
    return 0
