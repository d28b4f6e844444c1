"""``searchgym serve-policy``: a trained checkpoint (or exported folder) as an OpenAI-compatible server."""

from __future__ import annotations

import argparse
from pathlib import Path

from searchgym.app.cli._common import positive_int
from searchgym.app.cli.serve import add_connection_arguments, connection_limits

COMMAND = ("serve-policy",)
HELP = (
    "serve a trained checkpoint or exported folder as OpenAI-compatible /v1/completions and "
    "/v1/chat/completions (evaluate it with --agent openai:NAME --base-url URL/v1)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint", metavar="CKPT", help="a train sft/grpo checkpoint.pt, or a folder from export"
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--port", type=int, default=8001, help="port to listen on (0: a free one)")
    parser.add_argument(
        "--model-name",
        default=None,
        help="the model name requests give (default: the checkpoint's file name)",
    )
    parser.add_argument("--device", default="cpu", help="torch device of the model (cpu, cuda ...)")
    parser.add_argument(
        "--max-tokens-max",
        type=positive_int,
        default=512,
        help="the most tokens one request may generate (and the default of one that asks none)",
    )
    parser.add_argument(
        "--max-prompt-tokens",
        type=positive_int,
        default=None,
        help="the longest prompt in tokens (default and most: the model's context size less one, room for one "
        "generated token)",
    )
    parser.add_argument(
        "--max-waiting",
        type=positive_int,
        default=64,
        help="requests waiting for the model at once (one generation runs at a time); one more gets 503",
    )
    add_connection_arguments(parser, body_mb=4)
    parser.add_argument("--log-level", default="info", help="uvicorn log level")


def run(args: argparse.Namespace) -> int:
    from searchgym.agents.llm.completer import PolicyCompleter, context_size
    from searchgym.agents.training.export import load_policy
    from searchgym.server import ServerLimits, run_server
    from searchgym.server.completions import CompletionLimits, create_completions_app

    connection = ServerLimits(**connection_limits(args))  # options out of range are refused before loading
    policy = load_policy(args.checkpoint, device=args.device)
    context = context_size(policy.model)
    limits = CompletionLimits(
        max_tokens_max=args.max_tokens_max,
        max_prompt_tokens=args.max_prompt_tokens or max(1, context - 1),
        max_waiting=args.max_waiting,
        context_tokens=context,
        connection=connection,
    )
    name = args.model_name or Path(args.checkpoint).name
    app = create_completions_app(PolicyCompleter(policy, context), name, limits)

    def ready(url: str) -> None:  # called once the port is bound
        print(f"serving {name} ({args.checkpoint}) on {url}/v1 (completions, chat/completions)", flush=True)

    run_server(app, host=args.host, port=args.port, log_level=args.log_level, on_ready=ready)
    return 0
