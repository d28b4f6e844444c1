"""Does a faster path (``--precision bf16-autocast``, ``--shared-prefix``) change what the learning study
measures? A paired check.

    python scripts/precision_check.py RUN_DIR [--label bf16-autocast]
        [--fp32 docs/experiments/learn/lr1e-4_s0.json]
        [--control docs/experiments/learn/control_s0.json] [--steps 50]

``RUN_DIR`` is a ``train grpo`` run of the learning study's ``lr1e-4`` arm, seed 0, on the faster path for
``--steps`` steps (scripts/learn_experiment.sh's options plus e.g. ``--precision bf16-autocast --steps 50``);
``--label`` names that path in the report.
``--fp32`` and ``--control`` are the study's summaries of the same arm at fp32 and of the frozen control
(docs/experiments/learn/, written by ``lld_report.py learn-summarize``); the fp32 run is read up to the same
step, which is what a run of that many steps at fp32 logs (a constant rate, no warm-up).

For each precision: the paired gain ``d_t`` = sampled reward − the control's at step ``t`` (the same
questions and seeds) over the last half of the steps, its mean and 95 % interval (mean ± 1.96 sd / √n, the
study's L1), and the greedy test EM at the last step against the warm-start's, question by question (a
percentile bootstrap). The check passes when the faster run's mean gain lies within the fp32 run's
interval. It also prints the health figures precision moves: ``rollout/logp_mismatch`` (pi_old against the sampler)
and ``train/clip_frac``, as medians over the steps.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def gain(arm: Mapping[int, float], control: Mapping[int, float], steps: int) -> dict[str, float]:
    """Mean of ``arm[t] - control[t]`` over steps ``steps / 2 < t <= steps`` and its normal 95 % interval."""
    d = [arm[t] - control[t] for t in sorted(arm) if steps / 2 < t <= steps and t in control]
    if len(d) < 2:
        raise SystemExit(f"need at least 2 paired steps in ({steps / 2:g}, {steps}], found {len(d)}")
    mean, half = statistics.fmean(d), 1.96 * statistics.stdev(d) / math.sqrt(len(d))
    return {"n": len(d), "mean": mean, "lo": mean - half, "hi": mean + half}


def em_gain(final: Sequence[int], warm: Sequence[int], resamples: int = 10_000) -> dict[str, float]:
    """Question-paired greedy EM gain of ``final`` over ``warm`` with a percentile bootstrap 95 % interval."""
    import numpy as np

    if len(final) != len(warm) or not final:
        raise SystemExit(f"the evaluations hold {len(final)} and {len(warm)} questions; they must match")
    d = np.asarray(final, dtype=float) - np.asarray(warm, dtype=float)
    boot = d[np.random.default_rng(0).integers(0, len(d), size=(resamples, len(d)))].mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"mean": float(d.mean()), "lo": float(lo), "hi": float(hi)}


def summary_series(summary: Mapping[str, Any], key: str) -> dict[int, float]:
    """A study summary's curve ``key`` as ``{step: value}``."""
    values = summary["curves"].get(key) or []
    return {t: v for t, v in zip(summary["curves"]["step"], values, strict=False) if v is not None}


def run_series(run: Path, key: str) -> dict[int, float]:
    """A run folder's ``metrics.jsonl`` curve ``key`` as ``{step: value}`` (steps > 0)."""
    out = {}
    for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("step", 0) > 0 and record.get(key) is not None:
            out[int(record["step"])] = float(record[key])
    return out


def run_em(run: Path, step: int) -> list[int]:
    """The per-question greedy EM of a run folder's evaluation at ``step``, in question order."""
    rows = [
        json.loads(line) for line in (run / "eval_episodes.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    return [int(r["em"] > 0) for r in rows if r["step"] == step]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="the faster path's run folder")
    parser.add_argument("--label", default="bf16-autocast", help="the faster path's name in the report")
    learn = HERE.parent / "docs" / "experiments" / "learn"
    parser.add_argument("--fp32", type=Path, default=learn / "lr1e-4_s0.json", help="the fp32 arm's summary")
    parser.add_argument(
        "--control", type=Path, default=learn / "control_s0.json", help="the control's summary"
    )
    parser.add_argument("--steps", type=int, default=50, help="steps compared (the faster run's length)")
    args = parser.parse_args(argv)
    fp32 = json.loads(args.fp32.read_text(encoding="utf-8"))
    control = json.loads(args.control.read_text(encoding="utf-8"))
    key = "rollout/sampled_reward"
    reference = summary_series(control, key)
    warm = [int(ch) for ch in control["eval"]["0"]["em_by_question"]]
    rows = {
        "fp32": (
            gain(summary_series(fp32, key), reference, args.steps),
            em_gain([int(ch) for ch in fp32["eval"][str(args.steps)]["em_by_question"]], warm),
        ),
        args.label: (
            gain(run_series(args.run, key), reference, args.steps),
            em_gain(run_em(args.run, args.steps), warm),
        ),
    }
    print(f"paired gain over the control, steps {args.steps // 2 + 1}-{args.steps} (mean [95 % interval]):")
    for name, (g, em) in rows.items():
        print(
            f"  {name:14s} sampled reward {g['mean']:+.4f} [{g['lo']:+.4f}, {g['hi']:+.4f}] (n {g['n']}); "
            f"greedy test EM at step {args.steps} vs the warm-start {em['mean']:+.4f} [{em['lo']:+.4f}, {em['hi']:+.4f}]"
        )
    ref = rows["fp32"][0]
    inside = ref["lo"] <= rows[args.label][0]["mean"] <= ref["hi"]
    print(f"{args.label}'s mean gain {'lies within' if inside else 'is OUTSIDE'} the fp32 run's interval")
    for key in ("rollout/logp_mismatch", "train/clip_frac"):
        values = run_series(args.run, key)
        steps = [t for t in values if t <= args.steps]
        print(
            f"{args.label} {key}: median {statistics.median(values[t] for t in steps):.3g} over {len(steps)} steps"
        )
    return 0 if inside else 1


if __name__ == "__main__":
    sys.exit(main())
