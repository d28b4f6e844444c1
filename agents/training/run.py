"""A run's folder: what it holds, preparing it (new, resumed or overwritten), the record of what the run
started from and which options may change on ``--resume``, and the optimizer every trainer builds."""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from searchgym.errors import CheckpointError, ConfigError
from searchgym.failures import episode_stage
from searchgym.integrity import file_sha256, remove_stale_temp_files

from .config import OptimConfig, TrainConfig

__all__ = [
    "CHECKPOINT",
    "EVAL_EPISODES",
    "RESUMABLE_OPTIONS",
    "RUN_FILES",
    "RUN_RECORD",
    "append_eval_episodes",
    "check_resume_config",
    "make_optimizer",
    "prepare_run_dir",
    "resume_init",
    "write_run_record",
]

_Config = TypeVar("_Config", bound=TrainConfig)

CHECKPOINT = "checkpoint.pt"
"""A run's checkpoint, in its folder."""

EVAL_EPISODES = "eval_episodes.jsonl"
"""Per-question outcomes of a run's greedy evaluations, one JSON line each (:func:`append_eval_episodes`); a
resumed run appends, so the last line of a (step, question) pair is the one that counts."""


def append_eval_episodes(run_dir: str | Path, step: int, episodes: list[dict[str, Any]], reward: str) -> None:
    """Appends one evaluation's per-question outcomes to ``RUN_DIR/eval_episodes.jsonl``: step, question id,
    EM, F1, the run's ``reward``, searches, whether the episode answered, the question's kind and the stage
    it failed at (:func:`searchgym.failures.episode_stage`: ``correct``, ``no_answer``, ``not_retrieved``,
    ``misread``); two evaluations can then be compared question by question, and a fall placed by stage."""
    with open(Path(run_dir) / EVAL_EPISODES, "a", encoding="utf-8") as f:
        for info in episodes:
            record = {"step": step, "question_id": info["question_id"], "em": info["em"], "f1": info["f1"]}
            record |= {"reward": info[reward], "searches": info["searches"]}
            record |= {"answered": info["answer"] is not None, "kind": info.get("question_kind")}
            f.write(json.dumps(record | {"stage": episode_stage(info)}) + "\n")


RUN_FILES = (CHECKPOINT, "metrics.jsonl", "tb", EVAL_EPISODES)
"""What a training run writes into its folder: a folder holding any of them holds a run."""

RESUMABLE_OPTIONS = frozenset(
    {
        "run_dir",
        "resume",
        "overwrite",
        "steps",
        "device",
        "threads",
        "progress",
        "tensorboard",
        "report_to",
        "micro_batch_size",
        "retriever",
        "retriever_patience",
        "eval_split",
        "eval_questions",
        "eval_batch",
        "eval_every",
        "save_every",
        "probe_every",
        "log_gns",
    }
)
"""Options that may differ on ``--resume``: they are applied (and reported). Every other option is part of
what the run is (model, data, optimisation, algorithm) and must stay as saved."""


def make_optimizer(
    model: Any, config: OptimConfig, total_updates: int | None = None
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters with a linear warm-up to ``config.lr`` (from
    ``config.warmup_start_lr`` when set, else from ``lr / warmup_steps``).

    After the warm-up the rate stays constant (``config.lr_schedule == "constant"``) or decays linearly to
    zero at ``total_updates`` (``"linear"``; needs ``total_updates``).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=config.lr, betas=config.betas, eps=config.adam_eps, weight_decay=config.weight_decay
    )
    warmup = config.warmup_steps
    decay = config.lr_schedule == "linear" and total_updates is not None
    start = config.warmup_start_lr

    def factor(update: int) -> float:
        if warmup and update < warmup:
            if start is not None:  # a straight ramp from start (first update) to lr (the warm-up's last)
                return start / config.lr + (1 - start / config.lr) * update / (warmup - 1)
            return (update + 1) / warmup
        if decay:
            assert total_updates is not None
            return max(0.0, (total_updates - update) / max(1, total_updates - warmup))
        return 1.0

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return optimizer, scheduler


def prepare_run_dir(
    run_dir: str | Path, resume: bool, overwrite: bool = False, resumable: bool = True
) -> Path:
    """Makes ``run_dir`` ready for a run, never silently replacing an earlier one.

    Temporary files that a save killed mid-write left behind are removed first. A new run (``resume``
    false) in a folder that already holds a run (any of :data:`RUN_FILES`) is refused unless ``overwrite``,
    which deletes those files. Other files in the folder are left alone. Calling it twice is harmless.

    Args:
        run_dir: The run folder (created if missing).
        resume: The run continues the folder's checkpoint.
        overwrite: Replace the run the folder holds.
        resumable: Whether the trainer can continue a run (``--resume``); the refusal suggests it only then.

    Returns:
        The folder.

    Raises:
        ConfigError: both ``resume`` and ``overwrite``; ``run_dir`` is a file; or it holds a run and neither
            ``resume`` nor ``overwrite`` is set.
    """
    root = Path(run_dir)
    if resume and overwrite:
        raise ConfigError("--resume continues the run in run_dir and --overwrite replaces it: choose one")
    if root.exists() and not root.is_dir():
        raise ConfigError(f"run_dir {str(root)!r} is a file, not a folder")
    remove_stale_temp_files(root)
    if not resume:
        existing = [name for name in RUN_FILES if (root / name).exists()]
        if existing and not overwrite:
            choices = (
                "pass --resume to continue it, --overwrite to replace it"
                if resumable
                else "this trainer saves once, at the end, so it cannot continue one: pass --overwrite to train it again"
            )
            raise ConfigError(
                f"run_dir {str(root)!r} already holds a run ({', '.join(existing)}); {choices}, or choose another --run-dir"
            )
        for name in existing:
            path = root / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    root.mkdir(parents=True, exist_ok=True)
    return root


RUN_RECORD = "run.json"
"""What a run started from (its init checkpoint and that file's SHA-256), written beside its checkpoint."""


def write_run_record(run_dir: Path, config: TrainConfig) -> None:
    """Records what the run started from (``RUN_DIR/run.json``): the init checkpoint and its hash, so a
    resume rebuilds the same frozen reference."""
    record: dict[str, Any] = {"init": None, "init_sha256": None, "model": config.model.name}
    if config.model.init is not None:
        record |= {
            "init": str(Path(config.model.init).resolve()),
            "init_sha256": _init_digest(config.model.init),
        }
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RUN_RECORD).write_text(json.dumps(record, indent=1) + "\n")


def resume_init(config: _Config) -> _Config:
    """On ``--resume``: the config with the init checkpoint the run recorded (the reference's source).

    Raises:
        CheckpointError: the recorded init is gone or changed, or ``--init`` names another file.
    """
    path = Path(config.run.run_dir) / RUN_RECORD
    if not path.is_file():
        if config.model.init is None and (Path(config.run.run_dir) / CHECKPOINT).is_file():
            raise CheckpointError(
                f"{path} is missing, so the init checkpoint of this run (its reference model) is unknown; "
                "pass --init with the checkpoint the run started from"
            )
        return config
    try:
        record = json.loads(path.read_text())
        init, digest = record["init"], record["init_sha256"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"cannot read the run record {path}: {e}") from None
    if init is None:
        if config.model.init is not None:
            raise CheckpointError(
                f"{config.run.run_dir} was started without --init; resume it without --init"
            )
        return config
    given = config.model.init if config.model.init is not None else init
    if not Path(given).is_file():
        raise CheckpointError(
            f"the run was started from {init}, which is gone: the reference model cannot be rebuilt. "
            "Restore that file, or pass --init with an identical copy"
        )
    if _init_digest(given) != digest:
        raise CheckpointError(
            f"{given} differs from the init checkpoint this run started from ({init}, sha256 {digest[:12]}…): "
            "the reference model would change; pass --init with the original file"
        )
    return dataclasses.replace(config, model=dataclasses.replace(config.model, init=given))


def _init_digest(path: str | Path) -> str:
    """The SHA-256 of an init checkpoint, read now (never a digest remembered from an earlier read)."""
    return file_sha256(path, remember=False)


def check_resume_config(saved_config: Mapping[str, Any], new_config: Mapping[str, Any]) -> dict[str, Any]:
    """Compares the options of a resumed run with those its checkpoint was saved with.

    Options in :data:`RESUMABLE_OPTIONS` may change: the change is applied by the caller (the new config is
    the one in use and the one the next checkpoint records) and reported here as a ``UserWarning``. Any
    other change is refused. Options present on one side only (a field added or removed between versions)
    are not compared.

    Args:
        saved_config: The checkpoint's config, one value per option name
            (:func:`searchgym.options.flat_values`).
        new_config: The config of the resuming run, in the same form.

    Returns:
        The applied changes, ``{option: (saved value, new value)}``.

    Raises:
        ConfigError: options that cannot change on resume differ; the message lists each with both values.
    """
    changed = {
        k: (saved_config[k], new_config[k])
        for k in sorted(set(saved_config) & set(new_config))
        if saved_config[k] != new_config[k]
    }
    frozen = {k: v for k, v in changed.items() if k not in RESUMABLE_OPTIONS}
    if frozen:
        listed = "; ".join(f"--{k.replace('_', '-')}: saved {a!r}, now {b!r}" for k, (a, b) in frozen.items())
        raise ConfigError(
            f"these options cannot change on --resume: {listed}. Resume with the saved values, or start a new "
            "run from this one's weights with --init RUN_DIR/checkpoint.pt. Options that may change: "
            f"{', '.join(sorted(RESUMABLE_OPTIONS))}"
        )
    applied = {k: v for k, v in changed.items() if k not in ("resume", "overwrite")}
    if applied:
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in applied.items())
        warnings.warn(f"resuming with changed options (applied): {listed}", UserWarning, stacklevel=2)
    return applied
