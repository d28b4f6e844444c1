"""Loader for FlashRAG-format folders: ``corpus.jsonl`` plus one ``{split}.jsonl`` per split.

Corpus lines are ``{"id": str, "contents": "\\"Title\\"\\ntext"}``; question lines are
``{"id": str, "question": str, "golden_answers": [str, ...], "metadata": {...}?}``. Gold passage ids are
read from ``metadata.supporting_passage_ids`` or ``metadata.gold_passage_ids`` when present. A malformed
line raises :class:`~searchgym.errors.DataFormatError` naming the file and the line.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from searchgym.data.jsonl import iter_jsonl
from searchgym.data.types import Dataset, LazySplits, Passage, Question
from searchgym.errors import ConfigError, DataFormatError

__all__ = [
    "iter_jsonl",
    "load_flashrag",
    "parse_contents",
    "read_corpus",
    "read_questions",
    "supporting_ids",
]

_SUPPORT_KEYS = ("supporting_passage_ids", "gold_passage_ids")


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


def supporting_ids(value: Any, key: str, path: str, line: int) -> tuple[str, ...]:
    """The gold passage ids of ``metadata[key]``: a list of ids, or a single id.

    Ids are strings or integers (integers become strings, as passage ids are strings); a single id (``"12"``
    or ``12``) is one id, never split into characters; ``null`` means none.

    Raises:
        DataFormatError: any other type (the message names file, line and key).
    """
    if value is None:
        return ()
    if isinstance(value, list | tuple):
        items = list(value)
    elif isinstance(value, str | int) and not isinstance(value, bool):
        items = [value]
    else:
        raise DataFormatError(
            path,
            line,
            f"metadata.{key} must be a list of passage ids (or one id), got {type(value).__name__}",
        )
    for item in items:
        if isinstance(item, bool) or not isinstance(item, str | int):
            raise DataFormatError(
                path, line, f"metadata.{key} must hold passage ids (strings or integers), got {item!r}"
            )
    return tuple(str(item) for item in items)


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
        passages.append(Passage(pid, title, text, raw=contents))
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
        support: tuple[str, ...] = ()
        for key in _SUPPORT_KEYS:
            if key in metadata:
                support = supporting_ids(metadata[key], key, str(path), lineno)
                break
        questions.append(
            Question(
                id=qid,
                question=text,
                golden_answers=tuple(answers),
                supporting_ids=support,
                kind=str(metadata.get("type", "")),
                hops=len(support),
                metadata=metadata,
            )
        )
    return questions


def load_flashrag(folder: str | Path, splits: tuple[str, ...] | None = None) -> Dataset:
    """Loads a FlashRAG-format folder.

    The corpus and the splits named in ``splits`` are read at once. Discovered splits (``splits=None``) are
    read when first used, so a stray or malformed ``*.jsonl`` in the folder (a results file, say) breaks
    nothing but a request for it.

    Args:
        folder: Directory holding ``corpus.jsonl`` and one or more ``{split}.jsonl`` files.
        splits: Which splits to read; by default every ``*.jsonl`` other than the corpus, read on first use.

    Raises:
        ConfigError: the folder or a requested split file does not exist.
        DataFormatError: a malformed record (the message names file and line), raised when the corpus is
            read or when a malformed split is first used.
    """
    root = Path(folder)
    corpus_path = root / "corpus.jsonl"
    if not corpus_path.is_file():
        raise ConfigError(f"{root} is not a FlashRAG folder: {corpus_path} does not exist")
    discovered = splits is None
    if splits is None:
        splits = tuple(sorted(p.stem for p in root.glob("*.jsonl") if p.name != "corpus.jsonl"))
    files: dict[str, Path] = {}
    for split in splits:
        split_path = root / f"{split}.jsonl"
        if not split_path.is_file():
            raise ConfigError(f"{root} has no split file {split_path.name}")
        files[split] = split_path
    passages = read_corpus(corpus_path)
    split_data = LazySplits({split: partial(read_questions, f) for split, f in files.items()})
    if not discovered:  # splits named by the caller are read now, so their errors show at once
        split_data.read_all()
    return Dataset(name=root.name, passages=passages, splits=split_data)
