"""Atomic checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint is one ``torch.save`` file holding the model, optimizer and scheduler states, the RNG states,
the step, the config and the model's architecture. It is written to a temporary file in the same folder
and moved into place with ``os.replace``, so a run killed mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import os
import pickle
import random
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from searchgym.errors import CheckpointError

__all__ = [
    "FORMAT",
    "CheckpointError",
    "get_rng_state",
    "load_checkpoint",
    "save_checkpoint",
    "set_rng_state",
]

FORMAT = "searchgym-checkpoint-v1"


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Writes ``payload`` (plus the format tag) to ``path`` atomically.

    Args:
        path: Destination file; its folder is created.
        payload: Picklable state (tensors, state dicts, plain values).

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format": FORMAT, **payload}, f)
            f.flush()
            os.fsync(f.fileno())  # the data must be on disk before the rename makes it the checkpoint
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Reads a checkpoint written by :func:`save_checkpoint`.

    Raises:
        CheckpointError: the file is missing, truncated or corrupted, or not a searchgym checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        # weights_only=False: the payload holds RNG states and plain config dicts written by this package.
        payload = torch.load(path, map_location=map_location, weights_only=False)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as e:
        raise CheckpointError(
            f"checkpoint {path} is corrupted or truncated ({type(e).__name__}: {e}); "
            "delete it to start over, or point to an older copy"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a searchgym checkpoint (expected format {FORMAT!r})")
    return payload


def get_rng_state(generator: torch.Generator | None = None) -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's RNGs (and of ``generator``, e.g. the policy's)."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if generator is not None:
        state["generator"] = generator.get_state()
    return state


def set_rng_state(state: dict[str, Any], generator: torch.Generator | None = None) -> None:
    """Restores what :func:`get_rng_state` saved."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if generator is not None and "generator" in state:
        generator.set_state(state["generator"])
