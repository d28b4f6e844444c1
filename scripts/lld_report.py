"""Tables, verdict and plots of the pre-registered LLD experiment (docs/experiments/lld.md).

Usage: python scripts/lld_report.py RUNS_DIR [--plots DIR]

RUNS_DIR holds one folder per arm (``grpo_lr7e-4``, ``llds_lr7e-4`` …) with one run folder per seed
(``s0``, ``s1`` …). Every number comes from the runs' ``metrics.jsonl`` through the pre-registered rules
of :mod:`searchgym.agents.grpo.diagnostics`.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path
from typing import Any

from searchgym.agents.grpo.diagnostics import collapse_step, warning_steps
from searchgym.agents.grpo.runtime import read_metrics

PROBE_DROP = 0.3
"""Exploratory (not pre-registered): the step at which the probe set's mean log-likelihood per token is
more than this many nats below its step-0 value (column ``probe_drop*``)."""


def run_summary(run: Path) -> dict[str, Any]:
    history = read_metrics(run)
    steps = [r for r in history if r["step"] > 0 and r.get("rollout/reward") is not None]
    evals = {r["step"]: r["eval/em"] for r in history if r.get("eval/em") is not None}
    collapse = collapse_step(steps, smooth=5, fraction=0.5)
    warnings = warning_steps(steps, window=3)
    first_warning = warnings[0] if warnings else None
    later = {s: em for s, em in evals.items() if s > 0}
    probe0 = next((r.get("lld/probe_logp") for r in history if r["step"] == 0), None)
    probe_drop = next(
        (
            r["step"]
            for r in steps
            if probe0 is not None and (r.get("lld/probe_logp") or 0.0) < probe0 - PROBE_DROP
        ),
        None,
    )
    searches = [r.get("rollout/searches") or 0.0 for r in steps]
    degenerate = next(
        (steps[j]["step"] for j in range(4, len(steps)) if sum(searches[j - 4 : j + 1]) / 5 < 0.5), None
    )
    wall = run / "wall_s"  # written by /usr/bin/time when the run ends
    done = wall.is_file() and wall.read_text().strip()
    return {
        "run": run.parent.name + "/" + run.name,
        "steps": len(steps),
        "warm_em": evals.get(0),
        "collapse": collapse,
        "first_warning": first_warning,
        "lead": (collapse - first_warning) if collapse and first_warning else None,
        "peak_em": max(later.values()) if later else None,
        "final_em": later[max(later)] if later else None,
        "probe_drop*": probe_drop,
        "no_search*": degenerate,
        "max_grad": max((r.get("train/grad_norm_max") or 0.0) for r in steps) if steps else None,
        "wall_min": float(wall.read_text()) / 60 if done else None,
    }


def fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def table(rows: list[dict[str, Any]]) -> str:
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def verdict(by_arm: dict[str, list[dict[str, Any]]], lr: str) -> list[str]:
    vanilla, llds = by_arm.get(f"grpo_lr{lr}"), by_arm.get(f"llds_lr{lr}")
    if not vanilla or not llds:
        return [f"(no verdict at lr {lr}: needs both grpo_lr{lr} and llds_lr{lr})"]
    v = {r["run"].split("/")[1]: r for r in vanilla}
    g = {r["run"].split("/")[1]: r for r in llds}
    seeds = sorted(set(v) & set(g))
    collapsed = [s for s in seeds if v[s]["collapse"]]
    c1 = len(collapsed) >= 2
    c2 = bool(collapsed) and all(v[s]["lead"] is not None and v[s]["lead"] >= 1 for s in collapsed)
    llds_collapsed = sum(1 for s in seeds if g[s]["collapse"])
    wins = sum(1 for s in seeds if (g[s]["final_em"] or 0) > (v[s]["final_em"] or 0))
    mean_v = sum(v[s]["final_em"] or 0 for s in seeds) / len(seeds)
    mean_g = sum(g[s]["final_em"] or 0 for s in seeds) / len(seeds)
    c3 = llds_collapsed <= 1 and wins >= 2 and mean_g > mean_v
    return [
        f"seeds {seeds}",
        f"C1 vanilla collapses in >= 2 of 3: {len(collapsed)} of {len(seeds)} -> {'PASS' if c1 else 'FAIL'}",
        f"C2 warning before every vanilla collapse: leads {[v[s]['lead'] for s in collapsed]} -> "
        f"{'PASS' if c2 else 'FAIL'}",
        f"C3 LLDS collapses in <= 1 ({llds_collapsed}), beats vanilla's final EM on >= 2 seeds ({wins}), "
        f"higher mean ({mean_g:.3f} vs {mean_v:.3f}) -> {'PASS' if c3 else 'FAIL'}",
        f"reproduced: {'YES' if c1 and c2 and c3 else 'NO'}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs_dir", type=Path)
    parser.add_argument("--plots", type=Path, default=None, help="write one PNG per lr and per arm here")
    args = parser.parse_args()
    by_arm: dict[str, list[dict[str, Any]]] = {}
    runs: dict[str, list[Path]] = {}
    for arm in sorted(p for p in args.runs_dir.iterdir() if p.is_dir()):
        seeds = sorted(s for s in arm.glob("s*") if (s / "metrics.jsonl").is_file())
        if seeds:
            runs[arm.name] = seeds
            by_arm[arm.name] = [run_summary(s) for s in seeds]
    if not by_arm:
        raise SystemExit(f"no runs under {args.runs_dir}")
    print(table([r for rows in by_arm.values() for r in rows]))
    print(
        "\n(* exploratory, not pre-registered: probe_drop* = first step with the probe log-likelihood more than "
        f"{PROBE_DROP} nats/token below step 0; no_search* = first step whose 5-step mean of searches per "
        "episode is below 0.5)"
    )
    lrs = sorted({m.group(1) for arm in by_arm if (m := re.search(r"_lr(.+)$", arm))})
    for lr in lrs:
        print(f"\nverdict at lr {lr}:")
        print("\n".join("  " + line for line in verdict(by_arm, lr)))
    if args.plots is not None:
        from searchgym.cli import plot

        for lr in lrs:
            arms = [a for a in runs if a.endswith(f"_lr{lr}")]
            paths = [str(p) for a in arms for p in runs[a]]
            labels = [a.split("_lr")[0] for a in arms for _ in runs[a]]
            for arm in arms:  # one figure per arm, seeds in their own colours
                plot.run(
                    argparse.Namespace(
                        runs=[str(p) for p in runs[arm]],
                        labels=[p.name for p in runs[arm]],
                        smooth=3,
                        out=str(args.plots / f"lld_{arm}.png"),
                        title=f"{arm}: seeds (3-step moving average)",
                    )
                )
            plot.run(
                argparse.Namespace(
                    runs=paths,
                    labels=labels,
                    smooth=3,
                    out=str(args.plots / f"lld_lr{lr}.png"),
                    title=f"lr {lr}: arms overlaid (3-step moving average)",
                )
            )


if __name__ == "__main__":
    main()
