"""What every training entry point shares: building the model, the optimizer, and the metric log."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from searchgym.tokenization import load_tokenizer

from ..llm import LLMPolicy, tiny_causal_lm
from .checkpoint import CheckpointError, load_checkpoint
from .config import CommonConfig

__all__ = ["MetricLogger", "build_policy", "make_optimizer", "read_metrics"]

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
    """
    state = None
    if config.init is not None:
        payload = load_checkpoint(config.init)
        if "model" not in payload or "arch" not in payload:
            raise CheckpointError(f"{config.init} holds no model")
        arch, state = dict(payload["arch"]), payload["model"]
        if config.tokenizer is not None:
            arch["tokenizer"] = config.tokenizer
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
    else:
        from ..llm import _import_transformers

        tf = _import_transformers(f"Loading model {arch['name']!r}")
        model = tf.AutoModelForCausalLM.from_pretrained(arch["name"], dtype=_DTYPES[config.dtype])
    if state is not None:
        model.load_state_dict(state)
    model = model.to(device=config.device, dtype=_DTYPES[config.dtype])
    return LLMPolicy(model, tokenizer, **policy_kwargs), arch


def make_optimizer(
    model: Any, config: CommonConfig, total_updates: int | None = None
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters with a linear warm-up to ``config.lr``.

    After the warm-up the rate stays constant (``config.lr_schedule == "constant"``) or decays linearly to
    zero at ``total_updates`` (``"linear"``; needs ``total_updates``).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    warmup = config.warmup_steps
    decay = config.lr_schedule == "linear" and total_updates is not None

    def factor(update: int) -> float:
        if warmup and update < warmup:
            return (update + 1) / warmup
        if decay:
            assert total_updates is not None
            return max(0.0, (total_updates - update) / max(1, total_updates - warmup))
        return 1.0

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return optimizer, scheduler


class MetricLogger:
    """Writes one JSON line per step to ``RUN_DIR/metrics.jsonl`` (and TensorBoard scalars when available).

    Args:
        run_dir: The run folder.
        resume_step: When resuming, the checkpoint's step: lines written after it by the interrupted run are
            dropped, so the log continues from the saved step without duplicates. ``None`` starts a new log.
        tensorboard: Also write TensorBoard events if ``torch.utils.tensorboard`` can be imported.
    """

    def __init__(self, run_dir: str | Path, resume_step: int | None = None, tensorboard: bool = True) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        elif self.path.exists():
            kept = [
                line
                for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= resume_step
            ]
            self.path.write_text("".join(line + "\n" for line in kept))
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
        self._file.write(json.dumps({"step": step, **clean}) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in clean.items():
                if v is not None:
                    self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        """Flushes and closes the log."""
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file (or of ``RUN_DIR/metrics.jsonl``)."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
