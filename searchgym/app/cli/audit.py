"""``searchgym audit``: whether each question of a dataset could be answered from its corpus, and whether a
retriever reaches the answer at top-k (:mod:`searchgym.audit`)."""

from __future__ import annotations

import argparse
import json
import sys

from searchgym.app.cli._common import positive_int

COMMAND = ("audit",)
HELP = (
    "audit a dataset: questions whose answer or gold passage is missing from the corpus, and those the "
    "retriever does not reach at top-k, by question kind"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dataset", metavar="DATASET", help="a FlashRAG folder (corpus.jsonl, SPLIT.jsonl) or 'world'"
    )
    parser.add_argument("--split", default="test", help="the split, or a slice of it (test[:100])")
    parser.add_argument(
        "--retriever", default="bm25", help="the retriever of the oracle queries (as eval's --retriever)"
    )
    parser.add_argument("--topk", type=positive_int, default=3, help="the k at which a question is reachable")
    parser.add_argument(
        "--world-seed", type=int, default=0, help="seed of the generated world (DATASET world)"
    )
    parser.add_argument(
        "--out", default=None, metavar="FILE.jsonl", help="write one audit record per question"
    )
    parser.add_argument("--json", action="store_true", help="print the counts and shares as one JSON object")


def run(args: argparse.Namespace) -> int:
    from searchgym.audit import audit_questions, audit_shares, audit_table
    from searchgym.data import load_dataset
    from searchgym.retrieval import make_retriever

    dataset = load_dataset(args.dataset, world_seed=args.world_seed)
    questions = dataset.questions(args.split)
    retriever = make_retriever(args.retriever, dataset.passages)
    try:
        records = audit_questions(dataset, questions, retriever, args.topk)
    finally:
        retriever.close()
    shares = audit_shares(records)
    if args.out is not None:
        from pathlib import Path

        from searchgym.data.jsonl import replace_on_success

        with replace_on_success(Path(args.out)) as partial:
            partial.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    if args.json:
        print(
            json.dumps({"dataset": args.dataset, "split": args.split, "retriever": args.retriever, **shares})
        )
        return 0
    print(f"Audit of {args.dataset} ({args.split}), retriever {args.retriever}, top-{args.topk}:")
    print("")
    print("\n".join(audit_table(shares)))
    return 0
