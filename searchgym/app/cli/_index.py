"""Helpers shared by the ``searchgym index`` commands: the corpus to index and the recall check."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from searchgym.errors import ConfigError

__all__ = ["add_corpus_arguments", "check_index_folder", "load_corpus", "report"]


def add_corpus_arguments(parser: argparse.ArgumentParser) -> None:
    """``--corpus``, ``--world-seed``, ``--out`` and the recall and output options of every index command."""
    parser.add_argument(
        "--corpus",
        required=True,
        help="FlashRAG folder (with corpus.jsonl), a corpus.jsonl, or 'world' (the generated world): the "
        "same value as the env's dataset, so the index fits it",
    )
    parser.add_argument("--world-seed", type=int, default=0, help="seed of the generated world")
    parser.add_argument("--out", required=True, help="index folder (created if needed)")
    parser.add_argument(
        "--recall-split",
        default=None,
        help="after building, print the recall@k of the gold passages of this split's questions "
        "(each question is the query; needs a dataset with gold passage ids)",
    )
    parser.add_argument("--recall-k", type=int, default=3, help="k of --recall-split")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def check_index_folder(folder: str | Path, overwrite: bool, option: str) -> None:
    """The one rule of every command that writes an index into a folder (``index bm25 --out``, ``serve
    --index``): a folder that already holds files (another corpus's index, a dense index, anything) is written
    into only with ``--overwrite``; the index files and the folder's manifest would replace theirs.

    Raises:
        ConfigError: ``folder`` is a file, or a non-empty folder and ``overwrite`` is not set.
    """
    root = Path(folder)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{option} {str(root)!r} is a file, not an index folder")
    held = sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) if root.is_dir() else []
    if held and not overwrite:
        shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
        raise ConfigError(
            f"{option} {str(root)!r} already holds files ({shown}); pass --overwrite to write the index over "
            f"them, or choose another {option}"
        )


def load_corpus(args: argparse.Namespace) -> tuple[list[Any], Any]:
    """The passages of ``--corpus`` and its :class:`~searchgym.data.Dataset` (``None`` for a lone
    ``corpus.jsonl``, which has no questions).

    Raises:
        ConfigError: ``--corpus`` names nothing readable.
    """
    from searchgym.data import load_dataset
    from searchgym.data.flashrag import read_corpus

    spec = args.corpus
    path = Path(spec).expanduser()
    if spec != "world" and path.is_file() and path.suffix == ".jsonl":
        return read_corpus(path), None
    if spec != "world" and path.is_dir() and not (path / "corpus.jsonl").is_file():
        raise ConfigError(f"no corpus.jsonl in {path} (give a FlashRAG folder, a corpus.jsonl, or 'world')")
    dataset = load_dataset(spec, world_seed=args.world_seed)
    return dataset.passages, dataset


def report(args: argparse.Namespace, summary: dict[str, Any], retriever: Any, dataset: Any) -> None:
    """Adds the recall of ``--recall-split`` to ``summary`` and prints it (a table or, with ``--json``,
    one JSON object)."""
    if args.recall_split is not None:
        from searchgym.retrieval.dense import gold_recall

        if dataset is None:
            raise ConfigError("--recall-split needs a dataset folder or 'world', not a lone corpus.jsonl")
        if args.recall_k < 1:
            raise ConfigError(f"--recall-k must be >= 1, got {args.recall_k}")
        recall = gold_recall(
            retriever, dataset.questions(args.recall_split), args.recall_k, progress=not args.no_progress
        )
        summary["recall"] = {
            "split": args.recall_split,
            "k": recall.k,
            "any_gold": recall.any_gold,
            "all_gold": recall.all_gold,
            "questions": recall.questions,
        }
    if args.json:
        print(json.dumps(summary))
        return
    for key, value in summary.items():
        if key == "recall":
            print(
                f"recall@{value['k']} on {value['split']} ({value['questions']} questions): "
                f"{value['any_gold']:.4f} with a gold passage, {value['all_gold']:.4f} with all of them"
            )
        else:
            print(f"{key}: {value}")
