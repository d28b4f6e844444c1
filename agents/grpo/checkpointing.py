"""A GRPO run's checkpoint: what it holds (model, optimizer, scheduler, RNG states, step, config, ledger), and
how a resumed run takes it back after checking that its options may change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from searchgym.errors import CheckpointError
from searchgym.options import flat_values

from ..training.checkpoint import load_checkpoint, save_checkpoint
from ..training.checkpoint_checks import stored_config
from ..training.run import check_resume_config
from ..training.state import get_rng_state, load_training_state, set_rng_state
from .config import GRPOConfig
from .ledger import Ledger
from .mismatch import Sampler

__all__ = ["restore_grpo_checkpoint", "save_grpo_checkpoint"]


def save_grpo_checkpoint(
    path: Path,
    *,
    step: int,
    model: Any,
    arch: Any,
    optimizer: Any,
    scheduler: Any,
    config: GRPOConfig,
    ledger: Ledger | None,
    sampler: dict[str, Any] | None = None,
) -> Path:
    """Writes the checkpoint atomically, with the RNG states of this moment."""
    return save_checkpoint(
        path,
        {
            "kind": "grpo",
            "step": step,
            "model": model.state_dict(),
            "arch": arch,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": get_rng_state(),
            "config": config.to_dict(),
            **({"ledger": ledger.state_dict()} if ledger is not None else {}),
            **({"sampler": sampler} if sampler is not None else {}),
        },
    )


def restore_grpo_checkpoint(
    path: Path,
    config: GRPOConfig,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    ledger: Ledger | None,
    sampler: Sampler | None = None,
) -> int:
    """Loads a GRPO run's checkpoint into the given objects, sets the RNG states, returns its step.

    Raises:
        CheckpointError: not a GRPO checkpoint, or it cannot be loaded into these objects.
        ConfigError: the run's options differ from the checkpoint's in one a resume may not change.
    """
    payload = load_checkpoint(path, map_location=config.run.device)
    if payload.get("kind") != "grpo":
        raise CheckpointError(
            f"{path} is a {payload.get('kind')!r} checkpoint, not a GRPO run's; use --init to start from it"
        )
    # The init checkpoint was already checked by hash (resume_init); how its path is spelled may differ.
    saved = stored_config(payload["config"], "grpo", path)
    check_resume_config(
        {k: v for k, v in flat_values(saved).items() if k != "init"},
        {k: v for k, v in flat_values(config).items() if k != "init"},
    )
    try:
        model.load_state_dict(payload["model"])
        load_training_state(optimizer, scheduler, payload, path)
        set_rng_state(payload["rng"])
        if ledger is not None and "ledger" in payload:
            ledger.load_state_dict(payload["ledger"])
        if sampler is not None:  # a stale sampler's weight history (a run saved before the dial: none)
            sampler.load_state(payload.get("sampler", {}))
        return int(payload["step"])
    except (KeyError, RuntimeError, ValueError, TypeError, IndexError) as e:
        raise CheckpointError(f"cannot resume from {path}: {e}") from None
