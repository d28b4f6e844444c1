"""``searchgym data get``: Search-R1's QA sets and the wiki-18 corpus, fetched into FlashRAG folders."""

from __future__ import annotations

import argparse
import json
import sys

COMMAND = ("data", "get")
HELP = (
    "fetch the QA sets Search-R1 evaluates on (FlashRAG's copies) and the wiki-18 corpus into FlashRAG "
    "folders: resumable, verified against the published hashes"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from searchgym.data.download import CORPUS, DEFAULT_BASE_URL, INDEX, QA_SETS

    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"what to fetch: QA sets ({', '.join(QA_SETS)}), the corpus ({CORPUS}, 21M passages, about 13 GB "
        f"of text) and its e5 index ({INDEX}, Search-R1's faiss file for its own retrieval server)",
    )
    parser.add_argument(
        "--out", default=None, help="folder to write: OUT/NAME/{split}.jsonl, OUT/wiki-18/corpus.jsonl"
    )
    parser.add_argument(
        "--base-url",
        default=DEFAULT_BASE_URL,
        help="the host of the Hugging Face dataset repositories (or a mirror with the same layout)",
    )
    parser.add_argument("--revision", default="main", help="branch, tag or commit of the repositories")
    parser.add_argument(
        "--retries", type=int, default=5, help="resumed attempts per file after a dropped connection"
    )
    parser.add_argument(
        "--retry-wait", type=float, default=2.0, help="seconds before the first retry (doubling, at most 60)"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a connection may stay silent")
    parser.add_argument(
        "--accept-unverified",
        action="store_true",
        help="take a file the package does not pin and whose host publishes no hash, unchecked (a note says "
        "so); without it such a file is refused before it is read",
    )
    parser.add_argument(
        "--list", action="store_true", help="print every name and its source files, fetch nothing"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from searchgym.data.download import catalog, get
    from searchgym.errors import ConfigError

    if args.list:
        for name, files in catalog().items():
            sources = ", ".join(f.url(args.base_url, args.revision) for f in files)
            print(f"{name}: {sources}")
        return 0
    if args.out is None:
        raise ConfigError("--out is required: the folder to write (e.g. --out data)")
    if args.retries < 0 or args.retry_wait < 0 or args.timeout <= 0:
        raise ConfigError("--retries and --retry-wait must be >= 0 and --timeout > 0")
    summary = get(
        args.names,
        args.out,
        base_url=args.base_url,
        revision=args.revision,
        retries=args.retries,
        retry_wait=args.retry_wait,
        timeout=args.timeout,
        progress=not args.no_progress,
        accept_unverified=args.accept_unverified,
    )
    for name in summary["no_corpus"]:
        print(
            f"note: {args.out}/{name} has questions but no corpus.jsonl yet: `searchgym data get wiki-18 --out "
            f"{args.out}` fetches the corpus and links it into every QA folder",
            file=sys.stderr,
        )
    print(json.dumps(summary))
    return 0
