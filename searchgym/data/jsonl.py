"""JSONL files, read and written safely.

Reading: every line is decoded as strict UTF-8 and parsed with :mod:`json` (nothing in a data file is
executed); a line that is not valid UTF-8, not JSON, not an object, or that holds a lone UTF-16 surrogate
(``"\\ud800"``, which Python's JSON parser accepts but no UTF-8 consumer does) is a
:class:`~searchgym.errors.DataFormatError` naming the file and the line. Lines and files are read within the
byte limits of :mod:`searchgym.data.limits`; :func:`parse_json` is the one parser of every JSON document
searchgym reads without trust.

Writing: :func:`replace_on_success` writes beside the destination and renames onto it only when the
writing succeeded, so an earlier file is never truncated by a run that fails.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from searchgym.data.limits import read_limits
from searchgym.errors import ConfigError, DataFormatError
from searchgym.integrity import disk_full_is_clear

__all__ = ["PARTIAL_SUFFIX", "iter_jsonl", "parse_json", "read_json", "read_lines", "replace_on_success"]

PARTIAL_SUFFIX = ".partial"
"""Suffix of the file being written: ``OUT.partial`` until it is renamed to ``OUT``."""


def read_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Yields ``(line_number, raw_line)`` for every line of a file, its newline kept (a last line without one
    is a torn write to the callers that care), never holding more than one line of the size limit.

    Raises:
        DataFormatError: the file cannot be read, a line is longer than the line limit, or the file holds
            more bytes than the file limit (:mod:`searchgym.data.limits`; the message names the variable that
            raises it).
    """
    limits = read_limits()
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below, once an open failure is reported
    except OSError as e:
        raise DataFormatError(str(path), None, f"cannot read the file ({e.strerror or e})") from None
    total = 0
    with f:
        for lineno in itertools.count(1):
            raw = f.readline(limits.line_bytes + 1)
            if not raw:
                return
            if len(raw) > limits.line_bytes:
                raise limits.line_too_long(path, lineno)
            total += len(raw)
            if total > limits.file_bytes:
                raise limits.file_too_large(path)
            yield lineno, raw


def parse_json(raw: bytes | str, path: str | Path, line: int | None) -> Any:
    """One JSON document (a line, or a small file) from bytes that must be strict UTF-8.

    A leading UTF-8 byte-order mark is skipped.

    Raises:
        DataFormatError: naming ``path`` and ``line``: not UTF-8, not JSON, nested too deeply, an integer of
            more digits than Python converts, or a lone UTF-16 surrogate (``"\\ud800"``, which Python's
            JSON parser accepts but no UTF-8 consumer does).
    """
    where = str(path)
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise DataFormatError(where, line, f"not valid UTF-8 (byte {e.start + 1}: {e.reason})") from None
    else:
        text = raw
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataFormatError(where, line, f"invalid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise DataFormatError(where, line, "invalid JSON (nested too deeply)") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits (Python's conversion limit)
        raise DataFormatError(where, line, f"invalid JSON ({str(e)[:200]})") from None
    # Lone surrogates can only come from \u escapes (the bytes were strict UTF-8): check those documents.
    if "\\u" in text:
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise DataFormatError(
                where, line, "holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape)"
            ) from None
        except RecursionError:
            raise DataFormatError(where, line, "invalid JSON (nested too deeply)") from None
    return value


def read_json(path: str | Path) -> Any:
    """A small JSON file (a run record, a manifest) read within the file limit, through :func:`parse_json`.

    Raises:
        DataFormatError: unreadable, over the file limit, or not JSON (see :func:`parse_json`).
    """
    limits = read_limits()
    try:
        with Path(path).open("rb") as f:
            raw = f.read(limits.file_bytes + 1)
    except OSError as e:
        raise DataFormatError(str(path), None, f"cannot read the file ({e.strerror or e})") from None
    if len(raw) > limits.file_bytes:
        raise limits.file_too_large(path)
    return parse_json(raw, path, None)


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields ``(line_number, object)`` for each non-blank line of a JSONL file.

    A UTF-8 byte-order mark at the start of the file is skipped. Lines and the file are read within the
    limits of :mod:`searchgym.data.limits`.

    Raises:
        DataFormatError: the file cannot be read, a line or the file is over its size limit, or a line is
            not UTF-8, not valid JSON, not a JSON object, or holds a lone surrogate.
    """
    for lineno, raw in read_lines(path):
        if not raw.strip():
            continue
        if lineno > 1 and raw.startswith(b"\xef\xbb\xbf"):  # a byte-order mark is only skipped at the start
            raise DataFormatError(str(path), lineno, "invalid JSON (a byte-order mark inside the file)")
        record = parse_json(raw, path, lineno)
        if not isinstance(record, dict):
            raise DataFormatError(str(path), lineno, f"expected a JSON object, got {type(record).__name__}")
        yield lineno, record


@contextmanager
def replace_on_success(path: str | Path, *, keep: bool = False) -> Iterator[Path]:
    """Yields ``PATH.partial`` to write to; renames it onto ``path`` when the block exits normally.

    With ``keep``, what an earlier run left in ``PATH.partial`` stays (a resumed run appends to it);
    otherwise the file starts empty.

    If the block raises (or the process is killed), ``path`` keeps its earlier content and what was written
    stays in ``PATH.partial``, so finished work is not lost either.

    One writer at a time: ``PATH.partial`` is locked (``fcntl.flock``, released by the kernel when the
    process ends, so a killed run leaves no stale lock) for the whole block, and a second run writing to the
    same ``path`` is refused at once instead of both writing into one file. Only the file this run locked
    is renamed: if ``PATH.partial`` was replaced or removed meanwhile, nothing is renamed and the run fails.

    Args:
        path: The destination; its folder is created.

    Raises:
        ConfigError: another process is writing to ``path`` (it holds the lock on ``PATH.partial``).
        OSError: ``PATH.partial`` no longer is the file this run wrote when the block ends.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + PARTIAL_SUFFIX)
    fd = _lock_partial(partial, path)
    try:
        if not keep:
            os.ftruncate(fd, 0)  # leftovers of an earlier, killed run: this run starts the file again
        kept = f"{path} is as it was; what was written is in {partial}"
        with disk_full_is_clear(partial, kept=kept):
            yield partial
        if not _same_file(fd, partial):
            raise OSError(
                f"{partial} was replaced or removed while this run wrote it; {path} is left as it was"
            )
        with disk_full_is_clear(partial, kept=kept):
            os.fsync(
                fd
            )  # on disk before the rename makes it the file (the block wrote through the same file)
        os.replace(partial, path)
    finally:
        os.close(fd)  # releases the lock


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _lock_partial(partial: Path, path: Path) -> int:
    """Opens and exclusively locks ``partial`` (created if missing); the descriptor holds the lock."""
    try:
        import fcntl
    except (
        ImportError
    ):  # pragma: no cover - Windows: no advisory locks; one writer per file is the user's care
        return os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
    for _ in range(100):
        fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(
                f"another run is writing {path} (it holds {partial}); wait for it or choose another --out"
            ) from None
        # Another run may have renamed the file we opened onto `path` between our open and our lock: then the
        # lock is on its finished output, not on `partial`. Start again with the file now named `partial`.
        if _same_file(fd, partial):
            return fd
        os.close(fd)
    raise ConfigError(f"{partial} keeps being replaced by another run; choose another --out")
