"""LLD-3's summaries, criteria C1–C4 and figure (docs/experiments/lld3.md); run through
``python scripts/lld_report.py lld3-summarize RUNS_DIR --out DIR`` and ``lld_report.py lld3 DIR``.

The summaries are the learning study's (``learn_report.run_summary``) with the curves and options this
study reads besides: the ledger, the gradient norm, LLD per advantage sign, the regularisers' own metrics,
the behaviour rule's inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import learn_report

CURVES = (
    *learn_report.CURVES,
    "train/grad_norm_max",
    "lld/ledger_delta",
    "lld/ledger_frac_displaced",
    "lld/delta_adv_zero",
    "lld/delta_adv_neg",
    "train/llds_loss",
    "train/llds_gate_open",
    "train/sapo_loss",
    "train/sapo_frac",
    "train/ledger_llds_loss",
    "train/clip_frac",
    "time/ledger_s",
)
CONFIG_KEYS = (
    *learn_report.CONFIG_KEYS,
    "warmup_steps",
    "warmup_start_lr",
    "lr_schedule",
    "llds_coef",
    "llds_ledger",
    "ledger_lambda",
    "ledger_size",
    "sapo_coef",
    "sapo_threshold",
    "seed",
)


def summarize(runs_dir: Path, out: Path, only: Sequence[str] | None, commit: str | None) -> None:
    learn_report.summarize(runs_dir, out, only, commit, CURVES, CONFIG_KEYS)
