"""``searchgym index bm25``: build a BM25 index of a corpus and save it (``searchgym serve --index``)."""

from __future__ import annotations

import argparse
import time

from searchgym.app.cli._index import add_corpus_arguments, check_index_folder, load_corpus, report
from searchgym.app.cli._manifest import write_index_manifest

COMMAND = ("index", "bm25")
HELP = (
    "build the BM25 index of a corpus and save it to a folder (loaded by serve --index or BM25Retriever.load)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_corpus_arguments(parser)
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write into an --out that already holds files (an earlier index; refused otherwise)",
    )


def run(args: argparse.Namespace) -> int:
    from searchgym.retrieval import BM25Retriever

    check_index_folder(args.out, args.overwrite, "--out")
    passages, dataset = load_corpus(args)
    start = time.perf_counter()
    retriever = BM25Retriever(passages, progress=not args.no_progress)
    retriever.save(args.out)
    write_index_manifest(args, "bm25")
    summary = {
        "index": "bm25",
        "out": str(args.out),
        "passages": len(passages),
        "bytes": retriever.nbytes,
        "seconds": round(time.perf_counter() - start, 3),
    }
    report(args, summary, retriever, dataset)
    return 0
