"""How many bytes searchgym decodes from a file it does not trust, before it refuses the file.

Rows and values are not enough of a bound: a 20 KB parquet file of four dictionary-encoded 300 MB strings,
a 300 KB gzip that inflates to 665 MB, or a single 200 MB JSONL line all hold few records. Every reader of
untrusted data — the JSONL reader (corpora, question splits, demonstrations, episode records, metrics logs),
the cassette reader and the parquet reader — counts decoded bytes against two limits:

* **a line** (a JSONL record) may hold at most ``SEARCHGYM_MAX_LINE_MB`` MiB (default :data:`MAX_LINE_MB`);
* **a file** may decode to at most ``SEARCHGYM_MAX_FILE_MB`` MiB (default :data:`MAX_FILE_MB`): a JSONL
  file's bytes, a cassette's inflated JSON, a parquet file's decoded column data.

Over a limit, the reader stops before holding more than about the limit and raises a
:class:`~searchgym.errors.DataFormatError` naming the file, the limit and the variable that raises it (a
real corpus larger than the default, such as Search-R1's 14 GB wiki-18, needs ``SEARCHGYM_MAX_FILE_MB``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from searchgym.errors import ConfigError, DataFormatError

__all__ = ["FILE_VARIABLE", "LINE_VARIABLE", "MAX_FILE_MB", "MAX_LINE_MB", "ReadLimits", "read_limits"]

MAX_LINE_MB = 16
"""Default largest JSONL line, in MiB (a corpus passage or an episode record is a few KB)."""

MAX_FILE_MB = 512
"""Default largest decoded file, in MiB."""

LINE_VARIABLE = "SEARCHGYM_MAX_LINE_MB"
FILE_VARIABLE = "SEARCHGYM_MAX_FILE_MB"

_MIB = 1 << 20


@dataclass(frozen=True)
class ReadLimits:
    """The byte limits in force (see the module docstring).

    Attributes:
        line_bytes: Largest JSONL line, in bytes.
        file_bytes: Largest decoded file, in bytes.
    """

    line_bytes: int
    file_bytes: int

    def line_too_long(self, path: object, line: int) -> DataFormatError:
        """The error of a line over :attr:`line_bytes`."""
        return DataFormatError(
            str(path),
            line,
            f"the line is longer than {_mib(self.line_bytes)}, the most searchgym reads of one line; if the "
            f"file is yours, raise the limit with {LINE_VARIABLE}=N (MiB)",
        )

    def file_too_large(self, path: object, what: str = "holds") -> DataFormatError:
        """The error of a file that decodes to more than :attr:`file_bytes` (``what``: how it does)."""
        return DataFormatError(
            str(path),
            None,
            f"{what} more than {_mib(self.file_bytes)}, the most searchgym decodes of one file; for a real "
            f"corpus that large, raise the limit with {FILE_VARIABLE}=N (MiB)",
        )


def _mib(size: int) -> str:
    return f"{size / _MIB:g} MiB"


def _variable(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default * _MIB
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0 and value * _MIB < 2**62):
        raise ConfigError(f"{name}={raw!r:.40}: expected a positive number of MiB (default {default})")
    return int(value * _MIB)


def read_limits() -> ReadLimits:
    """The limits of this process: :data:`MAX_LINE_MB` and :data:`MAX_FILE_MB`, or the environment's
    ``SEARCHGYM_MAX_LINE_MB`` / ``SEARCHGYM_MAX_FILE_MB``.

    Raises:
        ConfigError: a variable holds something other than a positive number.
    """
    return ReadLimits(_variable(LINE_VARIABLE, MAX_LINE_MB), _variable(FILE_VARIABLE, MAX_FILE_MB))
