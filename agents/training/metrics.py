"""A run's metric log: ``metrics.jsonl`` (one JSON line per step) and the ``--report-to`` reporters
(:mod:`~searchgym.agents.training.reporting`), and its one reader."""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

from searchgym.data.jsonl import parse_json, read_lines
from searchgym.errors import DataFormatError
from searchgym.integrity import disk_full_is_clear

from .config import TrainConfig

__all__ = ["MetricLogger", "read_metrics"]


def _check_record(record: Any) -> None:
    """A metrics record: an object whose ``step`` is an integer and whose other values are numbers or null
    (what :meth:`MetricLogger.log` writes).

    Raises:
        ValueError: naming what is wrong.
    """
    if not isinstance(record, dict):
        raise ValueError(f"a {type(record).__name__}, not a metrics record")
    step = record.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError("'step' is not an integer")
    for key, value in record.items():
        if (
            key != "step"
            and value is not None
            and (isinstance(value, bool) or not isinstance(value, int | float))
        ):
            raise ValueError(f"{key!r:.60} holds a {type(value).__name__}, not a number")


def _read_metric_records(path: Path, repair: bool) -> list[dict[str, Any]]:
    """Parses ``metrics.jsonl`` (within the read limits of :mod:`searchgym.data.limits`): a torn last line (a
    kill or a full disk mid-write) is dropped with a warning; a bad line anywhere else is an error."""
    lines = list(read_lines(path))
    last = max((n for n, line in lines if line.strip()), default=-1)
    records: list[dict[str, Any]] = []
    for n, line in lines:
        if not line.strip():
            continue
        try:
            record = parse_json(line, path, n)
            _check_record(record)
        except (DataFormatError, ValueError) as e:
            reason = str(e).removeprefix(f"{path}:{n}: ")
            if n == last:
                action = "dropping it" if repair else "ignoring it"
                warnings.warn(
                    f"{path}:{n}: torn last line in the metrics log ({reason}); {action}", stacklevel=3
                )
                break
            raise DataFormatError(
                str(path), n, f"corrupt metrics record ({reason}); only a torn last line can be repaired"
            ) from None
        records.append(record)
    return records


class MetricLogger:
    """Writes one JSON line per step to ``RUN_DIR/metrics.jsonl``, and hands the step to the run's reporters
    (TensorBoard, W&B: :func:`~searchgym.agents.training.reporting.open_reporters`).

    Args:
        run_dir: The run folder.
        resume_step: When resuming, the checkpoint's step: lines written after it by the interrupted run are
            dropped, so the log continues from the saved step without duplicates; a torn last line is
            dropped with a warning. ``None`` starts a new log (see :func:`prepare_run_dir`, which refuses to
            replace an existing run's log unasked).
        tensorboard: Without ``config``: also write TensorBoard events if ``torch.utils.tensorboard`` can be
            imported.
        config: The run's config: its run section's ``report_to`` (with ``tensorboard`` false meaning none)
            chooses the reporters, and W&B records its options.

    Raises:
        DataFormatError: resuming, and a line other than the last one is corrupt.
    """

    def __init__(
        self,
        run_dir: str | Path,
        resume_step: int | None = None,
        tensorboard: bool = True,
        config: TrainConfig | None = None,
    ) -> None:
        from .reporting import open_reporters, report_target

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
        if config is not None:
            tensorboard = config.run.tensorboard
        report_to = config.run.report_to if config is not None else "tensorboard"
        self._reporters = open_reporters(
            report_target(report_to, tensorboard), self.path.parent, resume_step=resume_step, config=config
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Records the step's metrics (non-finite values are written as ``null``)."""
        clean = {k: (float(v) if math.isfinite(float(v)) else None) for k, v in metrics.items()}
        line = json.dumps({"step": step, **clean}) + "\n"
        kept = "the steps logged before are intact (a torn last line is dropped on --resume)"
        with disk_full_is_clear(self.path, len(line.encode()), kept):
            self._file.write(line)
            self._file.flush()
        for reporter in self._reporters:
            reporter.log(step, clean)

    def close(self) -> None:
        """Flushes and closes the log."""
        with disk_full_is_clear(self.path, kept="the steps logged before are intact"):
            self._file.close()
        for reporter in self._reporters:
            reporter.close()


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
