"""Loader for FlashRAG-format folders: ``corpus.jsonl`` plus one ``{split}.jsonl`` per split.

Corpus lines are ``{"id": str, "contents": "\\"Title\\"\\ntext"}``; question lines are
``{"id": str, "question": str, "golden_answers": [str, ...], "metadata": {...}?}``. Gold passage ids are
read from ``metadata.supporting_passage_ids`` or ``metadata.gold_passage_ids`` when present. A malformed
line raises :class:`~searchgym.errors.DataFormatError` naming the file and the line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from searchgym.data.types import Dataset, Passage, Question
from searchgym.errors import ConfigError, DataFormatError

__all__ = ["iter_jsonl", "load_flashrag", "parse_contents", "read_corpus", "read_questions"]

_SUPPORT_KEYS = ("supporting_passage_ids", "gold_passage_ids")


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields ``(line_number, object)`` for each non-blank line of a JSONL file.

    Raises:
        DataFormatError: a line is not valid JSON or not a JSON object.
    """
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataFormatError(
                    str(path), lineno, f"invalid JSON ({e.msg} at column {e.colno})"
                ) from None
            if not isinstance(record, dict):
                raise DataFormatError(
                    str(path), lineno, f"expected a JSON object, got {type(record).__name__}"
                )
            yield lineno, record


def _field(record: dict[str, Any], key: str, kind: type, path: Path, lineno: int) -> Any:
    if key not in record:
        raise DataFormatError(str(path), lineno, f"missing field {key!r}")
    value = record[key]
    if key == "id" and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # numeric ids are common; accept them as strings
    if not isinstance(value, kind):
        raise DataFormatError(
            str(path), lineno, f"field {key!r} must be {kind.__name__}, got {type(value).__name__}"
        )
    return value


def parse_contents(contents: str) -> tuple[str, str]:
    """Splits FlashRAG ``contents`` into ``(title, text)``, removing the quotes around the title."""
    title, _, text = contents.partition("\n")
    title = title.strip()
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    return title, text


def read_corpus(path: Path) -> list[Passage]:
    """Reads a FlashRAG ``corpus.jsonl``; ids must be unique."""
    passages: list[Passage] = []
    seen: set[str] = set()
    for lineno, record in iter_jsonl(path):
        pid = _field(record, "id", str, path, lineno)
        contents = _field(record, "contents", str, path, lineno)
        if pid in seen:
            raise DataFormatError(str(path), lineno, f"duplicate passage id {pid!r}")
        seen.add(pid)
        title, text = parse_contents(contents)
        passages.append(Passage(pid, title, text))
    if not passages:
        raise DataFormatError(str(path), None, "the corpus holds no passages")
    return passages


def read_questions(path: Path) -> list[Question]:
    """Reads a FlashRAG ``{split}.jsonl`` question file."""
    questions: list[Question] = []
    seen: set[str] = set()
    for lineno, record in iter_jsonl(path):
        qid = _field(record, "id", str, path, lineno)
        if qid in seen:
            raise DataFormatError(str(path), lineno, f"duplicate question id {qid!r}")
        seen.add(qid)
        text = _field(record, "question", str, path, lineno)
        answers = record.get("golden_answers")
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
            raise DataFormatError(str(path), lineno, "field 'golden_answers' must be a list of strings")
        metadata = record.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise DataFormatError(str(path), lineno, "field 'metadata' must be an object")
        support: list[str] = []
        for key in _SUPPORT_KEYS:
            if key in metadata:
                support = [str(s) for s in metadata[key]]
                break
        questions.append(
            Question(
                id=qid,
                question=text,
                golden_answers=tuple(answers),
                supporting_ids=tuple(support),
                kind=str(metadata.get("type", "")),
                hops=len(support),
                metadata=metadata,
            )
        )
    return questions


def load_flashrag(folder: str | Path, splits: tuple[str, ...] | None = None) -> Dataset:
    """Loads a FlashRAG-format folder.

    Args:
        folder: Directory holding ``corpus.jsonl`` and one or more ``{split}.jsonl`` files.
        splits: Which splits to read; by default every ``*.jsonl`` other than the corpus.

    Raises:
        ConfigError: the folder or a requested split file does not exist.
        DataFormatError: a malformed record (the message names file and line).
    """
    root = Path(folder)
    corpus_path = root / "corpus.jsonl"
    if not corpus_path.is_file():
        raise ConfigError(f"{root} is not a FlashRAG folder: {corpus_path} does not exist")
    if splits is None:
        splits = tuple(sorted(p.stem for p in root.glob("*.jsonl") if p.name != "corpus.jsonl"))
    split_data: dict[str, list[Question]] = {}
    for split in splits:
        split_path = root / f"{split}.jsonl"
        if not split_path.is_file():
            raise ConfigError(f"{root} has no split file {split_path.name}")
        split_data[split] = read_questions(split_path)
    return Dataset(name=root.name, passages=read_corpus(corpus_path), splits=split_data)
