"""Loader for Search-R1 parquet files (``train.parquet``, ``test.parquet`` of its data scripts).

Search-R1 stores one question per row with the columns

* ``prompt``: a list of chat messages ``{"role", "content"}``; the question is the text after the last
  ``"Question: "`` of the last user message (its prompt template ends ``Question: {question}\\n``); a
  message without that marker is taken whole;
* ``reward_model``: ``{"style": "rule", "ground_truth": {"target": [answers...]}}``;
* ``data_source``: the source dataset (``"nq"``, ``"hotpotqa"``…);
* ``extra_info``: ``{"split": ..., "index": i}`` (optional; the row number stands in for a missing index).

Question ids are ``"{data_source}_{index}"``: Search-R1's files concatenate several datasets whose indexes
each start at 0. The passages do not come with these files: pair them with a FlashRAG ``corpus.jsonl``
(for Search-R1, its wiki-18 corpus). Rows are numbered from 1 in error messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from searchgym.data.flashrag import read_corpus, read_questions, supporting_ids
from searchgym.data.limits import read_limits
from searchgym.data.types import Dataset, LazySplits, Passage, Question
from searchgym.errors import ConfigError, DataFormatError, MissingDependencyError

__all__ = ["MAX_ROWS", "load_searchr1", "parse_row", "read_searchr1"]

_COLUMNS = ("prompt", "reward_model", "data_source")
_MARKER = "Question: "


def _question_text(prompt: Any, where: tuple[str, int]) -> str:
    if not isinstance(prompt, list | tuple) or not prompt:
        raise DataFormatError(*where, "'prompt' must be a non-empty list of chat messages")
    users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    message = users[-1] if users else prompt[-1]
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        raise DataFormatError(*where, "the prompt's last user message has no string 'content'")
    question = content.rpartition(_MARKER)[2].strip()
    if not question:
        raise DataFormatError(*where, "the prompt holds no question text")
    return question


def _answers(reward_model: Any, where: tuple[str, int]) -> tuple[str, ...]:
    truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    target = truth.get("target") if isinstance(truth, dict) else None
    if isinstance(target, str):
        target = [target]
    if not isinstance(target, list | tuple) or not target or not all(isinstance(a, str) for a in target):
        raise DataFormatError(
            *where, "'reward_model.ground_truth.target' must be a non-empty list of strings"
        )
    return tuple(target)


def parse_row(row: dict[str, Any], path: str, row_number: int) -> Question:
    """One parquet row (as a dict of column values) as a :class:`Question`.

    Args:
        row: The row's values by column.
        path: The file, for error messages.
        row_number: 1-based row number, for error messages and as the fallback index.

    Raises:
        DataFormatError: a column is missing or malformed (the message names file and row).
    """
    where = (path, row_number)
    source = row.get("data_source")
    if not isinstance(source, str) or not source:
        raise DataFormatError(*where, "'data_source' must be a non-empty string")
    extra = row.get("extra_info")
    if extra is not None and not isinstance(extra, dict):
        raise DataFormatError(*where, "'extra_info' must be an object")
    extra = extra or {}
    index = extra.get("index", row_number - 1)
    if isinstance(index, bool) or not isinstance(index, int | str):
        raise DataFormatError(*where, "'extra_info.index' must be an integer or a string")
    support: tuple[str, ...] = ()
    for key in ("supporting_passage_ids", "gold_passage_ids"):
        if key in extra:
            support = supporting_ids(extra[key], key, path, row_number)
            break
    return Question(
        id=f"{source}_{index}",
        question=_question_text(row.get("prompt"), where),
        golden_answers=_answers(row.get("reward_model"), where),
        supporting_ids=support,
        hops=len(support),
        metadata={"data_source": source, **{k: v for k, v in extra.items() if v is not None}},
    )


MAX_ROWS = 10_000_000
"""The most rows a Search-R1 parquet file may hold (its row count is read from the footer before any row is
decoded; Search-R1's largest split has about 170,000)."""

#: Rows decoded at once: a parquet of identical rows compresses ~1000x, so rows are decoded in small batches
#: and checked as they come (a duplicate id fails at its row, not after the whole file is in memory).
_BATCH_ROWS = 4096
#: A batch that decodes to more bytes than this (a dictionary value repeated in its rows, or long rows) becomes
#: Python objects one row at a time, so that a batch's rows and the questions made of them are not all held.
_BATCH_BYTES = 8 * 2**20


def read_searchr1(path: str | Path, max_rows: int | None = None) -> list[Question]:
    """Reads the questions of one Search-R1 parquet file.

    Args:
        path: The parquet file.
        max_rows: Refuse a file of more rows (default :data:`MAX_ROWS`), before decoding any.

    Bytes are bounded too (:mod:`searchgym.data.limits`): a file whose footer declares more uncompressed
    column data than the file limit is refused unread, and the bytes the rows decode to (a dictionary value
    counted once per row that uses it) are summed batch by batch before the batch becomes Python objects.

    Raises:
        MissingDependencyError: ``pyarrow`` is not installed (extra ``parquet``).
        DataFormatError: the file is unreadable, lacks a column, holds more than ``max_rows`` rows or
            decodes to more than the file limit, holds a malformed row, or two rows share an id.
    """
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingDependencyError("pyarrow", "parquet", "Reading Search-R1 parquet files") from None
    import pyarrow as pa
    import pyarrow.compute as pc

    path = Path(path)
    limit = MAX_ROWS if max_rows is None else max_rows
    bytes_limit = read_limits()
    questions: list[Question] = []
    seen: set[str] = set()
    try:
        with pq.ParquetFile(path) as parquet:
            rows = parquet.metadata.num_rows
            if rows > limit:
                raise DataFormatError(
                    str(path),
                    None,
                    f"holds {rows:,} rows, more than the {limit:,} searchgym reads (max_rows)",
                )
            names = parquet.schema_arrow.names
            missing = [c for c in _COLUMNS if c not in names]
            if missing:
                raise DataFormatError(str(path), None, f"missing column(s) {missing}; found {names}")
            columns = [c for c in (*_COLUMNS, "extra_info") if c in names]
            strings = _string_leaves(parquet, columns)
            if _declared_bytes(parquet, columns) > bytes_limit.file_bytes:
                raise bytes_limit.file_too_large(path, "declares in its footer")
        decoded, number = 0, 0
        # Strings are read dictionary-encoded: a value repeated in many rows is decoded once, and the bytes the
        # rows would take are counted from the dictionary before any row becomes Python objects.
        with pq.ParquetFile(path, read_dictionary=strings) as parquet:
            for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, columns=columns):
                size = sum(_decoded_bytes(column, pa, pc) for column in batch.columns)
                decoded += size
                if decoded > bytes_limit.file_bytes:
                    raise bytes_limit.file_too_large(path, "decodes to")
                pieces = (
                    [batch] if size <= _BATCH_BYTES else (batch.slice(i, 1) for i in range(batch.num_rows))
                )
                for piece in pieces:
                    for row in piece.to_pylist():
                        number += 1
                        question = parse_row(row, str(path), number)
                        if question.id in seen:
                            raise DataFormatError(str(path), number, f"duplicate question id {question.id!r}")
                        seen.add(question.id)
                        questions.append(question)
    except (
        OSError,
        ValueError,
        TypeError,
        IndexError,
        KeyError,
        NotImplementedError,
        pa.ArrowException,
    ) as e:
        if isinstance(e, DataFormatError):
            raise
        # pyarrow raises its own classes (ArrowInvalid is a ValueError; others are not): all mean a bad file.
        raise DataFormatError(
            str(path), None, f"not a readable parquet file ({type(e).__name__}: {e})"
        ) from None
    return questions


def _string_leaves(parquet: Any, columns: list[str]) -> list[str]:
    """The paths of the string (byte-array) leaves under ``columns``, for ``read_dictionary``."""
    leaves = (parquet.schema.column(i) for i in range(len(parquet.schema)))
    return [c.path for c in leaves if c.physical_type == "BYTE_ARRAY" and c.path.split(".")[0] in columns]


def _declared_bytes(parquet: Any, columns: list[str]) -> int:
    """The uncompressed bytes the footer declares for ``columns``, over every row group."""
    meta = parquet.metadata
    total = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            if chunk.path_in_schema.split(".")[0] in columns:
                total += max(0, int(chunk.total_uncompressed_size))
    return total


def _decoded_bytes(array: Any, pa: Any, pc: Any) -> int:
    """The bytes ``array``'s values take once decoded, a dictionary value counted once per row using it (the
    sizes are summed from the dictionary's lengths: nothing is materialised)."""
    kind = array.type
    if pa.types.is_dictionary(kind):
        values = array.dictionary
        if not _is_bytes(values.type, pa):
            return int(array.nbytes)
        total = pc.sum(pc.binary_length(values).take(array.indices)).as_py()
        return int(total or 0) + int(array.indices.nbytes)
    if _is_bytes(kind, pa):
        return int(pc.sum(pc.binary_length(array)).as_py() or 0) + 8 * len(array)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _decoded_bytes(array.flatten(), pa, pc) + 8 * len(array)
    if pa.types.is_struct(kind):
        return sum(_decoded_bytes(child, pa, pc) for child in array.flatten())
    return int(array.nbytes)


def _is_bytes(kind: Any, pa: Any) -> bool:
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    )


def load_searchr1(
    path: str | Path, corpus: str | Path | None = None, splits: Sequence[str] | None = None
) -> Dataset:
    """Loads Search-R1 questions with a FlashRAG corpus.

    Args:
        path: A folder holding ``{split}.parquet`` files (FlashRAG ``{split}.jsonl`` question files there
            are read too), or one ``.parquet`` file (its stem names the split).
        corpus: The FlashRAG ``corpus.jsonl``; by default the one in ``path``'s folder.
        splits: Splits to read (folder only); by default every ``*.parquet`` and non-corpus ``*.jsonl``,
            each read when first used.

    Raises:
        ConfigError: the path, the corpus or a split does not exist, or a split is in both formats.
        DataFormatError: a malformed file (the message names file and row or line).
    """
    root = Path(path)
    if root.is_file():
        if splits is not None:
            raise ConfigError("splits= applies to a folder; a single parquet file is its own split")
        files = {root.stem: root}
        folder = root.parent
    elif root.is_dir():
        folder = root
        files = {}
        for f in sorted(root.glob("*.parquet")) + sorted(root.glob("*.jsonl")):
            if f.name == "corpus.jsonl":
                continue
            if f.stem in files:
                raise ConfigError(f"split {f.stem!r} is in both {files[f.stem].name} and {f.name} in {root}")
            files[f.stem] = f
        if splits is not None:
            unknown = [s for s in splits if s not in files]
            if unknown:
                raise ConfigError(f"{root} has no split(s) {unknown}; available: {sorted(files)}")
            files = {s: files[s] for s in splits}
    else:
        raise ConfigError(f"{root} is neither a Search-R1 parquet file nor a folder")
    corpus_path = Path(corpus) if corpus is not None else folder / "corpus.jsonl"
    if not corpus_path.is_file():
        raise ConfigError(
            f"no corpus for {root}: {corpus_path} does not exist (Search-R1 files hold only questions; "
            "put a FlashRAG corpus.jsonl next to them or pass corpus=)"
        )
    passages: list[Passage] = read_corpus(corpus_path)
    split_data = LazySplits(
        {
            split: partial(read_searchr1 if f.suffix == ".parquet" else read_questions, f)
            for split, f in files.items()
        }
    )
    # Files the caller named are read now; discovered ones on first use, so a stray or malformed file
    # in the folder breaks only a request for it.
    if root.is_file() or splits is not None:
        split_data.read_all()
    return Dataset(name=folder.name, passages=passages, splits=split_data)
