"""Which run folders a study may write into: those it marked, and those an earlier ``study run`` started
before marks were written (see :mod:`searchgym.app.study.runner`)."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

from .protocol import Protocol

__all__ = ["COMMAND", "MARK", "protocol_sha256", "refusal", "write_mark"]

COMMAND = "command.txt"
"""The ``train grpo`` command line a study wrote into a run folder it started."""
MARK = "study.json"
"""The mark of a run folder a study started (its name, the protocol's path and SHA-256, arm, seed)."""
_SMALL_FILE = 1 << 16  # a mark or command.txt larger than this is no file a study wrote


def protocol_sha256(protocol: Protocol) -> str:
    """The SHA-256 of the protocol file's bytes."""
    return hashlib.sha256(protocol.path.read_bytes()).hexdigest()


def _read_small(path: Path) -> str | None:
    """A small text file's content (``None`` if missing, unreadable, too large or not UTF-8)."""
    try:
        if not path.is_file() or path.stat().st_size > _SMALL_FILE:
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _same_path(a: str | Path, b: str | Path) -> bool:
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return False


def _started_before_marks(protocol: Protocol, arm: str, seed: int, folder: Path) -> bool:
    """Whether ``folder`` is this run's, started by a ``study run`` before marks were written: its
    ``command.txt`` is a ``train grpo`` command into this folder, with this seed and the protocol's
    warm-start."""
    text = _read_small(folder / COMMAND)
    try:
        words = shlex.split(text or "")
    except ValueError:
        return False
    if words[:3] != ["searchgym", "train", "grpo"]:
        return False
    given = {words[i]: words[i + 1] for i in range(3, len(words) - 1) if words[i].startswith("--")}
    return (
        _same_path(given.get("--run-dir", ""), folder)
        and given.get("--seed") == str(seed)
        and _same_path(given.get("--init", ""), protocol.warmstart)
        and folder.name == f"s{seed}"
        and folder.parent.name == arm
    )


def refusal(protocol: Protocol, arm: str, seed: int, folder: Path, digest: str) -> str | None:
    """Why the study may not write into ``folder`` for run ``arm``/``seed`` (``None``: it may)."""
    if not folder.exists() and not folder.is_symlink():
        return None
    if not folder.is_dir():
        return "it is not a folder"
    try:
        if not any(folder.iterdir()):
            return None
    except OSError as e:
        return f"it cannot be read ({e.strerror or e})"
    text = _read_small(folder / MARK)
    if text is not None:
        try:
            mark = json.loads(text)
        except ValueError:
            mark = None
        if isinstance(mark, dict):
            mine = (mark.get("study"), mark.get("arm"), mark.get("seed")) == (protocol.name, arm, seed)
            if mine and (
                mark.get("protocol_sha256") == digest
                or _same_path(str(mark.get("protocol", "")), protocol.path)
            ):
                return None
            return (
                f"its {MARK} marks it as run {mark.get('arm')!r}/s{mark.get('seed')} of study "
                f"{mark.get('study')!r} (protocol {mark.get('protocol')}), not run {arm}/s{seed} of this protocol"
            )
    if _started_before_marks(protocol, arm, seed, folder):
        return None
    return f"it holds files this study did not write (no {MARK} of study {protocol.name!r})"


def write_mark(protocol: Protocol, arm: str, seed: int, folder: Path, digest: str) -> None:
    mark = {
        "study": protocol.name,
        "protocol": str(protocol.path.resolve()),
        "protocol_sha256": digest,
        "arm": arm,
        "seed": seed,
    }
    (folder / MARK).write_text(json.dumps(mark, indent=1) + "\n", encoding="utf-8")
