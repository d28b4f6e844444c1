"""The error hierarchy of searchgym.

Every error the package raises on purpose derives from :class:`SearchGymError`, so callers can catch the
family at once, and each also derives from the builtin it refines (``ValueError``, ``KeyError`` …), so code
written against builtins keeps working.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataFormatError",
    "DiskFullError",
    "DownloadError",
    "EpisodeFinishedError",
    "InvalidActionError",
    "MissingDependencyError",
    "RetrieverError",
    "SearchGymError",
    "ServedModelError",
    "UnknownQuestionError",
    "checkout_root",
    "install_command",
]


class SearchGymError(Exception):
    """Base class of every error raised by searchgym."""


class ConfigError(SearchGymError, ValueError):
    """An argument or configuration value is invalid; the message says which values are accepted."""


class DataFormatError(SearchGymError, ValueError):
    """A data file is malformed. The message names the file and the 1-based line.

    Attributes:
        path: The file that holds the bad record.
        line: 1-based line number of the bad record, or ``None`` when the problem is not tied to a line.
    """

    def __init__(self, path: str, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line


class UnknownQuestionError(SearchGymError, KeyError):
    """A question id was requested that the dataset split does not contain."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable.
        return str(self.args[0]) if self.args else ""


class InvalidActionError(SearchGymError, ValueError):
    """An action is not a token id of the environment's vocabulary."""


class EpisodeFinishedError(SearchGymError, RuntimeError):
    """``step`` was called on an episode that has already terminated or been truncated."""


class CheckpointError(SearchGymError, RuntimeError):
    """A checkpoint is missing, unreadable, truncated, or not a searchgym checkpoint."""


class RetrieverError(SearchGymError, RuntimeError):
    """Retrieval failed (unreachable server, bad response, exhausted retries)."""


class ServedModelError(SearchGymError, RuntimeError):
    """A served model (an OpenAI-compatible endpoint) failed: unreachable, an error status after the retries,
    or an answer that is not a completion. The message names the URL and what came back."""


class DiskFullError(SearchGymError, OSError):
    """A write ran out of space (``ENOSPC``/``EDQUOT``). The message names the file, the space the write
    needed (when known) and what was free, and what was kept: atomic writes leave the previous file intact.

    ``errno`` is the write's (``ENOSPC`` or ``EDQUOT``); ``str()`` is the message alone."""

    def __str__(self) -> str:
        return str(self.strerror)


class MissingDependencyError(SearchGymError, ImportError):
    """An optional dependency is needed; the message names the extra that installs it."""

    def __init__(self, package: str, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the optional package {package!r}. Install it with: {install_command(extra)}"
        )
        self.package = package
        self.extra = extra


class DownloadError(SearchGymError, OSError):
    """A file could not be downloaded: the host refused it, could not be reached, or kept dropping the
    connection; the message names the address and what was kept."""


def checkout_root() -> Path | None:
    """The repository folder of an editable install from a checkout (``None`` for a wheel install)."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "setup.cfg").is_file() and (root / "Makefile").is_file() else None


def install_command(extra: str | None = None) -> str:
    """The one advice for installing ``extra`` (or searchgym itself), given by every missing-dependency error
    and by ``searchgym doctor``.

    From a checkout: its editable install with the pinned constraints, run in the checkout (verl: its own
    virtualenv, which ``make test-verl`` builds). From a wheel: the extra's own requirements, as the
    installed metadata lists them, which the package index has.
    """
    root = checkout_root()
    if extra == "verl":
        if root is not None:
            return "make test-verl (builds .venv-verl: verl pins transformers < 5.11, so it has its own virtualenv)"
        return f"pip install {_extra_requirements('verl')} in a separate virtualenv (verl pins transformers < 5.11)"
    if extra == "verifiers":  # verifiers pins mcp 2, which OpenEnv's fastmcp (the dev extra) refuses
        if root is not None:
            return "make test-verifiers (builds .venv-verifiers: verifiers and OpenEnv need different mcp releases)"
        return f"pip install {_extra_requirements('verifiers')} in a virtualenv without the openenv extra"
    if root is not None:
        return (
            f"pip install -c constraints.txt -e '.[{extra}]'"
            if extra
            else "pip install -c constraints.txt -e ."
        )
    return f"pip install {_extra_requirements(extra)}" if extra else "pip install searchgym"


def _extra_requirements(extra: str) -> str:
    """The requirements the installed searchgym declares for ``extra``, quoted for a shell (its own
    ``searchgym[extra]`` when the metadata lists none)."""
    from importlib import metadata

    try:
        declared = metadata.requires("searchgym") or []
    except metadata.PackageNotFoundError:
        declared = []
    marker = re.compile(rf"""\bextra\s*==\s*["']{re.escape(extra)}["']""")
    wanted = [text.split(";", 1)[0].strip() for text in declared if ";" in text and marker.search(text)]
    return " ".join(f"'{w}'" for w in wanted) if wanted else f"'searchgym[{extra}]'"
