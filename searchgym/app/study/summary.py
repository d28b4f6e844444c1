"""One small JSON per finished run: what a study keeps of a run once its folder is gone, and reading it back.

A summary holds the run's per-step curves, the options it ran with, the step-0 values of its probes, each
greedy evaluation's per-question EM and the wall time. Reports recompute every table and verdict from these
files alone, so a study's summaries are committed and its run folders need not be.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "CONFIG_KEYS",
    "CURVES",
    "SUMMARY_NAME",
    "em_vector",
    "eval_series",
    "git_commit",
    "load_summaries",
    "number",
    "run_summary",
    "series",
    "summary_path",
    "write_summary",
]

CURVES = (
    "rollout/sampled_reward",
    "rollout/reward",
    "rollout/em",
    "rollout/f1",
    "rollout/answered",
    "rollout/searches",
    "rollout/response_length",
    "rollout/informative_frac",
    "rollout/zero_adv_groups",
    "train/entropy",
    "train/lr",
    "train/grad_norm",
    "train/grad_norm_max",
    "train/clip_frac",
    "train/llds_loss",
    "train/llds_gate_open",
    "train/sapo_loss",
    "train/sapo_frac",
    "train/ledger_llds_loss",
    "train/loss_term",
    "lld/probe_logp",
    "lld/probe_onpolicy_train",
    "lld/probe_onpolicy_heldout",
    "lld/ledger_delta",
    "lld/ledger_frac_displaced",
    "lld/delta_adv_pos",
    "lld/delta_adv_zero",
    "lld/delta_adv_neg",
    "lld/warning",
    "collapse/p_search_open",
    "collapse/p_search_close",
    "collapse/p_answer_open",
    "collapse/p_answer_close",
    "collapse/p_eos",
    "collapse/malformed_frac",
    "collapse/answer_without_search_frac",
    "mismatch/gap_mean",
    "mismatch/gap_abs_p99",
    "mismatch/kl_k3",
    "mismatch/ratio_p01",
    "mismatch/ratio_p99",
    "time/step_s",
    "time/rollout_s",
    "time/update_s",
    "time/probe_s",
    "time/ledger_s",
)
"""The curves a study's summary keeps by default: rewards and behaviour, the update's own figures, every LLD
measurement and warning signal, the collapse diagnostics, the sampler–learner gap (where the mismatch dial
logs it), the time split."""

CONFIG_KEYS = (
    "init",
    "lr",
    "steps",
    "questions_per_step",
    "group_size",
    "minibatch_size",
    "temperature",
    "advantage",
    "reward",
    "filter_groups",
    "llds",
    "kl_coef",
    "entropy_coef",
    "weight_decay",
    "adam_betas",
    "probe_every",
    "threads",
    "warmup_steps",
    "warmup_start_lr",
    "lr_schedule",
    "llds_coef",
    "llds_ledger",
    "ledger_lambda",
    "ledger_size",
    "sapo_coef",
    "sapo_threshold",
    "loss_term",
    "loss_term_coef",
    "seed",
)
"""The options a study's summary records by default (a protocol's own options are added to them)."""

PROBE_KEYS = ("lld/probe_logp", "lld/probe_onpolicy_train", "lld/probe_onpolicy_heldout")
"""The probes whose step-0 value (the warm-start's) a summary keeps apart from the curves."""

SUMMARY_NAME = re.compile(r"(?P<arm>[A-Za-z0-9._\-]+)_s(?P<seed>\d+)\.json")
"""A summary's file name, ``ARM_sSEED.json``; other files in a summaries folder are left alone."""


def number(value: Any) -> float | None:
    """A finite number as a float; anything else (missing, NaN, infinite, not a number) as ``None``."""
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


STAGE_CODES = {"correct": "c", "no_answer": "a", "not_retrieved": "r", "misread": "m"}
"""One letter per failure stage (:data:`searchgym.failures.OUTCOMES`) in a summary's ``stage_by_question``."""
KIND_CODES = {"attribute": "a", "bridge": "b", "comparison": "c"}
"""One letter per question kind in a summary's ``kind_by_question`` (``?``: another or none)."""


def run_summary(
    run: Path, commit: str | None, curves: Sequence[str] = CURVES, keys: Sequence[str] = CONFIG_KEYS
) -> dict[str, Any]:
    """The small JSON that stands for one run once its folder is gone.

    ``run`` is a finished ``train grpo`` folder named ``ARM/sSEED``: its ``metrics.jsonl``, ``manifest.json``
    (the options, of which ``keys`` are kept), ``eval_episodes.jsonl`` (each evaluation's per-question EM,
    in question order), and when present ``wall_s`` (seconds) and ``sampled_test.json``.

    Returns:
        ``arm``, ``seed``, ``commit``, ``config``, ``steps`` (the last step logged), ``wall_s``, ``curves``
        (``step`` and each of ``curves`` per step > 0; ``None`` where not logged), ``probe_step0``,
        ``eval`` (by step: ``em``, ``questions``, ``em_by_question`` as a string of 0/1, and where the
        records carry them ``stage_by_question`` and ``kind_by_question``, one letter a question:
        :data:`STAGE_CODES`, :data:`KIND_CODES`) and
        ``sampled_test``.
    """
    from searchgym.agents.training.metrics import read_metrics
    from searchgym.agents.training.run import EVAL_EPISODES

    history = read_metrics(run)
    config = json.loads((run / "manifest.json").read_text()).get("config", {})
    steps = [r for r in history if r["step"] > 0]
    start = next((r for r in history if r["step"] == 0), {})
    evals: dict[str, dict[str, Any]] = {}
    path = run / EVAL_EPISODES
    if path.is_file():
        by_step: dict[int, dict[str, float]] = {}
        records: dict[int, dict[str, dict[str, Any]]] = {}
        for line in path.read_text().splitlines():
            r = json.loads(line)
            by_step.setdefault(int(r["step"]), {})[r["question_id"]] = float(r["em"])
            records.setdefault(int(r["step"]), {})[r["question_id"]] = r
        for step, outcomes in sorted(by_step.items()):
            ids = list(outcomes)
            evals[str(step)] = {
                "em": sum(outcomes.values()) / len(ids),
                "questions": ids[0] + ".." + ids[-1] + f" ({len(ids)})",
                "em_by_question": "".join("1" if outcomes[q] > 0 else "0" for q in ids),
            }
            rows = [records[step][q] for q in ids]
            if all("stage" in r and "kind" in r for r in rows):  # what each question's evaluation was
                evals[str(step)] |= {
                    "stage_by_question": "".join(STAGE_CODES.get(str(r["stage"]), "?") for r in rows),
                    "kind_by_question": "".join(KIND_CODES.get(str(r["kind"]), "?") for r in rows),
                }
    sampled = run / "sampled_test.json"
    wall = run / "wall_s"
    return {
        "arm": run.parent.name,
        "seed": int(run.name.removeprefix("s")),
        "commit": commit,
        "config": {k: config.get(k) for k in keys},
        "steps": max((int(r["step"]) for r in steps), default=0),
        "wall_s": number(float(wall.read_text())) if wall.is_file() and wall.read_text().strip() else None,
        "curves": {"step": [int(r["step"]) for r in steps]}
        | {k: [number(r.get(k)) for r in steps] for k in curves},
        "probe_step0": {k: number(start.get(k)) for k in PROBE_KEYS},
        "eval": evals,
        "sampled_test": json.loads(sampled.read_text()) if sampled.is_file() else None,
    }


def summary_path(folder: Path, arm: str, seed: int) -> Path:
    """Where the summary of ``arm``'s seed ``seed`` lives in a summaries folder."""
    return folder / f"{arm}_s{seed}.json"


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    """Writes a summary as one compact JSON line, through a temporary file renamed into place (a reader,
    or a kill, never sees half a summary)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(summary, separators=(",", ":")) + "\n")
    os.replace(tmp, path)


def load_summaries(folder: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """Every summary in ``folder`` (files named ``ARM_sSEED.json``), by arm and seed."""
    by_arm: dict[str, dict[int, dict[str, Any]]] = {}
    for path in sorted(folder.glob("*_s*.json")):
        if not SUMMARY_NAME.fullmatch(path.name):
            continue
        s = json.loads(path.read_text())
        if not isinstance(s, dict) or "arm" not in s or "seed" not in s:
            continue  # another file whose name looks like one (e.g. gns_warmstart_s1.json)
        by_arm.setdefault(s["arm"], {})[int(s["seed"])] = s
    return by_arm


def series(s: dict[str, Any], key: str) -> dict[int, float]:
    """A summary's curve ``key`` as ``{step: value}``, the steps where it was logged (``{}`` if never)."""
    values = s["curves"].get(key)
    if values is None:
        return {}
    return {step: v for step, v in zip(s["curves"]["step"], values, strict=True) if v is not None}


def eval_series(s: dict[str, Any]) -> dict[int, float]:
    """A summary's greedy evaluations as ``{step: EM}``."""
    return {int(step): float(e["em"]) for step, e in sorted(s["eval"].items(), key=lambda kv: int(kv[0]))}


def em_vector(s: dict[str, Any], step: int) -> list[int] | None:
    """The per-question EM (0/1, in question order) of the evaluation at ``step``; ``None`` if there was none."""
    e = s["eval"].get(str(step))
    return [int(ch) for ch in e["em_by_question"]] if e else None


def git_commit(folder: Path | None = None) -> str | None:
    """The commit checked out in ``folder`` (default: the current directory); ``None`` outside git."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, check=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
