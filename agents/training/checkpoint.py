"""Safe, atomic checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint is one ``torch.save`` file holding the model, optimizer and scheduler states, the RNG states,
the step, the config and the model's architecture. Every value in it is a tensor or plain data (``dict``,
``list``, ``tuple``, ``str``, ``int``, ``float``, ``bool``, ``None``), so it is read with
``torch.load(weights_only=True)``: loading a checkpoint never runs code, whoever made the file.

Integrity: ``torch.save`` writes a zip archive whose members carry CRC-32 checksums, but ``torch.load``
does not check them (a flipped bit in a weight loads silently). :func:`load_checkpoint` verifies every
member's CRC first, which catches every error burst of up to 32 bits, and refuses a corrupt file.

Seal: :func:`save_checkpoint` records a SHA-256 of everything it saves (every tensor's dtype, shape and
bytes, and every other value, keys in order: :func:`payload_digest`) under ``"seal"``; :func:`load_checkpoint`
recomputes it and refuses a file whose contents no longer match — a tensor or the config edited after the
save (loaded and re-saved with the old seal), or parts of two files put together. A seal proves the parts
belong together, not who wrote them: a file re-sealed by whoever changed it loads (its values still pass the
bounds below). Files saved before checkpoints were sealed carry no seal and load unchecked by it.

Atomicity: the file is written to a temporary file in the same folder and moved into place with
``os.replace``, so a run killed mid-write leaves the previous checkpoint intact; the temporary file it
leaves behind is removed on the next start (:func:`remove_stale_temp_files`).

Bounds: a checkpoint describes the model to build (``arch``) and the run's config; both are checked before
anything is built from them (:mod:`.checkpoint_checks`). Every floating tensor of the model and optimizer
states must be finite; :func:`~.state.load_training_state` checks the optimizer's and scheduler's
states against the live ones (shapes, value types) before restoring them.

Format ``v1`` checkpoints (searchgym before this format) pickled NumPy's RNG state and needed
``weights_only=False``; they are refused with a message that points to :func:`upgrade_checkpoint`, which
converts a file you trust (``searchgym checkpoint upgrade OLD NEW``).
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from searchgym.errors import CheckpointError
from searchgym.integrity import disk_full_is_clear, sigint_held, temp_path

from .checkpoint_checks import (
    check_arch,
    check_config,
    check_token_ids,
    iter_tensors,
    storage_elements,
)
from .state import plain_rng_state

__all__ = [
    "FORMAT",
    "LEGACY_FORMATS",
    "load_checkpoint",
    "payload_digest",
    "peek_checkpoint",
    "save_checkpoint",
    "upgrade_checkpoint",
    "verify_archive",
]

FORMAT = "searchgym-checkpoint-v2"
"""The format tag stored in every checkpoint (``payload["format"]``)."""

LEGACY_FORMATS = ("searchgym-checkpoint-v1",)
"""Older tags: pickled payloads that :func:`upgrade_checkpoint` converts."""

_PLAIN = (str, int, float, bool, type(None), torch.Tensor, torch.dtype, torch.Size)


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


SEAL = "seal"
"""The payload key of the checkpoint's seal: ``{"sha256": payload_digest(payload without it)}``."""


def payload_digest(payload: Mapping[str, Any]) -> str:
    """The SHA-256 of a checkpoint payload's contents (the seal itself left out): every tensor's dtype, shape
    and bytes, every other value's type and ``repr``, mapping keys in sorted order."""
    digest = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            flat = value.detach().cpu().contiguous().reshape(-1)
            digest.update(f"T{flat.dtype}{tuple(value.shape)}".encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes())
        elif isinstance(value, Mapping):
            keys = sorted((k for k in value if not (value is payload and k == SEAL)), key=repr)
            digest.update(b"{%d" % len(keys))
            for key in keys:
                digest.update(repr(key).encode())
                feed(value[key])
            digest.update(b"}")
        elif isinstance(value, list | tuple):
            digest.update(b"[%d" % len(value))
            for item in value:
                feed(item)
            digest.update(b"]")
        else:
            digest.update(f"{type(value).__name__}:{value!r};".encode())

    feed(payload)
    return digest.hexdigest()


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Writes ``payload`` (plus the format tag and its seal) to ``path`` atomically.

    Args:
        path: Destination file; its folder is created.
        payload: Tensors and plain data only (state dicts, :func:`get_rng_state`, ``dataclasses.asdict``).

    Returns:
        The path written.

    Raises:
        CheckpointError: the payload holds something other than tensors and plain data (the message names
            the key); nothing is written.
        DiskFullError: the disk filled up; the previous file at ``path`` is intact and no temporary file
            is left.
    """
    path = Path(path)
    _check_plain(payload, "payload")
    path.parent.mkdir(parents=True, exist_ok=True)
    # Named .NAME.PID.RANDOM.tmp so that the next start can tell a dead run's leftover from a live save.
    tmp = temp_path(path)
    crc = torch.serialization.get_crc32_options()
    # Ctrl-C during the write is delivered once the checkpoint is in place (see sigint_held).
    needed = sum(t.numel() * t.element_size() for _, t in iter_tensors(payload, "payload"))
    kept = f"{path} is as it was" + (" (the previous checkpoint, intact)" if path.exists() else "")
    with sigint_held(), disk_full_is_clear(path, needed, kept):
        try:
            torch.serialization.set_crc32_options(True)  # the CRCs are the integrity check on load
            with tmp.open("xb") as f:
                sealed = {"format": FORMAT, **{k: v for k, v in payload.items() if k != SEAL}}
                sealed[SEAL] = {"sha256": payload_digest(sealed)}
                torch.save(sealed, f)
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
    except zipfile.BadZipFile as e:
        # Most often a file that never was a checkpoint (a README, a JSON file): say so, and never suggest
        # deleting it — it may be the user's own file.
        raise CheckpointError(
            f"{path} is not a searchgym checkpoint (not a zip archive as torch.save writes: {e}), or it is "
            "truncated; point to a RUN_DIR/checkpoint.pt"
        ) from None
    except (OSError, EOFError, ValueError, NotImplementedError, OverflowError) as e:
        raise CheckpointError(
            f"{path} cannot be read as a checkpoint ({type(e).__name__}: {e}); it is truncated or corrupted, "
            "or not a checkpoint: point to another copy"
        ) from None
    if bad is not None:
        raise CheckpointError(
            f"checkpoint {path} is corrupted: member {bad!r} fails its CRC-32 check; point to another copy "
            "(an earlier checkpoint of the run, or a backup)"
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
            convert it), is not a searchgym checkpoint, or holds a field of the wrong type or range, a
            non-finite weight or optimizer value, or an architecture larger than the weights it stores
            (see :func:`check_config`, :func:`check_arch`).
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
                f"with: searchgym checkpoint upgrade {path} NEW.pt "
                "(or searchgym.agents.training.checkpoint.upgrade_checkpoint)"
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
    _check_seal(payload, path)
    _check_fields(payload, path)
    _check_tensors(payload, path)
    if "config" in payload:
        check_config(payload["config"], payload.get("kind"), path)  # read it with stored_config
    if "arch" in payload:
        check_arch(payload["arch"], payload.get("model", {}), path)
    check_token_ids(payload, path)
    return payload


def peek_checkpoint(path: str | Path) -> dict[str, Any] | None:
    """A checkpoint's payload with its tensors memory-mapped, not read: for its small fields (``step``,
    ``kind``, ``config``) before or without a full load. Nothing is checked here (:func:`check_config` checks
    a config); ``None`` when torch cannot read the file or it is not a mapping, and :func:`load_checkpoint`
    then says what is wrong with it.
    """
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return None
    return payload if isinstance(payload, dict) else None


def _check_seal(payload: dict[str, Any], path: Path) -> None:
    """The contents match the seal recorded at save (a file without a seal predates sealing: unchecked)."""
    if SEAL not in payload:
        return
    seal = payload[SEAL]
    if not (isinstance(seal, dict) and isinstance(seal.get("sha256"), str)):
        raise CheckpointError(f"{path}: its seal is malformed; point to another copy")
    if payload_digest(payload) != seal["sha256"]:
        raise CheckpointError(
            f"checkpoint {path} does not match its seal: a tensor or the config was changed after it was saved "
            "(an edit, or parts of two files put together); point to another copy (an earlier checkpoint of "
            "the run, or a backup)"
        )


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


def _check_tensors(payload: Mapping[str, Any], path: Path) -> None:
    """Every tensor of the model, optimizer and scheduler states: no view larger than its storage, and
    every floating value finite (a NaN optimizer state would resume into NaN weights without an error)."""
    for key in ("model", "optimizer", "scheduler"):
        for where, tensor in iter_tensors(payload.get(key), key):
            if tensor.numel() > storage_elements(tensor):
                raise CheckpointError(
                    f"{path}: {where} claims {tensor.numel()} elements over a storage of "
                    f"{storage_elements(tensor)} (a crafted view); refusing to load it"
                )
            if (tensor.is_floating_point() or tensor.is_complex()) and not bool(torch.isfinite(tensor).all()):
                raise CheckpointError(
                    f"{path}: {where} holds non-finite values (NaN or inf); the run diverged before this "
                    "save or the file is damaged: resume from an earlier checkpoint"
                )


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
        payload["rng"] = plain_rng_state(payload["rng"])
    return save_checkpoint(new, payload)
