"""``searchgym validate-env``: OpenEnv's local validation checks on a SearchQA OpenEnv server."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator

from searchgym.app.cli._common import add_env_arguments, env_spec_from_args, run_env_defaults
from searchgym.envs.spec import EnvSpec

COMMAND = ("validate-env",)
HELP = (
    "run OpenEnv's validation checks (oracle reaches the maximum, canaries score the floor, no answer "
    "leaks, seeded determinism, state, exactly two tools) on a SearchQA OpenEnv server"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from searchgym.app.hub.checks import CHECKS

    env = parser.add_argument_group(
        "environment",
        "the server's SearchQA options (a server started here gets them; with --url, give "
        "the ones the server was started with)",
    )
    add_env_arguments(env, run_env_defaults(), env_id=False, tokenizer=False)
    parser.add_argument(
        "--url",
        default=None,
        help="a running `searchgym openenv serve` (default: one started here on loopback)",
    )
    parser.add_argument(
        "--manifest",
        default=None,
        help="the OpenEnv manifest with the validation block (default: ./openenv.yaml if present, else "
        "searchgym's numbers: rewards in [0, 1], oracle tolerance 0, floor margin 0.1)",
    )
    parser.add_argument("--questions", type=int, default=5, help="questions per kind of trajectory")
    parser.add_argument(
        "--check", action="append", choices=CHECKS, default=None, help="run only this check (repeatable)"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


@contextlib.contextmanager
def _server(spec: EnvSpec, url: str | None) -> Iterator[str]:
    if url is not None:
        yield url.rstrip("/")
        return
    from searchgym.app.openenv.server import create_searchqa_app
    from searchgym.server import ServerThread

    with ServerThread(create_searchqa_app(spec)) as server:
        yield server.url


def run(args: argparse.Namespace) -> int:
    from searchgym.app.hub.checks import CHECKS, results_json, run_checks

    spec = env_spec_from_args(args, run_env_defaults())
    with _server(spec, args.url) as url:
        results = run_checks(
            url, spec, manifest=args.manifest, questions=args.questions, only=args.check or CHECKS
        )
    if args.json:
        print(results_json(results))
    else:
        for r in results:
            print(f"{'PASS' if r.passed else 'FAIL'} {r.name}: {r.detail}")
    failed = [r.name for r in results if not r.passed]
    if failed:
        print(f"validate-env: {len(failed)} check(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
