"""What a checkpoint may describe, checked before anything is built from it.

A checkpoint names the model to build (``arch``) and the run's config. :func:`check_config` holds every
config field to the type its dataclass declares and to the dataclass's own range checks, with context sizes
capped at :data:`MAX_CONTEXT_TOKENS`; :func:`check_arch` bounds the architecture and compares its parameter
count with the elements the file actually stores, so a 1 KB file cannot make the loader allocate gigabytes.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import torch

from searchgym.envs.spec import MAX_CONTEXT_TOKENS as ENV_MAX_CONTEXT_TOKENS
from searchgym.errors import CheckpointError
from searchgym.options import flat_options, from_flat_value, is_section, option_name, section_type

__all__ = [
    "MAX_CONTEXT_TOKENS",
    "MAX_LAYERS",
    "check_arch",
    "check_config",
    "check_token_ids",
    "iter_tensors",
    "storage_elements",
    "stored_config",
]

MAX_CONTEXT_TOKENS = ENV_MAX_CONTEXT_TOKENS
"""The largest ``max_context_tokens`` / ``max_turn_tokens`` a checkpoint's config may hold: the env's own
bound (it allocates its observation arrays at this size)."""

MAX_LAYERS = 1024
"""The most transformer layers a checkpoint's architecture may describe (the largest open models have
~130)."""


def storage_elements(tensor: torch.Tensor) -> int:
    """Elements the tensor's storage really holds (a crafted view may claim far more)."""
    return int(tensor.untyped_storage().nbytes()) // max(1, tensor.element_size())


def iter_tensors(value: Any, where: str) -> typing.Iterator[tuple[str, torch.Tensor]]:
    """Every tensor inside nested mappings and sequences, with its path (``where[key][0]``)."""
    if isinstance(value, torch.Tensor):
        yield where, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from iter_tensors(v, f"{where}[{k!r}]")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from iter_tensors(v, f"{where}[{i}]")


def _config_class(kind: Any) -> type[Any]:
    """The dataclass a checkpoint of ``kind`` saved its config from (imported here: config.py is torch-free)."""
    from ..grpo.config import GRPOConfig
    from .config import SFTConfig, TrainConfig

    return (
        {"grpo": GRPOConfig, "sft": SFTConfig}.get(kind, TrainConfig)
        if isinstance(kind, str)
        else TrainConfig
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


def _flat(config: Mapping[str, Any], cls: type[Any], path: str | Path) -> dict[str, Any]:
    """A stored config as one value per option name, keys ``cls`` does not declare (an option of another
    version) left out: the one place the stored forms meet.

    A config without ``"format"`` is the flat form, whose keys are option names (``"none"`` for no LLDS
    gate). Format 2 holds the sections env, optim, eval and llds as mappings and every other option flat
    (``"model"`` is the model's name); format 3
    (:data:`~searchgym.agents.training.config.CONFIG_FORMAT`) holds every section as a mapping."""
    from .config import CONFIG_FORMAT

    options = flat_options(cls)
    if "format" not in config:
        return {k: from_flat_value(options[k][2], v) for k, v in config.items() if k in options}
    form = config["format"]
    if form not in (2, CONFIG_FORMAT):
        raise CheckpointError(
            f"{path}: config format {form!r:.20} is not {CONFIG_FORMAT} (a newer searchgym?)"
        )
    sections = {f.name: section_type(f) for f in dataclasses.fields(cls) if is_section(f)}
    flat: dict[str, Any] = {}
    for key, values in config.items():
        if key in sections and (form == CONFIG_FORMAT or isinstance(values, Mapping)):
            if not isinstance(values, Mapping):
                raise CheckpointError(
                    f"{path}: config section {key!r} is a {type(values).__name__}, not a mapping"
                )
            for g in dataclasses.fields(sections[key]):
                if g.name in values:
                    flat[option_name(g)] = values[g.name]
        elif key in options:
            flat[key] = from_flat_value(options[key][2], values)
    return flat


def stored_config(config: Any, kind: Any, path: str | Path) -> Any:
    """A checkpoint's saved config, checked, as its dataclass (``GRPOConfig`` for ``"grpo"``, ``SFTConfig``
    for ``"sft"``, else ``TrainConfig``), from any stored form (:func:`_flat`).

    Each option must have the type its field declares (found from the type hints, so fields added later are
    covered), floats must be finite and integers fit in 64 bits; then the dataclass is built from them, so
    its own range checks run. Context and turn sizes may not exceed :data:`MAX_CONTEXT_TOKENS`.

    Raises:
        CheckpointError: naming the first bad option, its value and what was expected.
    """
    if not isinstance(config, Mapping):
        raise CheckpointError(f"{path}: field 'config' is a {type(config).__name__}, not a mapping")
    cls = _config_class(kind)
    options = flat_options(cls)
    values = _flat(config, cls, path)
    for name, value in values.items():
        hint = options[name][2]
        if not _fits(value, hint):
            raise CheckpointError(
                f"{path}: config field {name!r} is {value!r:.80} ({type(value).__name__}), "
                f"expected {_describe(hint)}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise CheckpointError(f"{path}: config field {name!r} is {value!r}, not a finite number")
        if isinstance(value, int) and not -(1 << 63) <= value < 1 << 63:
            raise CheckpointError(f"{path}: config field {name!r} does not fit in 64 bits")
    for name in ("max_context_tokens", "max_turn_tokens"):
        value = values.get(name)
        if isinstance(value, int) and value > MAX_CONTEXT_TOKENS:
            raise CheckpointError(
                f"{path}: config field {name!r} is {value}, more than the {MAX_CONTEXT_TOKENS} tokens searchgym "
                "allows"
            )
    try:
        return cls(**values)
    except (ValueError, TypeError, ArithmeticError) as e:  # ConfigError is a ValueError
        raise CheckpointError(f"{path}: the saved config is not valid: {e}") from None


def check_config(config: Any, kind: Any, path: str | Path) -> dict[str, Any]:
    """Checks a checkpoint's saved config (:func:`stored_config`) before anything reads it; returns it in
    today's stored form (sections as mappings, :meth:`TrainConfig.to_dict`), whichever form it had.

    Raises:
        CheckpointError: naming the first bad field, its value and what was expected.
    """
    return dict(stored_config(config, kind, path).to_dict())


def _stored_elements(state: Any) -> int:
    """Elements the model state's storages hold, each storage counted once (tied weights share one)."""
    seen: set[tuple[str, int]] = set()
    total = 0
    for _, tensor in iter_tensors(state, "model"):
        storage = tensor.untyped_storage()
        key = (str(storage.device), storage.data_ptr())
        if key not in seen:
            seen.add(key)
            total += storage_elements(tensor)
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
    from ..llm.model import import_transformers

    tf = import_transformers("Checking a checkpoint's model config")
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


#: Names (suffixes) of the token-embedding weight in the model families searchgym builds or loads.
_EMBEDDING_NAMES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "embed_in.weight")


def _vocabulary_rows(state: Any) -> int | None:
    """The rows of the model's token embedding (the ids it can embed), ``None`` when it is not found."""
    if isinstance(state, Mapping):
        for name, tensor in state.items():
            named = isinstance(name, str) and name.endswith(_EMBEDDING_NAMES)
            if named and isinstance(tensor, torch.Tensor) and tensor.dim() == 2:
                return int(tensor.shape[0])
    return None


def check_token_ids(payload: Mapping[str, Any], path: str | Path) -> None:
    """Every token id a checkpoint carries besides its weights — the GRPO ledger's transcripts — within
    the model's vocabulary (``0 <= id <`` the embedding's rows), and every source mark a :class:`Source`.

    Raises:
        CheckpointError: naming the entry and the id (a crafted or re-sealed file; the embedding lookup of a
            training step would otherwise fail with an ``IndexError``).
    """
    from searchgym.protocol import Source

    ledger = payload.get("ledger")
    if not isinstance(ledger, Mapping):
        return
    vocabulary = _vocabulary_rows(payload.get("model"))
    marks = len(Source) - 1
    for field, high in (("tokens", vocabulary), ("sources", marks + 1)):
        entries = ledger.get(field)
        if not isinstance(entries, list | tuple):
            continue
        for i, tensor in enumerate(entries):
            if not isinstance(tensor, torch.Tensor) or tensor.is_floating_point() or tensor.is_complex():
                raise CheckpointError(f"{path}: ledger {field}[{i}] is not a tensor of integer ids")
            if tensor.numel() == 0:
                continue
            low_id, high_id = int(tensor.min()), int(tensor.max())
            bad = low_id if low_id < 0 else high_id if high is not None and high_id >= high else None
            if bad is None:
                continue
            if field == "tokens":
                raise CheckpointError(
                    f"{path}: ledger tokens[{i}] holds token id {bad} outside the vocabulary "
                    f"[0, {vocabulary}) of the model it was saved with; the file is damaged or crafted"
                )
            raise CheckpointError(
                f"{path}: ledger sources[{i}] holds source mark {bad}, not one of 0..{marks}; the file is "
                "damaged or crafted"
            )
