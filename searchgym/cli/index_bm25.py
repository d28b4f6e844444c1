"""``searchgym index bm25``: build a BM25 index of a corpus and save it (``searchgym serve --index``)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from searchgym.cli._index import add_corpus_arguments, load_corpus, report
from searchgym.cli._manifest import write_index_manifest
from searchgym.errors import ConfigError

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


def check_out(out: str | Path, overwrite: bool) -> None:
    """Refuses an ``--out`` that already holds files (another corpus's index, a dense index, anything) unless
    ``overwrite``: the BM25 files and the folder's manifest would replace theirs.

    Raises:
        ConfigError: ``out`` is a file, or a non-empty folder and ``overwrite`` is not set.
    """
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--out {str(root)!r} is a file, not an index folder")
    held = sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) if root.is_dir() else []
    if held and not overwrite:
        shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
        raise ConfigError(
            f"--out {str(root)!r} already holds files ({shown}); pass --overwrite to write the BM25 index over "
            "them, or choose another --out"
        )


def run(args: argparse.Namespace) -> int:
    from searchgym.retrieval import BM25Retriever

    check_out(args.out, args.overwrite)
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
