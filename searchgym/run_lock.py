"""One writer per run folder: a lock a training run holds for its whole life.

``RUN_DIR/run.lock`` is locked with ``fcntl.flock`` by the process that trains into the folder and records
who holds it (process id, host, command, start time). A second process that asks for the same folder is
refused at once with those details. A run that ends releases the lock and clears the record; the kernel
releases the lock of a process that dies, however it dies, and the record it leaves makes the next run
take the folder over with a note naming the dead holder: there is never a stale lock to remove by hand.

Within one process the lock is shared: asking again for a folder this process already holds returns the
same :class:`RunLock` (a trainer resumed in the same interpreter, as the tests do). The lock is released
when :meth:`RunLock.release` is called or the last reference to it goes.

``flock`` is advisory and local: two machines writing into one folder over NFS are not kept apart, and on
platforms without ``fcntl`` (Windows) no lock is taken.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
import warnings
import weakref
from pathlib import Path
from typing import Any

from searchgym.errors import ConfigError
from searchgym.integrity import disk_full_is_clear

__all__ = ["LOCK_NAME", "RunLock", "lock_run_dir"]

LOCK_NAME = "run.lock"

_HELD: weakref.WeakValueDictionary[str, RunLock] = weakref.WeakValueDictionary()


class RunLock:
    """The held lock of one run folder (see :func:`lock_run_dir`)."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path = path
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Releases the lock and clears the holder's record (a record left behind means its holder died)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            _HELD.pop(str(self.path), None)
            try:
                os.ftruncate(fd, 0)
            finally:
                os.close(fd)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.release()


def _holder() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else "",
    }


def _describe(record: dict[str, Any]) -> str:
    who = f"process {record.get('pid', '?')}"
    if record.get("host"):
        who += f" on {record['host']}"
    if record.get("started"):
        who += f", started {record['started']}"
    if record.get("command"):
        who += f" ({record['command']})"
    return who


def _read(fd: int) -> dict[str, Any]:
    try:
        raw = os.pread(fd, 1 << 16, 0)
        record = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def lock_run_dir(run_dir: str | Path, *, name: str = LOCK_NAME, busy: str | None = None) -> RunLock:
    """Takes the run folder's lock for this process (the folder is created if missing).

    Args:
        run_dir: The run folder.
        name: The lock file's name in it (``run.lock``; ``study run`` holds ``study.lock`` in a study's runs
            folder).
        busy: The refusal when a live process holds the lock, with ``{folder}``, ``{path}`` and ``{holder}``
            to fill in (default: the run folder's).

    Returns:
        The held lock; keep a reference for as long as the run writes into the folder.

    Raises:
        ConfigError: another live process holds the folder (named, with its command and start time), or
            ``run_dir`` is a file.
        DiskFullError: no space to write the holder's record (no ``run.lock`` is left behind).
    """
    root = Path(run_dir)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"run_dir {str(root)!r} is a file, not a folder")
    with disk_full_is_clear(root / name, kept="nothing was written"):
        root.mkdir(parents=True, exist_ok=True)
    path = (root / name).resolve()
    held = _HELD.get(str(path))
    if held is not None and held.held:
        return held
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no advisory locks
        return RunLock(path, None)
    created = not path.exists()
    with disk_full_is_clear(path, kept="nothing was written into the run folder"):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        record = _read(fd)
        os.close(fd)
        if busy is not None:
            raise ConfigError(busy.format(folder=root, path=path, holder=_describe(record))) from None
        raise ConfigError(
            f"run_dir {str(root)!r} is in use: {_describe(record)} is writing into it; wait for it to end, "
            "stop it, or choose another --run-dir"
        ) from None
    previous = _read(fd)
    if previous.get("pid") is not None:
        warnings.warn(
            f"{f'run_dir {str(root)!r}' if name == LOCK_NAME else path}: taking over the lock of "
            f"{_describe(previous)}, which is no longer running",
            UserWarning,
            stacklevel=2,
        )
    try:
        with disk_full_is_clear(path, kept="nothing was written into the run folder"):
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(_holder()) + "\n").encode("utf-8"), 0)
    except BaseException:
        if created:  # an empty record would read as a lock someone holds or held
            path.unlink(missing_ok=True)
        os.close(fd)
        raise
    lock = RunLock(path, fd)
    _HELD[str(path)] = lock
    return lock
