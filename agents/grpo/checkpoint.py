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

Bounds: a checkpoint describes the model to build (``arch``) and the run's config; both are checked before
anything is built from them (:func:`check_arch`, :func:`check_config`): every config field against the type
its dataclass declares and the dataclass's own range checks, context sizes against
:data:`MAX_CONTEXT_TOKENS`, and the architecture's parameter count against the elements the file actually
stores, so a 1 KB file cannot make the loader allocate gigabytes. Every floating tensor of the model and
optimizer states must be finite; :func:`load_training_state` checks the optimizer's and scheduler's states
against the live ones (shapes, value types) before restoring them.

Format ``v1`` checkpoints (searchgym before this format) pickled NumPy's RNG state and needed
``weights_only=False``; they are refused with a message that points to :func:`upgrade_checkpoint`, which
converts a file you trust.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
import types
import typing
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import numpy as np
import torch

from searchgym.errors import CheckpointError
from searchgym.integrity import remove_stale_temp_files, sigint_held, temp_path

__all__ = [
    "FORMAT",
    "LEGACY_FORMATS",
    "MAX_CONTEXT_TOKENS",
    "MAX_LAYERS",
    "CheckpointError",
    "check_arch",
    "check_config",
    "get_rng_state",
    "load_checkpoint",
    "load_training_state",
    "peek_checkpoint",
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

MAX_CONTEXT_TOKENS = 1 << 20
"""The largest ``max_context_tokens`` / ``max_turn_tokens`` a checkpoint's config may hold (the env
allocates its observation arrays at this size)."""

MAX_LAYERS = 1024
"""The most transformer layers a checkpoint's architecture may describe (the largest open models have
~130)."""

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
    tmp = temp_path(path)
    crc = torch.serialization.get_crc32_options()
    # Ctrl-C during the write is delivered once the checkpoint is in place (see sigint_held).
    with sigint_held():
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
    _check_tensors(payload, path)
    if "config" in payload:
        check_config(payload["config"], payload.get("kind"), path)
    if "arch" in payload:
        check_arch(payload["arch"], payload.get("model", {}), path)
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


def _storage_elements(tensor: torch.Tensor) -> int:
    """Elements the tensor's storage really holds (a crafted view may claim far more)."""
    return int(tensor.untyped_storage().nbytes()) // max(1, tensor.element_size())


def _walk_tensors(value: Any, where: str) -> typing.Iterator[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        yield where, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _walk_tensors(v, f"{where}[{k!r}]")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _walk_tensors(v, f"{where}[{i}]")


def _check_tensors(payload: Mapping[str, Any], path: Path) -> None:
    """Every tensor of the model, optimizer and scheduler states: no view larger than its storage, and
    every floating value finite (a NaN optimizer state would resume into NaN weights without an error)."""
    for key in ("model", "optimizer", "scheduler"):
        for where, tensor in _walk_tensors(payload.get(key), key):
            if tensor.numel() > _storage_elements(tensor):
                raise CheckpointError(
                    f"{path}: {where} claims {tensor.numel()} elements over a storage of "
                    f"{_storage_elements(tensor)} (a crafted view); refusing to load it"
                )
            if (tensor.is_floating_point() or tensor.is_complex()) and not bool(torch.isfinite(tensor).all()):
                raise CheckpointError(
                    f"{path}: {where} holds non-finite values (NaN or inf); the run diverged before this "
                    "save or the file is damaged: resume from an earlier checkpoint"
                )


# -- the saved config and architecture ----------------------------------------------------------------------


def _config_class(kind: Any) -> type[Any]:
    """The dataclass a checkpoint of ``kind`` saved its config from (imported here: config.py is torch-free)."""
    from .config import CommonConfig, GRPOConfig, SFTConfig

    return (
        {"grpo": GRPOConfig, "sft": SFTConfig}.get(kind, CommonConfig)
        if isinstance(kind, str)
        else CommonConfig
    )


def _fits(value: Any, hint: Any) -> bool:
    """Whether a plain value (as ``torch.load(weights_only=True)`` returns it) is of the annotated type."""
    if hint is Any or hint is object:
        return True
    if hint is None or hint is type(None):
        return value is None
    origin = get_origin(hint)
    if origin is Literal:
        return any(type(value) is type(a) and value == a for a in get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in get_args(hint))
    if origin in (list, tuple, set, frozenset, typing.Sequence):
        args = [a for a in get_args(hint) if a is not Ellipsis]
        return isinstance(value, list | tuple) and all(_fits(v, args[0]) for v in value) if args else True
    if origin in (dict, typing.Mapping):
        return isinstance(value, Mapping)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # an annotation this check does not know: the dataclass's own checks still run


def _describe(hint: Any) -> str:
    text = str(hint).replace("typing.", "")
    return text[len("<class '") : -2] if text.startswith("<class '") else text


def check_config(config: Any, kind: Any, path: str | Path) -> None:
    """Checks a checkpoint's saved config before anything reads it.

    Each field of the config dataclass of ``kind`` (``GRPOConfig`` for ``"grpo"``, ``SFTConfig`` for
    ``"sft"``, else ``CommonConfig``) must have the type the dataclass declares (found from its type hints,
    so fields added later are covered), floats must be finite and integers fit in 64 bits; then the
    dataclass is built from them, so its own range checks run. Context and turn sizes may not exceed
    :data:`MAX_CONTEXT_TOKENS`. Keys the dataclass does not declare (a field of another version) are ignored.

    Raises:
        CheckpointError: naming the first bad field, its value and what was expected.
    """
    if not isinstance(config, Mapping):
        raise CheckpointError(f"{path}: field 'config' is a {type(config).__name__}, not a mapping")
    cls = _config_class(kind)
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if not field.init or field.name not in config:
            continue
        value, hint = config[field.name], hints.get(field.name, Any)
        if not _fits(value, hint):
            raise CheckpointError(
                f"{path}: config field {field.name!r} is {value!r:.80} ({type(value).__name__}), "
                f"expected {_describe(hint)}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise CheckpointError(f"{path}: config field {field.name!r} is {value!r}, not a finite number")
        if isinstance(value, int) and not -(1 << 63) <= value < 1 << 63:
            raise CheckpointError(f"{path}: config field {field.name!r} does not fit in 64 bits")
        values[field.name] = value
    for name in ("max_context_tokens", "max_turn_tokens"):
        value = values.get(name)
        if isinstance(value, int) and value > MAX_CONTEXT_TOKENS:
            raise CheckpointError(
                f"{path}: config field {name!r} is {value}, more than the {MAX_CONTEXT_TOKENS} tokens searchgym "
                "allows"
            )
    try:
        cls(**values)
    except (ValueError, TypeError, ArithmeticError) as e:  # ConfigError is a ValueError
        raise CheckpointError(f"{path}: the saved config is not valid: {e}") from None


def _stored_elements(state: Any) -> int:
    """Elements the model state's storages hold, each storage counted once (tied weights share one)."""
    seen: set[tuple[str, int]] = set()
    total = 0
    for _, tensor in _walk_tensors(state, "model"):
        storage = tensor.untyped_storage()
        key = (str(storage.device), storage.data_ptr())
        if key not in seen:
            seen.add(key)
            total += _storage_elements(tensor)
    return total


def _size(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def check_arch(arch: Any, state: Any, path: str | Path) -> None:
    """Checks a checkpoint's architecture before a model is built from it.

    Field types and bounds (at most :data:`MAX_LAYERS` layers, hidden sizes up to 65536), then a lower
    bound of the parameter count against the elements ``state`` (the checkpoint's model weights) stores:
    a model built from the architecture must fit the weights it is about to receive, so a small file
    cannot describe a huge model. ``tiny`` models are counted from their sizes (each layer holds at least
    ``2 * hidden**2`` weights); ``config`` models are built on torch's ``meta`` device (no memory) and
    counted without their token embeddings.

    Raises:
        CheckpointError: naming the field, or the counts.
    """
    if not isinstance(arch, Mapping):
        raise CheckpointError(f"{path}: field 'arch' is a {type(arch).__name__}, not a mapping")
    kind = arch.get("kind")
    if arch.get("tokenizer") is not None and not isinstance(arch["tokenizer"], str):
        raise CheckpointError(f"{path}: arch 'tokenizer' must be a string or null")
    stored = _stored_elements(state)
    if kind == "tiny":
        limits = {"layers": MAX_LAYERS, "hidden": 1 << 16}
        for name, high in limits.items():
            if not _size(arch.get(name), 1, high):
                raise CheckpointError(
                    f"{path}: arch {name!r} must be an integer in [1, {high}], got {arch.get(name)!r:.40}"
                )
        needed = 2 * arch["layers"] * arch["hidden"] ** 2
    elif kind == "config":
        needed = _config_parameters(arch.get("config"), path)
    elif kind == "pretrained":
        if not isinstance(arch.get("name"), str) or not isinstance(arch.get("tokenizer"), str):
            raise CheckpointError(f"{path}: arch 'name' and 'tokenizer' must be strings")
        return  # the weights come from that model's own files, sized by them
    else:
        raise CheckpointError(
            f"{path}: unknown model kind {kind!r:.40} (expected 'tiny', 'config' or 'pretrained')"
        )
    if needed > stored:
        raise CheckpointError(
            f"{path}: arch describes a model of at least {needed:,} parameters but the checkpoint stores "
            f"{stored:,} weights; refusing to build it (the file is corrupt or crafted)"
        )


def _config_parameters(values: Any, path: str | Path) -> int:
    """Parameters of a ``config`` architecture, its token embedding left out (the tokenizer sizes it)."""
    if not isinstance(values, Mapping) or not isinstance(values.get("model_type"), str):
        raise CheckpointError(f"{path}: arch 'config' must be a transformers config with a 'model_type'")
    for key, value in values.items():
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 1 << 31:
            raise CheckpointError(f"{path}: arch config field {key!r} is {value!r:.40}, out of range")
        if isinstance(value, float) and not math.isfinite(value):
            raise CheckpointError(f"{path}: arch config field {key!r} is {value!r}, not a finite number")
    from ..llm import _import_transformers

    tf = _import_transformers("Checking a checkpoint's model config")
    fields = {
        k: v for k, v in values.items() if k not in ("model_type", "architectures", "transformers_version")
    }
    fields["vocab_size"] = 1
    try:
        config = tf.AutoConfig.for_model(values["model_type"], **fields)
    except Exception as e:  # transformers raises many kinds for a bad config: all mean a bad file
        raise CheckpointError(
            f"{path}: arch config of type {values['model_type']!r:.40} is not usable ({e})"
        ) from None
    sizes = {
        name: getattr(config, name, None)
        for name in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads")
    }
    for name, value in sizes.items():
        high = MAX_LAYERS if name == "num_hidden_layers" else 1 << 20
        if value is not None and not _size(value, 1, high):
            raise CheckpointError(
                f"{path}: arch config field {name!r} must be an integer in [1, {high}], got {value!r:.40}"
            )
    try:
        with torch.device("meta"):
            model = tf.AutoModelForCausalLM.from_config(config)
    except Exception as e:
        raise CheckpointError(
            f"{path}: arch config of type {values['model_type']!r:.40} cannot be built ({e})"
        ) from None
    embeddings = {
        id(m.weight) for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
    }
    return sum(p.numel() for p in model.parameters() if id(p) not in embeddings)


# -- resuming the optimizer ---------------------------------------------------------------------------------


def _like(saved: Any, live: Any, where: str, path: str | Path) -> None:
    """``saved`` has the structure and value types of ``live`` (numbers may be int or float, finite)."""

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{path}: {where} {what}; the optimizer state does not fit this run")

    if isinstance(live, torch.Tensor):
        if not isinstance(saved, torch.Tensor):
            raise bad(f"is a {type(saved).__name__}, not a tensor")
        if saved.shape != live.shape:
            raise bad(f"has shape {tuple(saved.shape)}, expected {tuple(live.shape)}")
    elif live is None:
        pass  # an unset option (foreach, fused...): torch accepts what another version wrote
    elif isinstance(live, bool | str):
        if type(saved) is not type(live):
            raise bad(f"is {saved!r:.40}, expected a {type(live).__name__}")
    elif isinstance(live, int | float):
        if isinstance(saved, bool) or not isinstance(saved, int | float) or not math.isfinite(saved):
            raise bad(f"is {saved!r:.40}, expected a finite number")
    elif isinstance(live, Mapping):
        if not isinstance(saved, Mapping):
            raise bad(f"is a {type(saved).__name__}, expected a mapping")
        for k, v in live.items():
            if k in saved:
                _like(saved[k], v, f"{where}[{k!r}]", path)
    elif isinstance(live, list | tuple):
        if not isinstance(saved, list | tuple) or len(saved) != len(live):
            raise bad(f"is {saved!r:.60}, expected {len(live)} values")
        for i, (s, v) in enumerate(zip(saved, live, strict=True)):
            _like(s, v, f"{where}[{i}]", path)


def load_training_state(
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    payload: Mapping[str, Any],
    path: str | Path,
) -> None:
    """Restores a checkpoint's optimizer and scheduler states after checking them against the live ones.

    ``torch``'s ``load_state_dict`` accepts a state of the wrong shapes or value types and fails (or
    silently computes garbage) at the next step; this refuses it first: each parameter's state tensors
    must have the parameter's shape, every hyperparameter the type of the live one (and be finite).

    Args:
        optimizer: The run's optimizer, over the model the checkpoint's weights were loaded into.
        scheduler: Its learning-rate scheduler.
        payload: The checkpoint (:func:`load_checkpoint`), with ``optimizer`` and ``scheduler`` states.
        path: The checkpoint's path, for messages.

    Raises:
        CheckpointError: a state is missing or does not fit, naming the entry.
    """
    saved, sched = payload.get("optimizer"), payload.get("scheduler")
    if not isinstance(saved, Mapping) or not isinstance(sched, Mapping):
        raise CheckpointError(f"{path}: the optimizer or scheduler state is missing")
    live = optimizer.state_dict()
    groups = saved.get("param_groups")
    if not isinstance(groups, list) or len(groups) != len(live["param_groups"]):
        raise CheckpointError(f"{path}: the optimizer state has other parameter groups than this run's")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for i, (group, live_group) in enumerate(zip(groups, live["param_groups"], strict=True)):
        if not isinstance(group, Mapping) or len(group.get("params", ())) != len(live_group["params"]):
            raise CheckpointError(f"{path}: optimizer param_groups[{i}] holds another number of parameters")
        _like(
            {k: v for k, v in group.items() if k != "params"},
            {k: v for k, v in live_group.items() if k != "params"},
            f"optimizer param_groups[{i}]",
            path,
        )
    ids = [pid for group in groups for pid in group["params"]]
    state = saved.get("state")
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{path}: the optimizer state has no per-parameter state")
    for pid, entry in state.items():
        if pid not in ids or not isinstance(entry, Mapping):
            raise CheckpointError(f"{path}: optimizer state entry {pid!r:.40} names no parameter of the run")
        param = params[ids.index(pid)]
        for name, value in entry.items():
            if not isinstance(value, torch.Tensor | int | float) or isinstance(value, bool):
                raise CheckpointError(
                    f"{path}: optimizer state {pid}[{name!r}] is a {type(value).__name__}, not a tensor or number"
                )
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                raise CheckpointError(
                    f"{path}: optimizer state {pid}[{name!r}] has shape {tuple(value.shape)}, the parameter "
                    f"{tuple(param.shape)}; the optimizer state does not fit this run"
                )
    _like(sched, scheduler.state_dict(), "scheduler", path)
    try:
        optimizer.load_state_dict(dict(saved))
        scheduler.load_state_dict(dict(sched))
    except (KeyError, RuntimeError, ValueError, TypeError, IndexError) as e:
        raise CheckpointError(f"{path}: cannot restore the optimizer ({type(e).__name__}: {e})") from None


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


# -- the command line --------------------------------------------------------------------------------------------


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
