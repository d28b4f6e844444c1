"""Digests of what a partial or cached JSONL file holds, and of the order the run that wrote it plays.

``eval --out`` streams episodes into ``OUT.partial`` and ``--resume`` keeps the finished ones; ``benchmark``
keeps each (agent, dataset) pair's episodes as a cache. Both read back records that a person or a tool could
have edited, reordered or mixed with another run's: entered as they are, an edited ``em`` would change the
figures. :class:`RecordDigests` writes ``FILE.digests`` beside such a file: one SHA-256 per line, each chained
on the one before and, first, on what the run is (its identity: agent, env options, seed — which fix the
order of its episodes). So digest *i* vouches for lines 1..i, their order, and the run they belong to.

A reader keeps the longest prefix whose lines match their digests and plays the rest again, with a note:
nothing unverified enters a result, and nothing verified is played twice. Like a checkpoint's seal, a digest
proves that the lines belong together, not who wrote them (whoever rewrites the file can rewrite its
digests); what a verified line holds is still type-checked.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from searchgym.data.jsonl import read_lines
from searchgym.errors import DataFormatError

__all__ = ["DIGESTS_SUFFIX", "RecordDigests", "chain_digest"]

DIGESTS_SUFFIX = ".digests"
"""Beside the file whose lines it vouches for: ``OUT.partial.digests``."""

_HEX = 64


def _start(identity: Any) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, ensure_ascii=True).encode("ascii")).hexdigest()


def _next(previous: str, line: bytes) -> str:
    return hashlib.sha256(previous.encode("ascii") + line).hexdigest()


def chain_digest(identity: Any, lines: Iterable[bytes]) -> str:
    """The digest of ``lines`` (each with its newline) written in this order by the run ``identity``."""
    head = _start(identity)
    for line in lines:
        head = _next(head, line)
    return head


class RecordDigests:
    """The digests of the JSONL file ``target``, written by the run ``identity`` (see the module docstring).

    Args:
        target: The JSONL file (``OUT.partial``, a benchmark pair file).
        identity: What the run is (JSON-serialisable); a file written by another run matches no digest.
    """

    def __init__(self, target: str | os.PathLike[str], identity: Any) -> None:
        self.target = Path(target)
        self.path = self.target.with_name(self.target.name + DIGESTS_SUFFIX)
        self.identity = identity
        self.head = _start(identity)
        """The digest of every line written so far (of none: the run's identity alone)."""

    def verified(self) -> tuple[int, int]:
        """How many complete lines of ``target``, from the first, match their digests, and their bytes.

        A line without its newline (a torn write) is never counted.

        Raises:
            DataFormatError: ``target`` is over the read limits (:mod:`searchgym.data.limits`).
        """
        recorded = self._recorded()
        head, count, size = _start(self.identity), 0, 0
        if self.target.is_file():
            for n, line in read_lines(self.target):
                head = _next(head, line)
                if not line.endswith(b"\n") or n > len(recorded) or recorded[n - 1] != head:
                    break
                count, size = n, size + len(line)
        return count, size

    def _recorded(self) -> list[str]:
        if not self.path.is_file():
            return []
        try:
            return [line.decode("ascii").strip() for _, line in read_lines(self.path)]
        except (UnicodeDecodeError, DataFormatError):
            return []

    def restart(self) -> None:
        """Rewrites the digests of every line ``target`` now holds (call it once the unverified lines are
        cut, or on an empty file), so that :meth:`append` continues the chain."""
        head = _start(self.identity)
        digests = []
        if self.target.is_file():
            for _, line in read_lines(self.target):
                head = _next(head, line)
                digests.append(head)
        self.head = head
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text("".join(d + "\n" for d in digests), encoding="ascii")
        os.replace(tmp, self.path)

    def append(self, line: bytes) -> None:
        """Records the digest of ``line``, just written to ``target`` (with its newline)."""
        self.head = _next(self.head, line)
        with self.path.open("a", encoding="ascii") as f:
            f.write(self.head + "\n")

    def remove(self) -> None:
        """Deletes the digests file (the lines it vouched for were taken into a finished file)."""
        self.path.unlink(missing_ok=True)
