"""Safe, atomic checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint is one ``torch.save`` file holding the model, optimizer and scheduler states, the RNG states,
the step, the config and the model's architecture. Every value in it is a tensor or plain data (``dict``,
``list``, ``tuple``, ``str``, ``int``, ``float``, ``bool``, ``None``), so it is read with
``torch.load(weights_only=True)``: loading a checkpoint never runs code, whoever made the file.

Integrity: ``torch.save`` writes a zip archive whose members carry CRC-32 checksums, but ``torch.load``
does not check them (a flipped bit in a weight loads silently). :func:`load_checkpoint` verifies every
member's CRC first, which catches every error burst of up to 32 bits, and refuses a corrupt file.

Atomicity: the file is written to a temporary file in the same folder and moved into place with
``os.replace``, so a run killed mid-write leaves the previous checkpoint intact; the temporary file it
leaves behind is removed on the next start (:func:`remove_stale_temp_files`).

Format ``v1`` checkpoints (searchgym before this format) pickled NumPy's RNG state and needed
``weights_only=False``; they are refused with a message that points to :func:`upgrade_checkpoint`, which
converts a file you trust.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from searchgym.errors import CheckpointError

__all__ = [
    "FORMAT",
    "LEGACY_FORMATS",
    "CheckpointError",
    "get_rng_state",
    "load_checkpoint",
    "remove_stale_temp_files",
    "save_checkpoint",
    "set_rng_state",
    "upgrade_checkpoint",
    "verify_archive",
]

FORMAT = "searchgym-checkpoint-v2"
"""The format tag stored in every checkpoint (``payload["format"]``)."""

LEGACY_FORMATS = ("searchgym-checkpoint-v1",)
"""Older tags: pickled payloads that :func:`upgrade_checkpoint` converts."""

_PLAIN = (str, int, float, bool, type(None), torch.Tensor, torch.dtype, torch.Size)
#: ``.NAME.PID.RANDOM.tmp``: the temporary file of a save by process PID.
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[^.]+\.tmp$")


def _check_plain(value: Any, where: str) -> None:
    """Refuses anything ``torch.load(weights_only=True)`` could not read back."""
    if isinstance(value, _PLAIN):
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str | int):
                raise CheckpointError(
                    f"cannot save {where}: key {k!r} is a {type(k).__name__}, not str or int"
                )
            _check_plain(v, f"{where}[{k!r}]")
        return
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
        return
    raise CheckpointError(
        f"cannot save {where}: a {type(value).__module__}.{type(value).__name__} is not a tensor or plain "
        "data (a checkpoint must load with weights_only=True)"
    )


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Writes ``payload`` (plus the format tag) to ``path`` atomically.

    Args:
        path: Destination file; its folder is created.
        payload: Tensors and plain data only (state dicts, :func:`get_rng_state`, ``dataclasses.asdict``).

    Returns:
        The path written.

    Raises:
        CheckpointError: the payload holds something other than tensors and plain data (the message names
            the key); nothing is written.
    """
    path = Path(path)
    _check_plain(payload, "payload")
    path.parent.mkdir(parents=True, exist_ok=True)
    # Named .NAME.PID.RANDOM.tmp so that the next start can tell a dead run's leftover from a live save.
    tmp = path.parent / f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    crc = torch.serialization.get_crc32_options()
    try:
        torch.serialization.set_crc32_options(True)  # the CRCs are the integrity check on load
        with tmp.open("xb") as f:
            torch.save({"format": FORMAT, **payload}, f)
            f.flush()
            os.fsync(f.fileno())  # the data must be on disk before the rename makes it the checkpoint
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        torch.serialization.set_crc32_options(crc)
    return path


def verify_archive(path: str | Path) -> None:
    """Checks that ``path`` is a complete zip archive whose members all match their CRC-32.

    Raises:
        CheckpointError: the file is truncated, corrupted, or not a zip archive.
    """
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
            if not infos:
                raise zipfile.BadZipFile("the archive is empty")
            bad = archive.testzip()  # reads every member and checks its CRC-32
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, OverflowError) as e:
        raise CheckpointError(
            f"checkpoint {path} is corrupted or truncated ({type(e).__name__}: {e}); "
            "delete it to start over, or point to an older copy"
        ) from None
    if bad is not None:
        raise CheckpointError(
            f"checkpoint {path} is corrupted: member {bad!r} fails its CRC-32 check; "
            "delete it to start over, or point to an older copy"
        )


def _legacy_tag(path: Path) -> str | None:
    """The legacy format tag in the archive's pickle, found by reading bytes (nothing is unpickled)."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
            data = archive.read(name) if name is not None else b""
    except (zipfile.BadZipFile, OSError, ValueError):
        return None
    return next((tag for tag in LEGACY_FORMATS if tag.encode() in data), None)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Reads a checkpoint written by :func:`save_checkpoint`, without running any code from the file.

    Raises:
        CheckpointError: the file is missing, truncated or corrupted (a CRC fails), holds pickled objects
            other than tensors and plain data, is an old pickled (v1) checkpoint (the message says how to
            convert it), or is not a searchgym checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    verify_archive(path)
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # weights_only: no code ran; any failure here is a bad file, reported as such
        legacy = _legacy_tag(path)
        if legacy is not None:
            raise CheckpointError(
                f"{path} is an old searchgym checkpoint ({legacy}), stored as a full pickle that could run "
                "code when loaded, so it is refused. If you trust the file (you made it), convert it once "
                f"with: python -m searchgym.agents.grpo.checkpoint upgrade {path} NEW.pt "
                "(or searchgym.agents.grpo.checkpoint.upgrade_checkpoint)"
            ) from None
        reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CheckpointError(
            f"{path} cannot be loaded safely: it holds pickled objects other than tensors and plain data, "
            f"or is malformed ({type(e).__name__}: {reason[:300]}); refusing to load it"
        ) from None
    found = payload.get("format") if isinstance(payload, dict) else None
    # A v1 file that loads with weights_only=True holds plain data only (an SFT checkpoint has no RNG
    # state): it is as safe as a v2 file, so it is accepted.
    if found != FORMAT and found not in LEGACY_FORMATS:
        raise CheckpointError(f"{path} is not a searchgym checkpoint (format {found!r}, expected {FORMAT!r})")
    assert isinstance(payload, dict)
    _check_fields(payload, path)
    return payload


def _check_fields(payload: dict[str, Any], path: Path) -> None:
    """The types of the fields the trainers read, so a crafted file fails here and not deep in a trainer."""
    expected: dict[str, type | tuple[type, ...]] = {
        "kind": str,
        "step": int,
        "model": dict,
        "arch": dict,
        "optimizer": dict,
        "scheduler": dict,
        "rng": dict,
        "config": dict,
    }
    for key, kind in expected.items():
        if key in payload and not isinstance(payload[key], kind):
            raise CheckpointError(
                f"{path}: field {key!r} is a {type(payload[key]).__name__}, not a valid value"
            )
    if isinstance(payload.get("step"), bool) or payload.get("step", 0) < 0:
        raise CheckpointError(f"{path}: field 'step' must be a non-negative integer")
    for name, value in payload.get("model", {}).items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{path}: the model state holds {name!r}, which is not a named tensor")


def upgrade_checkpoint(old: str | Path, new: str | Path) -> Path:
    """Converts a v1 checkpoint **that you trust** to the current, safely loadable format.

    The old file is read with ``torch.load(weights_only=False)``, which can run code embedded in the file:
    call this only on files you made. Only the payload keys the trainers use are kept, and the RNG states
    are converted to plain data.

    Args:
        old: The v1 checkpoint.
        new: Where to write the converted checkpoint (may equal ``old``).

    Returns:
        The path written.

    Raises:
        CheckpointError: ``old`` is missing, unreadable, or not a v1 searchgym checkpoint.
    """
    old = Path(old)
    if not old.is_file():
        raise CheckpointError(f"no checkpoint at {old}")
    verify_archive(old)
    if _legacy_tag(old) is None:
        raise CheckpointError(f"{old} is not a legacy searchgym checkpoint ({', '.join(LEGACY_FORMATS)})")
    try:
        payload = torch.load(old, map_location="cpu", weights_only=False)  # the caller vouches for the file
    except Exception as e:
        raise CheckpointError(f"cannot read {old} ({type(e).__name__}: {e})") from None
    if not isinstance(payload, dict) or payload.get("format") not in LEGACY_FORMATS:
        raise CheckpointError(f"{old} is not a legacy searchgym checkpoint")
    payload = {k: v for k, v in payload.items() if k != "format"}
    if "rng" in payload:
        payload["rng"] = _plain_rng_state(payload["rng"])
    return save_checkpoint(new, payload)


# -- RNG states --------------------------------------------------------------------------------------------


def _plain_rng_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with NumPy's legacy state tuple as plain data (v1 stored the tuple with its array)."""
    out = dict(state)
    numpy_state = out.get("numpy")
    if isinstance(numpy_state, tuple):
        name, keys, pos, has_gauss, cached = numpy_state
        out["numpy"] = {
            "bit_generator": str(name),
            "keys": [int(k) for k in np.asarray(keys).tolist()],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    return out


def get_rng_state(generator: torch.Generator | None = None) -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's RNGs (and of ``generator``, e.g. the policy's).

    Every value is a tensor or plain data, so the state can be saved in a checkpoint.
    """
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(legacy=True),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if generator is not None:
        state["generator"] = generator.get_state()
    return _plain_rng_state(state)


def set_rng_state(state: dict[str, Any], generator: torch.Generator | None = None) -> None:
    """Restores what :func:`get_rng_state` saved.

    Raises:
        CheckpointError: ``state`` is malformed.
    """
    try:
        python = state["python"]
        version, internal, gauss = python
        random.setstate((int(version), tuple(int(x) for x in internal), gauss))
        numpy_state = state["numpy"]
        if isinstance(numpy_state, Mapping):
            numpy_state = (
                str(numpy_state["bit_generator"]),
                np.asarray(numpy_state["keys"], dtype=np.uint32),
                int(numpy_state["pos"]),
                int(numpy_state["has_gauss"]),
                float(numpy_state["cached_gaussian"]),
            )
        np.random.set_state(numpy_state)
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
        if generator is not None and "generator" in state:
            generator.set_state(state["generator"])
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError, OverflowError) as e:
        raise CheckpointError(f"malformed RNG state in the checkpoint ({type(e).__name__}: {e})") from None


# -- run folders ---------------------------------------------------------------------------------------------


def remove_stale_temp_files(folder: str | Path) -> list[Path]:
    """Deletes the temporary files that saves killed mid-write left in ``folder``.

    A temporary file is ``.NAME.PID.RANDOM.tmp``; one whose process is still running (a live save) is kept.

    Returns:
        The files removed.
    """
    removed: list[Path] = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for f in folder.iterdir():
        match = _TEMP.match(f.name)
        if match is None or not f.is_file():
            continue
        pid = int(match["pid"])
        if pid != os.getpid() and _alive(pid):
            continue
        f.unlink(missing_ok=True)
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


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m searchgym.agents.grpo.checkpoint", description="Checkpoint maintenance."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser(
        "upgrade", help="convert a v1 checkpoint YOU TRUST (it is unpickled) to the safe format"
    )
    up.add_argument("old")
    up.add_argument("new")
    args = parser.parse_args(argv)
    try:
        written = upgrade_checkpoint(args.old, args.new)
    except CheckpointError as e:
        print(f"error: {e}")
        return 2
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
