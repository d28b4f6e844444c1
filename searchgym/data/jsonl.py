"""JSONL files, read and written safely.

Reading: every line is decoded as strict UTF-8 and parsed with :mod:`json` (nothing in a data file is
executed); a line that is not valid UTF-8, not JSON, not an object, or that holds a lone UTF-16 surrogate
(``"\\ud800"``, which Python's JSON parser accepts but no UTF-8 consumer does) is a
:class:`~searchgym.errors.DataFormatError` naming the file and the line.

Writing: :func:`replace_on_success` writes beside the destination and renames onto it only when the
writing succeeded, so an earlier file is never truncated by a run that fails.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from searchgym.errors import ConfigError, DataFormatError
from searchgym.integrity import disk_full_is_clear

__all__ = ["PARTIAL_SUFFIX", "iter_jsonl", "replace_on_success"]

PARTIAL_SUFFIX = ".partial"
"""Suffix of the file being written: ``OUT.partial`` until it is renamed to ``OUT``."""


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields ``(line_number, object)`` for each non-blank line of a JSONL file.

    A UTF-8 byte-order mark at the start of the file is skipped.

    Raises:
        DataFormatError: the file cannot be read, or a line is not UTF-8, not valid JSON, not a JSON object,
            or holds a lone surrogate.
    """
    try:
        f = path.open("rb")
    except OSError as e:
        raise DataFormatError(str(path), None, f"cannot read the file ({e.strerror or e})") from None
    with f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise DataFormatError(
                    str(path), lineno, f"not valid UTF-8 (byte {e.start + 1} of the line: {e.reason})"
                ) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataFormatError(
                    str(path), lineno, f"invalid JSON ({e.msg} at column {e.colno})"
                ) from None
            except RecursionError:
                raise DataFormatError(str(path), lineno, "invalid JSON (nested too deeply)") from None
            except ValueError as e:  # e.g. an integer of more than 4300 digits (Python's conversion limit)
                raise DataFormatError(str(path), lineno, f"invalid JSON ({str(e)[:200]})") from None
            if not isinstance(record, dict):
                raise DataFormatError(
                    str(path), lineno, f"expected a JSON object, got {type(record).__name__}"
                )
            # Lone surrogates can only come from \u escapes (the bytes were strict UTF-8): check those lines.
            if "\\u" in line:
                try:
                    json.dumps(record, ensure_ascii=False).encode("utf-8")
                except UnicodeEncodeError:
                    raise DataFormatError(
                        str(path), lineno, "holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape)"
                    ) from None
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
