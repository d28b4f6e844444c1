"""File integrity and temporary files, shared by every writer and loader of searchgym.

* :func:`file_sha256` hashes a file in streamed blocks (never whole in memory), optionally handing each block
  to a callback (e.g. a finiteness check of float32 data), and remembers the digest of a file it has hashed
  for as long as the file's size, modification time and inode stay the same — in the process, and (for
  large files, on request) in a ``.verified.json`` record beside the file when its folder is writable — so a
  file is hashed once, not on every load. A file edited in place gets a new modification time and is hashed
  again.
* :func:`content_sha256` hashes a JSON-like object canonically; :func:`seal` records in a manifest the
  hashes of the files it describes and of its own content, :func:`check_seal` and :func:`check_sealed_file`
  verify them on load (a flipped bit, an edited field, or files of two different builds are refused).
* :func:`temp_path` names a temporary file ``.NAME.PID.RANDOM.tmp`` beside its destination, and
  :func:`remove_stale_temp_files` deletes those (and the older ``.NAME.PID`` forms) that dead processes left.
* :func:`sigint_held` holds Ctrl-C back while a write that must finish once started runs.

Nothing here imports torch.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from searchgym.errors import DataFormatError, DiskFullError

__all__ = [
    "check_seal",
    "check_sealed_file",
    "content_sha256",
    "disk_full_is_clear",
    "file_sha256",
    "remove_stale_temp_files",
    "seal",
    "sigint_held",
    "temp_path",
]

#: Bytes hashed per read.
_BLOCK = 1 << 22
_VERIFIED = ".verified.json"
_lock = threading.Lock()
_memo: dict[tuple[str, int, int, int], str] = {}

#: ``.NAME.PID.RANDOM.tmp``: the temporary file of a write by process PID.
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[^.]+\.tmp$")
#: What earlier versions wrote besides: ``.NAME.PID``, ``.NAME.PID.tmp``, ``.NAME.PID.npz`` (matched only for
#: the destination names a caller gives).
_LEGACY = re.compile(r"^\.(?P<name>.+?)\.(?P<pid>\d+)(?:\.tmp|\.npz)?$")


def _key(path: Path) -> tuple[str, int, int, int]:
    stat = path.stat()
    return (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)


def _recorded(path: Path, key: tuple[str, int, int, int]) -> str | None:
    try:
        record = json.loads((path.parent / _VERIFIED).read_text(encoding="utf-8")).get(path.name)
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    if (
        isinstance(record, dict)
        and record.get("stat") == list(key[1:])
        and isinstance(record.get("sha256"), str)
    ):
        return str(record["sha256"])
    return None


def _record(path: Path, key: tuple[str, int, int, int], digest: str) -> None:
    """Best effort: a read-only folder simply keeps no record."""
    record_path = path.parent / _VERIFIED
    try:
        try:
            records = json.loads(record_path.read_text(encoding="utf-8"))
            if not isinstance(records, dict):
                records = {}
        except (OSError, ValueError, RecursionError):
            records = {}
        records[path.name] = {"stat": list(key[1:]), "sha256": digest}
        tmp = temp_path(record_path)
        tmp.write_text(json.dumps(records), encoding="utf-8")
        os.replace(tmp, record_path)
    except OSError:
        pass


def file_sha256(
    path: str | Path,
    on_block: Callable[[int, bytes], None] | None = None,
    *,
    remember: bool = True,
    record: bool = False,
) -> str:
    """The SHA-256 of a file, read in blocks.

    Args:
        path: The file.
        on_block: Called with ``(offset, block)`` for every block read (only when the file is actually read,
            not when its digest is remembered).
        remember: Reuse the digest of an unchanged file (same size, modification time and inode as when it
            was hashed) in this process, or recorded in the folder's ``.verified.json``.
        record: Also record the digest in the folder's ``.verified.json`` (best effort), so later processes
            skip the read: for large files.

    Raises:
        OSError: the file cannot be read.
    """
    path = Path(path)
    key = _key(path)
    if remember:
        with _lock:
            known = _memo.get(key)
        if known is None:
            known = _recorded(path, key)
        if known is not None:
            return known
    digest = hashlib.sha256()
    offset = 0
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
            if on_block is not None:
                on_block(offset, block)
            offset += len(block)
    hexdigest = digest.hexdigest()
    if remember and _key(path) == key:  # not changed while it was read
        with _lock:
            _memo[key] = hexdigest
        if record:
            _record(path, key, hexdigest)
    return hexdigest


def content_sha256(value: Any) -> str:
    """The SHA-256 of a JSON-like value in a canonical form (sorted keys, no spaces, ASCII)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def seal(meta: Mapping[str, Any], files: Mapping[str, str | Path]) -> dict[str, Any]:
    """``meta`` with the size and SHA-256 of each file under ``files`` and the SHA-256 of its own content
    under ``sha256`` (computed last, over everything else).

    Args:
        meta: A manifest (JSON-like); its ``files`` entries for other names are kept.
        files: Recorded name (as the loader will find it) -> the file to hash now (e.g. its temporary name).
    """
    out = {k: v for k, v in meta.items() if k != "sha256"}
    recorded = dict(out.get("files") or {})
    for name, path in files.items():
        recorded[name] = {"bytes": Path(path).stat().st_size, "sha256": file_sha256(path, remember=False)}
    out["files"] = recorded
    out["sha256"] = content_sha256(out)
    return out


def check_seal(meta: Mapping[str, Any], path: str | Path) -> None:
    """``meta["sha256"]`` is the hash of the rest of ``meta`` (see :func:`seal`).

    Raises:
        DataFormatError: the hash is missing or differs: the manifest was edited or damaged.
    """
    try:
        actual: str | None = content_sha256({k: v for k, v in meta.items() if k != "sha256"})
    except (ValueError, TypeError, RecursionError):
        actual = None
    if meta.get("sha256") != actual:
        raise DataFormatError(
            str(path), None, "fails its checksum (edited or damaged after it was written); rebuild the index"
        )


def check_sealed_file(
    meta: Mapping[str, Any],
    meta_path: str | Path,
    path: str | Path,
    on_block: Callable[[int, bytes], None] | None = None,
    *,
    record: bool = False,
) -> None:
    """The file's size and SHA-256 against those ``meta`` (sealed) records for its name.

    Args:
        meta: The manifest.
        meta_path: The manifest's path, for messages.
        path: The file.
        on_block: See :func:`file_sha256`.
        record: See :func:`file_sha256`.

    Raises:
        DataFormatError: no hash recorded, another size or hash (the file changed after it was written, or
            it and the manifest come from different builds), or the file cannot be read.
    """
    path, meta_path = Path(path), Path(meta_path)
    files = meta.get("files")
    recorded = files.get(path.name) if isinstance(files, Mapping) else None
    expected = recorded.get("sha256") if isinstance(recorded, Mapping) else None
    if not isinstance(expected, str) or not isinstance(recorded, Mapping):
        raise DataFormatError(str(meta_path), None, f"records no hash of {path.name}; rebuild the index")
    try:
        size = path.stat().st_size
        same = size == recorded.get("bytes") and file_sha256(path, on_block, record=record) == expected
    except OSError as e:
        raise DataFormatError(
            str(path), None, f"cannot be read ({e.strerror or e}); rebuild the index"
        ) from None
    if not same:
        raise DataFormatError(
            str(path),
            None,
            f"does not match the size and hash {meta_path.name} records for it: the file changed after it was "
            "written, or the two come from different builds (a write interrupted between its renames); rebuild "
            "the index",
        )


def temp_path(path: str | Path) -> Path:
    """A fresh temporary name beside ``path``: ``.NAME.PID.RANDOM.tmp`` (see :func:`remove_stale_temp_files`)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")


@contextmanager
def sigint_held() -> Iterator[None]:
    """Holds Ctrl-C (SIGINT) back until the block ends, then delivers it as it would have been.

    For writes that must finish once started: a KeyboardInterrupt raised inside ``torch.save``'s zip writer
    comes out as ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos`` (a traceback instead
    of the interruption, and no saved checkpoint named). The block's own errors pass through unchanged. In
    a thread other than the main one (which cannot set signal handlers) the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[Any] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            if callable(previous):
                previous(signal.SIGINT, received[0])  # Python's own: raises KeyboardInterrupt here
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)
            # SIG_IGN, or a handler not set from Python (None): dropped, as it would have been


def remove_stale_temp_files(folder: str | Path, names: Iterable[str] | None = None) -> list[Path]:
    """Deletes the temporary files that writes killed midway left in ``folder``.

    A temporary file is ``.NAME.PID.RANDOM.tmp`` (or an earlier version's ``.NAME.PID``, ``.NAME.PID.tmp``,
    ``.NAME.PID.npz``); one whose process is still running (a live write) is kept, and so is every other file.

    Args:
        folder: The folder to clean.
        names: Only temporary files of these destination names (e.g. ``("bm25.json", "bm25.npz")``); default
            any name.

    Returns:
        The files removed.
    """
    removed: list[Path] = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    wanted = None if names is None else set(names)
    for f in folder.iterdir():
        match = _TEMP.match(f.name) or (_LEGACY.match(f.name) if wanted is not None else None)
        if match is None or not f.is_file() or (wanted is not None and match["name"] not in wanted):
            continue
        pid = int(match["pid"])
        if pid != os.getpid() and _alive(pid):
            continue
        try:
            f.unlink()
        except OSError:
            continue  # a read-only folder: nothing to do
        removed.append(f)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # exists but not ours, or unknowable: keep its file
    return True


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"  # pragma: no cover


@contextmanager
def disk_full_is_clear(path: str | Path, needed: int | None = None, kept: str = "") -> Iterator[None]:
    """Turns a write's ``ENOSPC``/``EDQUOT`` into a one-line :class:`~searchgym.errors.DiskFullError` naming
    ``path``, the ``needed`` bytes (when known), the space free there, and ``kept`` (what is intact).

    A writer that wraps the ``OSError`` in its own exception (``torch.save``'s zip writer answers with
    ``RuntimeError: ... unexpected pos``) is recognised by the ``OSError`` in the exception's context. Other
    errors pass through unchanged.
    """
    try:
        yield
    except Exception as e:
        full = _disk_full(e)
        if full is None or isinstance(e, DiskFullError):
            raise
        folder = Path(path).parent
        try:
            free = _size(shutil.disk_usage(folder).free)
        except OSError:
            free = "unknown"
        need = f"it needs about {_size(needed)}, {free} free" if needed is not None else f"{free} free"
        then = f"; {kept}" if kept else ""
        raise DiskFullError(
            full.errno,
            f"no space left on the device writing {path} ({need}): free some space or write elsewhere{then}",
        ) from None


def _disk_full(error: BaseException) -> OSError | None:
    """The ``ENOSPC``/``EDQUOT`` ``OSError`` behind ``error`` (itself, or in its context), if any."""
    seen: set[int] = set()
    found: BaseException | None = error
    while found is not None and id(found) not in seen:
        seen.add(id(found))
        if isinstance(found, OSError) and found.errno in (errno.ENOSPC, errno.EDQUOT):
            return found
        found = found.__cause__ or found.__context__
    return None
