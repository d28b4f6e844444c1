"""Resuming exactly: the optimizer's and scheduler's states checked against the live ones, and the RNG
states as plain data (so that a checkpoint loads with ``torch.load(weights_only=True)``)."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from searchgym.errors import CheckpointError

__all__ = ["get_rng_state", "load_training_state", "plain_rng_state", "set_rng_state"]


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


def plain_rng_state(state: Mapping[str, Any]) -> dict[str, Any]:
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
    return plain_rng_state(state)


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
