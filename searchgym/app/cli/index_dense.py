"""``searchgym index dense``: encode a corpus with a Hugging Face encoder and build a dense (faiss) index."""

from __future__ import annotations

import argparse
import sys
import time

from searchgym.app.cli._index import add_corpus_arguments, load_corpus, report
from searchgym.app.cli._manifest import write_index_manifest

COMMAND = ("index", "dense")
HELP = (
    "encode a corpus with a Hugging Face encoder (or 'tiny') and build a faiss index, resumably: run the "
    "same command again after an interruption and it goes on where it stopped"
)


TINY_NOTE = (
    "note: --encoder tiny has random weights: it checks the plumbing, not retrieval (recall@3 0.018 on the "
    "NQ sample where BM25 has 0.869, docs/retrieval.md); for real dense retrieval give a trained encoder's "
    "folder, e.g. e5-base-v2"
)
"""Printed when ``--encoder tiny`` is used (its figures: docs/retrieval.md, "Recall of the tiny encoder")."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from searchgym.retrieval.dense import DEFAULT_PREFIXES, INDEX_TYPES, POOLINGS

    add_corpus_arguments(parser)
    parser.add_argument(
        "--encoder",
        required=True,
        help="'tiny' (random weights: a plumbing check, chance-level retrieval) or the local folder of a checkpoint such as "
        "e5-base-v2 (huggingface-cli download intfloat/e5-base-v2 --local-dir e5-base-v2)",
    )
    parser.add_argument(
        "--pooling", default="mean", choices=POOLINGS, help="how token states become one vector"
    )
    parser.add_argument("--query-prefix", default=DEFAULT_PREFIXES[0], help="put before every query (e5's)")
    parser.add_argument(
        "--passage-prefix", default=DEFAULT_PREFIXES[1], help="put before every passage (e5's)"
    )
    parser.add_argument(
        "--no-prefixes", action="store_true", help="no query or passage prefix (encoders other than e5)"
    )
    parser.add_argument("--max-length", type=int, default=512, help="tokens per text; longer ones are cut")
    parser.add_argument("--batch-size", type=int, default=64, help="texts per forward pass")
    parser.add_argument(
        "--chunk-size", type=int, default=8192, help="passages encoded between two saved steps of the build"
    )
    parser.add_argument(
        "--index-type",
        default="flat",
        choices=INDEX_TYPES,
        help="flat: exact; ivf or hnsw: approximate, for millions of passages",
    )
    parser.add_argument("--device", default="cpu", help="torch device of the encoder (cpu, cuda, cuda:1 ...)")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="discard the dense index (finished or half-built) in --out and start again",
    )


def run(args: argparse.Namespace) -> int:
    from searchgym.retrieval.dense import DenseRetriever, build_dense_index, load_encoder, read_manifest
    from searchgym.retrieval.encoders import TINY

    if args.encoder == TINY:
        print(TINY_NOTE, file=sys.stderr)
    passages, dataset = load_corpus(args)
    query_prefix, passage_prefix = ("", "") if args.no_prefixes else (args.query_prefix, args.passage_prefix)
    encoder = load_encoder(
        args.encoder,
        device=args.device,
        pooling=args.pooling,
        query_prefix=query_prefix,
        passage_prefix=passage_prefix,
        max_length=args.max_length,
        batch_size=args.batch_size,
    )
    start = time.perf_counter()
    out = build_dense_index(
        passages,
        encoder,
        args.out,
        index_type=args.index_type,
        progress=not args.no_progress,
        chunk_size=args.chunk_size,
        overwrite=args.overwrite,
    )
    seconds = time.perf_counter() - start
    write_index_manifest(args, "dense")
    meta = read_manifest(out)
    summary = {
        "index": "dense",
        "out": str(out),
        "passages": meta["count"],
        "dim": meta["dim"],
        "index_type": meta["index_type"],
        "encoder": meta["encoder"]["name"],
        "bytes": sum(entry["bytes"] for entry in meta["files"].values()),  # sealed: {name: {bytes, sha256}}
        "seconds": round(seconds, 3),
    }
    retriever = None
    if args.recall_split is not None:
        retriever = DenseRetriever.load(out, passages, encoder=encoder)
    report(args, summary, retriever, dataset)
    return 0
