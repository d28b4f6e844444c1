"""``searchgym conform``: check a training stack's multi-turn bookkeeping against scripted SearchQA episodes."""

from __future__ import annotations

import argparse

COMMAND = ("conform",)
HELP = (
    "check a training stack's multi-turn bookkeeping against the token-exact env: scripted episodes through "
    "its batch building and loss, one line per check (masks, log-probs, stops, transcript, vocabulary, "
    "advantages, aggregation); exit 1 if a check fails"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine",
        default="native",
        metavar="ENGINE",
        help="the stack: native (train grpo), trl (TRL's GRPOTrainer), verl (verl's agent loop and ppo_loss, "
        "in the verl virtualenv), or MODULE:ADAPTER, a function of your own (docs/conform.md)",
    )
    parser.add_argument(
        "--model",
        default=None,
        metavar="NAME_OR_PATH",
        help="a model (with its tokenizer) loaded offline as the policy (default: a tiny random model over "
        "the built-in tokenizer)",
    )
    parser.add_argument("--json", action="store_true", help="print the checks as one JSON object")


def run(args: argparse.Namespace) -> int:
    from searchgym.app.conform.runner import load_adapter, prepare, run_conformance
    from searchgym.app.doctor.report import Check, exit_code, format_check, report_json

    adapter = load_adapter(args.engine)
    model = tokenizer = None
    if args.model:
        from searchgym.agents.llm.model import load_pretrained
        from searchgym.app.doctor.model import offline, quiet_transformers
        from searchgym.tokenization import load_tokenizer

        with offline(), quiet_transformers():
            tokenizer = load_tokenizer(args.model)
            model = load_pretrained(args.model)
    results = run_conformance(adapter, prepare(model, tokenizer))
    checks = [Check(r.name, r.status, True, r.detail, r.fix) for r in results]
    print(report_json(checks) if args.json else "\n".join(format_check(c) for c in checks))
    return exit_code(checks)
