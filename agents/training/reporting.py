"""Where a run's figures go besides its own log (``metrics.jsonl``, SB3's ``progress.csv``): TensorBoard events,
Weights & Biases, or nowhere (``--report-to tensorboard|wandb|none``).

Every trainer hands each step's figures to the reporters :func:`open_reporters` builds: ``train grpo``,
``sft`` and ``trl`` through :class:`~searchgym.agents.training.metrics.MetricLogger`, ``train sb3`` through a
writer of SB3's logger. Torch-free at import; TensorBoard and wandb are imported when a reporter opens.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import secrets
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Protocol, TypeAlias, get_args

from searchgym.errors import ConfigError, MissingDependencyError

__all__ = [
    "REPORT_TO",
    "REPORT_TO_HELP",
    "ReportTo",
    "Reporter",
    "check_report_to",
    "open_reporters",
    "report_target",
]

ReportTo: TypeAlias = Literal["tensorboard", "wandb", "none"]
REPORT_TO: tuple[str, ...] = get_args(ReportTo)
"""``--report-to`` values."""

REPORT_TO_HELP = (
    "where the figures go besides the run's own log: tensorboard (events in RUN_DIR/tb, when tensorboard is "
    "installed), wandb (Weights & Biases, extra searchgym[wandb]; project $WANDB_PROJECT, default searchgym; "
    "WANDB_MODE=offline keeps the run in RUN_DIR/wandb for a later `wandb sync`), or none"
)
"""The help of every trainer's ``--report-to``."""

WANDB_RUN_ID = "wandb_run_id"
"""File in the run folder naming its W&B run, so a resumed run goes on logging to the same one."""


class Reporter(Protocol):
    """Receives each logged step's figures (slash-named scalars)."""

    def log(self, step: int, metrics: Mapping[str, float | None]) -> None: ...

    def close(self) -> None: ...


def check_report_to(report_to: str) -> None:
    """A ``--report-to`` value the run can honour, checked before the run writes anything.

    Raises:
        ConfigError: not one of :data:`REPORT_TO`.
        MissingDependencyError: ``wandb`` without the ``wandb`` package installed.
    """
    if report_to not in REPORT_TO:
        raise ConfigError(f"unknown report_to {report_to!r}; choose one of {list(REPORT_TO)}")
    if report_to == "wandb" and not _wandb_installed():
        raise MissingDependencyError("wandb", "wandb", "--report-to wandb")


def _wandb_installed() -> bool:
    if sys.modules.get("wandb") is not None:  # imported already (or put there by a test)
        return True
    return importlib.util.find_spec("wandb") is not None


def report_target(report_to: str, tensorboard: bool = True) -> str:
    """The reporter a run uses: ``--no-tensorboard`` (``tensorboard`` false) turns the default TensorBoard
    reporter off, as ``--report-to none`` does; it leaves ``wandb`` as it is."""
    return "none" if report_to == "tensorboard" and not tensorboard else report_to


class _TensorBoard:
    def __init__(self, writer: Any) -> None:
        self._writer = writer

    def log(self, step: int, metrics: Mapping[str, float | None]) -> None:
        for key, value in metrics.items():
            if value is not None:
                self._writer.add_scalar(key, value, step)

    def close(self) -> None:
        self._writer.close()


class _Wandb:
    def __init__(self, run: Any) -> None:
        self._run = run

    def log(self, step: int, metrics: Mapping[str, float | None]) -> None:
        self._run.log({k: v for k, v in metrics.items() if v is not None}, step=step)

    def close(self) -> None:
        self._run.finish()


def _plain_config(config: Any) -> dict[str, Any]:
    """A run config as JSON data for W&B's run table, one value per option name as the CLI spells it (a
    value JSON cannot hold becomes its text)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        from searchgym.options import flat_values

        config = flat_values(config)
    return dict(json.loads(json.dumps(dict(config or {}), default=str)))


def _open_wandb(run_dir: Path, config: Any, resume: bool) -> _Wandb:
    import wandb

    id_file = run_dir / WANDB_RUN_ID
    run_id = id_file.read_text(encoding="utf-8").strip() if resume and id_file.is_file() else ""
    if not run_id:
        run_id = secrets.token_hex(4)
        id_file.write_text(run_id + "\n", encoding="utf-8")
    run = wandb.init(
        project=os.environ.get("WANDB_PROJECT") or "searchgym",
        name=run_dir.resolve().name,
        id=run_id,
        resume="allow",
        dir=str(run_dir),
        config=_plain_config(config),
    )
    return _Wandb(run)


def open_reporters(
    report_to: str, run_dir: str | Path, *, resume_step: int | None = None, config: Any = None
) -> list[Reporter]:
    """The reporters of ``report_to`` for the run in ``run_dir`` (which exists).

    Args:
        report_to: One of :data:`REPORT_TO` (see :func:`report_target` for ``--no-tensorboard``).
        run_dir: The run folder: TensorBoard writes ``tb/`` there, W&B ``wandb/`` and ``wandb_run_id``.
        resume_step: When the run resumes, its checkpoint's step: TensorBoard drops the events logged after
            it, and W&B continues the run ``wandb_run_id`` names.
        config: The run's config (a dataclass or a mapping), W&B's run table.

    Raises:
        ConfigError, MissingDependencyError: as :func:`check_report_to`.
    """
    check_report_to(report_to)
    root = Path(run_dir)
    if report_to == "tensorboard":
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # optional: tensorboard is not a dependency
            return []
        return [_TensorBoard(SummaryWriter(str(root / "tb"), purge_step=resume_step))]
    if report_to == "wandb":
        return [_open_wandb(root, config, resume=resume_step is not None)]
    return []
