"""What every training entry point shares: the run folder (and the record of what a run started from), the
model, the optimizer, and the metric log."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import warnings
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import torch

from searchgym.errors import CheckpointError, ConfigError, DataFormatError
from searchgym.integrity import disk_full_is_clear, file_sha256, remove_stale_temp_files
from searchgym.tokenization import load_tokenizer

from ..llm import LLMPolicy, tiny_causal_lm
from ..llm.model import causal_lm_from_config
from .checkpoint import load_checkpoint
from .checkpoint_checks import check_arch
from .config import CommonConfig

__all__ = [
    "CHECKPOINT",
    "RESUMABLE_OPTIONS",
    "RUN_FILES",
    "RUN_RECORD",
    "MetricLogger",
    "build_policy",
    "check_resume_config",
    "make_optimizer",
    "prepare_run_dir",
    "read_metrics",
    "resume_init",
    "write_run_record",
]

_Config = TypeVar("_Config", bound=CommonConfig)

CHECKPOINT = "checkpoint.pt"
"""A run's checkpoint, in its folder."""

EVAL_EPISODES = "eval_episodes.jsonl"
"""Per-question outcomes of a GRPO run's evaluations, one JSON line each (``GRPOTrainer.evaluate``); a resumed
run appends, so the last line of a (step, question) pair is the one that counts."""

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

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_policy(config: CommonConfig, **policy_kwargs: Any) -> tuple[LLMPolicy, dict[str, Any]]:
    """The policy to train: ``config.init``'s checkpoint, else ``config.model``, else a fresh tiny model.

    Args:
        config: The run's configuration (model, tokenizer, device, dtype, init).
        **policy_kwargs: Passed to :class:`LLMPolicy` (temperature, max_turn_tokens, seed).

    Returns:
        ``(policy, arch)``: ``arch`` describes the model so a checkpoint can rebuild it.

    Raises:
        CheckpointError: ``config.init`` is unreadable or holds no model.
        ConfigError: ``config.device`` is a CUDA device and this torch cannot use one.
    """
    # Checked first, before a multi-GB model is downloaded: torch's own error is a raw traceback.
    if torch.device(config.device).type == "cuda" and not torch.cuda.is_available():
        if torch.version.cuda is None:
            raise ConfigError(
                f"--device {config.device}: this torch ({torch.__version__}) is a CPU-only build. Install a "
                "CUDA build, e.g. `pip install torch --index-url https://download.pytorch.org/whl/cu124` "
                "(pick the index of your CUDA version on pytorch.org); the Makefile's .venv pins the CPU "
                "build through constraints.txt, so install it outside `make` (or edit that pin)"
            )
        raise ConfigError(
            f"--device {config.device}: torch {torch.__version__} is built for CUDA {torch.version.cuda} "
            "but sees no GPU (check nvidia-smi, the driver and CUDA_VISIBLE_DEVICES), or use --device cpu"
        )
    state = None
    if config.init is not None:
        payload = load_checkpoint(config.init)
        if "model" not in payload or "arch" not in payload:
            raise CheckpointError(f"{config.init} holds no model")
        arch, state = dict(payload["arch"]), payload["model"]
        if config.tokenizer is not None:
            arch["tokenizer"] = config.tokenizer
        check_arch(arch, state, config.init)  # again: --tokenizer may have replaced the saved one
    elif config.model is not None and config.model.startswith(CONFIG_PREFIX):
        arch = {
            "kind": "config",
            "config": read_model_config(config.model[len(CONFIG_PREFIX) :]),
            "tokenizer": config.tokenizer,
        }
    elif config.model is not None:
        arch = {"kind": "pretrained", "name": config.model, "tokenizer": config.tokenizer or config.model}
    else:
        arch = {
            "kind": "tiny",
            "layers": config.tiny_layers,
            "hidden": config.tiny_hidden,
            "tokenizer": config.tokenizer,
        }
    tokenizer = load_tokenizer(arch["tokenizer"])
    if arch["kind"] == "tiny":
        model = tiny_causal_lm(
            tokenizer.vocab_size,
            layers=int(arch["layers"]),
            hidden=int(arch["hidden"]),
            max_positions=max(4096, config.max_context_tokens),
            seed=config.seed,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    elif arch["kind"] == "config":
        model = causal_lm_from_config(arch["config"], tokenizer, config.seed)
    else:
        from ..llm.model import import_transformers

        tf = import_transformers(f"Loading model {arch['name']!r}")
        model = tf.AutoModelForCausalLM.from_pretrained(arch["name"], dtype=_DTYPES[config.dtype])
    if state is not None:
        try:
            model.load_state_dict(state)
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(
                f"{config.init}: the model state does not fit its architecture ({e})"
            ) from None
    model = model.to(device=config.device, dtype=_DTYPES[config.dtype])
    return LLMPolicy(model, tokenizer, **policy_kwargs), arch


CONFIG_PREFIX = "config:"
"""``--model config:SPEC``: a model of that architecture with random weights (see :func:`read_model_config`)."""


def read_model_config(spec: str) -> dict[str, Any]:
    """A ``transformers`` model config as a plain dict: a ``config.json`` file, a folder holding one, or
    the name of one shipped with searchgym (``qwen2-0.5b``: Qwen2-0.5B's architecture).

    Raises:
        ConfigError: nothing readable there, or a config without ``model_type``.
    """
    assets = resources.files("searchgym").joinpath("assets")
    path: Any = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists() and assets.joinpath(f"model-{spec}.json").is_file():
        path = assets.joinpath(f"model-{spec}.json")
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        shipped = sorted(
            p.name.removeprefix("model-").removesuffix(".json")
            for p in assets.iterdir()
            if p.name.startswith("model-")
        )
        raise ConfigError(
            f"--model {CONFIG_PREFIX}{spec}: cannot read a model config there ({type(e).__name__}: {e}); give a "
            f"config.json, a folder holding one, or one of {shipped}"
        ) from None
    if not isinstance(values, dict) or not isinstance(values.get("model_type"), str):
        raise ConfigError(
            f"--model {CONFIG_PREFIX}{spec}: {path} has no 'model_type' (not a transformers config)"
        )
    return values


def make_optimizer(
    model: Any, config: CommonConfig, total_updates: int | None = None
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (``betas`` and ``adam_eps`` from the config when it has them) over the trainable parameters with a linear warm-up to ``config.lr`` (from
    ``config.warmup_start_lr`` when set, else from ``lr / warmup_steps``).

    After the warm-up the rate stays constant (``config.lr_schedule == "constant"``) or decays linearly to
    zero at ``total_updates`` (``"linear"``; needs ``total_updates``).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    betas = getattr(config, "betas", (0.9, 0.999))  # GRPO's --adam-betas; torch's defaults elsewhere
    eps = getattr(config, "adam_eps", 1e-8)
    optimizer = torch.optim.AdamW(
        params, lr=config.lr, betas=betas, eps=eps, weight_decay=config.weight_decay
    )
    warmup = config.warmup_steps
    decay = config.lr_schedule == "linear" and total_updates is not None

    start = getattr(config, "warmup_start_lr", None)

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


def prepare_run_dir(run_dir: str | Path, resume: bool, overwrite: bool = False) -> Path:
    """Makes ``run_dir`` ready for a run, never silently replacing an earlier one.

    Temporary files that a save killed mid-write left behind are removed first. A new run (``resume``
    false) in a folder that already holds a run (any of :data:`RUN_FILES`) is refused unless ``overwrite``,
    which deletes those files. Other files in the folder are left alone. Calling it twice is harmless.

    Args:
        run_dir: The run folder (created if missing).
        resume: The run continues the folder's checkpoint.
        overwrite: Replace the run the folder holds.

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
            raise ConfigError(
                f"run_dir {str(root)!r} already holds a run ({', '.join(existing)}); pass --resume to continue "
                "it, --overwrite to replace it, or choose another --run-dir"
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


def write_run_record(run_dir: Path, config: CommonConfig) -> None:
    """Records what the run started from (``RUN_DIR/run.json``): the init checkpoint and its hash, so a
    resume rebuilds the same frozen reference."""
    record: dict[str, Any] = {"init": None, "init_sha256": None, "model": config.model}
    if config.init is not None:
        record |= {"init": str(Path(config.init).resolve()), "init_sha256": _init_digest(config.init)}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RUN_RECORD).write_text(json.dumps(record, indent=1) + "\n")


def resume_init(config: _Config) -> _Config:
    """On ``--resume``: the config with the init checkpoint the run recorded (the reference's source).

    Raises:
        CheckpointError: the recorded init is gone or changed, or ``--init`` names another file.
    """
    path = Path(config.run_dir) / RUN_RECORD
    if not path.is_file():
        if config.init is None and (Path(config.run_dir) / CHECKPOINT).is_file():
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
        if config.init is not None:
            raise CheckpointError(f"{config.run_dir} was started without --init; resume it without --init")
        return config
    given = config.init if config.init is not None else init
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
    return dataclasses.replace(config, init=given)


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
        saved_config: The checkpoint's ``config`` (``dataclasses.asdict`` of the run's config).
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


def _read_metric_records(path: Path, repair: bool) -> list[dict[str, Any]]:
    """Parses ``metrics.jsonl``: a torn last line (a kill or a full disk mid-write) is dropped with a warning;
    a bad line anywhere else is an error."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataFormatError(str(path), None, f"cannot read the metrics log ({e.strerror or e})") from None
    lines = raw.split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    records: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
            if not isinstance(record, dict) or isinstance(record.get("step"), bool):
                raise ValueError("not a metrics record")
            if not isinstance(record.get("step", 0), int):
                raise ValueError("'step' is not an integer")
        except (UnicodeDecodeError, ValueError) as e:
            if i == last:
                action = "dropping it" if repair else "ignoring it"
                warnings.warn(
                    f"{path}:{i + 1}: torn last line in the metrics log ({e}); {action}", stacklevel=3
                )
                break
            raise DataFormatError(
                str(path), i + 1, f"corrupt metrics record ({e}); only a torn last line can be repaired"
            ) from None
        records.append(record)
    return records


class MetricLogger:
    """Writes one JSON line per step to ``RUN_DIR/metrics.jsonl`` (and TensorBoard scalars when available).

    Args:
        run_dir: The run folder.
        resume_step: When resuming, the checkpoint's step: lines written after it by the interrupted run are
            dropped, so the log continues from the saved step without duplicates; a torn last line is
            dropped with a warning. ``None`` starts a new log (see :func:`prepare_run_dir`, which refuses to
            replace an existing run's log unasked).
        tensorboard: Also write TensorBoard events if ``torch.utils.tensorboard`` can be imported.

    Raises:
        DataFormatError: resuming, and a line other than the last one is corrupt.
    """

    def __init__(self, run_dir: str | Path, resume_step: int | None = None, tensorboard: bool = True) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        elif self.path.exists():
            kept = [
                r for r in _read_metric_records(self.path, repair=True) if r.get("step", 0) <= resume_step
            ]
            # Rewritten through a temporary file: a kill during the rewrite must not lose the log.
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.rewrite.tmp")
            with tmp.open("w", encoding="utf-8") as f:
                f.write("".join(json.dumps(r) + "\n" for r in kept))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        self._file = self.path.open("a", encoding="utf-8")
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # optional: tensorboard is not a dependency
                pass
            else:
                self._tb = SummaryWriter(str(self.path.parent / "tb"), purge_step=resume_step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Records the step's metrics (non-finite values are written as ``null``)."""
        clean = {k: (float(v) if math.isfinite(float(v)) else None) for k, v in metrics.items()}
        line = json.dumps({"step": step, **clean}) + "\n"
        kept = "the steps logged before are intact (a torn last line is dropped on --resume)"
        with disk_full_is_clear(self.path, len(line.encode()), kept):
            self._file.write(line)
            self._file.flush()
        if self._tb is not None:
            for k, v in clean.items():
                if v is not None:
                    self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        """Flushes and closes the log."""
        with disk_full_is_clear(self.path, kept="the steps logged before are intact"):
            self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file (or of ``RUN_DIR/metrics.jsonl``).

    A torn last line (a run being written, or killed mid-write) is skipped with a warning.

    Raises:
        DataFormatError: the file is unreadable, or a line other than the last is corrupt.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    return _read_metric_records(path, repair=False)
