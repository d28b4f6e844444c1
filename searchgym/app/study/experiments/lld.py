"""The first LLD experiment's report from its run folders, LLD-2's warm-start gate, per-run summaries,
report and figure (docs/experiments/lld.md, lld2.md); ``scripts/lld_report.py`` runs each as a subcommand."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from searchgym.agents.grpo.diagnostics import (
    behaviour_collapse_step,
    collapse_step,
    drop_step,
    warning_steps,
)
from searchgym.agents.training.metrics import read_metrics

PROBE_DROP = 0.3
"""LLD-2's precursor (pre-registered; exploratory in lld.md): the on-policy probe this many nats/token below
its step-0 value."""
SECONDARY_DROP = 1.0
"""LLD-2's secondary collapse: the on-policy probe this many nats/token below step 0."""
LEDGER_PRECURSOR = -0.1
"""LLD-2's secondary precursor: ``lld/ledger_delta`` at or below this (reported, not in the criteria)."""
LEAD = 5
"""LLD-2's C2: the precursor must lead the collapse by at least this many steps."""
SEEDS = 5
ARMS = {"A": "GRPO", "B": "GRPO+LLDS", "C": "GRPO+LLDS+ledger", "D": "GRPO, zero-signal skipped"}
CURVES = (
    "rollout/reward",
    "rollout/answered",
    "rollout/searches",
    "train/entropy",
    "train/lr",
    "train/grad_norm_max",
    "train/zero_signal_frac",
    "lld/probe_logp",
    "lld/probe_onpolicy_train",
    "lld/probe_onpolicy_heldout",
    "lld/ledger_delta",
    "lld/ledger_frac_displaced",
    "lld/delta_adv_pos",
    "lld/delta_adv_zero",
    "lld/delta_adv_neg",
    "time/step_s",
    "time/probe_s",
    "time/ledger_s",
)
AT_STEPS = (0, 40, 80)


def _num(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return round(value, 5) if math.isfinite(value) else None


def fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def table(rows: Sequence[dict[str, Any]]) -> str:
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def _mean(values: Sequence[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


# -- the first experiment (lld.md) ----------------------------------------------------------------------


def lld_run_summary(run: Path) -> dict[str, Any]:
    """One lld.md run: every column its tables show, from the run's metrics.jsonl."""
    history = read_metrics(run)
    steps = [r for r in history if r["step"] > 0 and r.get("rollout/reward") is not None]
    evals = {r["step"]: r["eval/em"] for r in history if r.get("eval/em") is not None}
    collapse = collapse_step(steps, smooth=5, fraction=0.5)
    warnings = warning_steps(steps, window=3)
    first_warning = warnings[0] if warnings else None
    later = {s: em for s, em in evals.items() if s > 0}
    pos: list[float] = [r["lld/delta_adv_pos"] for r in steps if r.get("lld/delta_adv_pos") is not None]
    wall = run / "wall_s"  # written by /usr/bin/time when the run ends
    done = wall.is_file() and wall.read_text().strip()
    last = steps[-1] if steps else {}
    return {
        "run": run.parent.name + "/" + run.name,
        "steps": len(steps),
        "em_0/15/30/45": " / ".join(fmt(evals.get(s)) for s in (0, 15, 30, 45)),
        "collapse": collapse,
        "first_warning": first_warning,
        "lead": (collapse - first_warning) if collapse and first_warning else None,
        "peak_em": max(later.values()) if later else None,
        "final_em": later[max(later)] if later else None,
        "probe_0": next((r.get("lld/probe_logp") for r in history if r["step"] == 0), None),
        "probe_last": last.get("lld/probe_logp"),
        "probe_drop*": drop_step(history, "lld/probe_logp", PROBE_DROP),
        "pos<=0": f"{sum(1 for v in pos if v <= 0)} of {len(pos)}",
        "mean_d_zero": _mean([r.get("lld/delta_adv_zero") for r in steps]),
        "mean_d_neg": _mean([r.get("lld/delta_adv_neg") for r in steps]),
        "searches_last10": _mean([r.get("rollout/searches") for r in steps[-10:]]),
        "entropy_1/last": f"{fmt(steps[0].get('train/entropy'))} / {fmt(last.get('train/entropy'))}"
        if steps
        else None,
        "max_grad": max((r.get("train/grad_norm_max") or 0.0) for r in steps) if steps else None,
        "wall_min": float(wall.read_text()) / 60 if done else None,
    }


def lld_verdict(by_arm: dict[str, list[dict[str, Any]]], lr: str) -> list[str]:
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


def cmd_lld(args: argparse.Namespace) -> None:
    by_arm: dict[str, list[dict[str, Any]]] = {}
    runs: dict[str, list[Path]] = {}
    for arm in sorted(p for p in args.runs_dir.iterdir() if p.is_dir()):
        seeds = sorted(s for s in arm.glob("s*") if (s / "metrics.jsonl").is_file())
        if seeds:
            runs[arm.name] = seeds
            by_arm[arm.name] = [lld_run_summary(s) for s in seeds]
    if not by_arm:
        raise SystemExit(f"no runs under {args.runs_dir}")
    print(table([r for rows in by_arm.values() for r in rows]))
    print(
        f"\n(* exploratory: probe_drop* = first step with the probe more than {PROBE_DROP} nats/token below step 0)"
    )
    lrs = sorted({m.group(1) for arm in by_arm if (m := re.search(r"_lr(.+)$", arm))})
    for lr in lrs:
        print(f"\nverdict at lr {lr}:")
        print("\n".join("  " + line for line in lld_verdict(by_arm, lr)))
    if args.plots is None:
        return
    from searchgym.app.cli import plot

    def draw(paths: list[Path], labels: list[str], name: str, title: str) -> None:
        plot.run(
            argparse.Namespace(
                runs=[str(p) for p in paths],
                labels=labels,
                smooth=3,
                out=str(args.plots / name),
                title=title,
                warm_start_em=None,  # every run evaluates its warm-start as step 0 and draws its own line
            )
        )

    calibration = [a for a in runs if a.startswith("grpo_lr")]
    draw([runs[a][0] for a in calibration], calibration, "lld_stage_a.png", "stage A: vanilla GRPO, seed 0")
    for lr in lrs:
        arms = [a for a in runs if a.endswith(f"_lr{lr}") and len(runs[a]) > 1]
        if not arms:
            continue
        draw(
            [p for a in arms for p in runs[a]],
            [a.split("_lr")[0] for a in arms for _ in runs[a]],
            "lld_stage_b_arms.png",
            f"stage B, lr {lr}: arms overlaid",
        )
        for prefix, name in (("grpo", "lld_stage_b_grpo.png"), ("llds", "lld_stage_b_llds.png")):
            arm = f"{prefix}_lr{lr}"
            if arm in runs:
                draw(runs[arm], [p.name for p in runs[arm]], name, f"stage B, {arm}: seeds")


# -- LLD-2: the gate -----------------------------------------------------------------------------------


def cmd_gate(args: argparse.Namespace) -> None:
    """Greedy EM and sampled (temperature 1) reward of a checkpoint on the first N questions of a split
    (validation by default: LLD-2's gate)."""
    import torch

    from searchgym.agents.llm import LLMPolicy
    from searchgym.agents.training.config import SFTConfig
    from searchgym.agents.training.policy import build_policy
    from searchgym.agents.training.rollout import evaluate_greedy, evaluate_policy
    from searchgym.envs.vector import SearchQAVectorEnv

    torch.set_num_threads(args.threads)
    cfg = SFTConfig(
        init=str(args.checkpoint),
        max_turn_tokens=48,
        max_context_tokens=1024,
        eval_split=args.split,
        eval_batch=100,
        progress=False,
        tensorboard=False,
    )
    policy, _ = build_policy(
        cfg.model,
        device=cfg.run.device,
        weights_seed=cfg.run.seed,
        max_context_tokens=cfg.env.max_context_tokens,
        max_turn_tokens=48,
        seed=0,
    )
    policy.model.eval()
    greedy = evaluate_greedy(
        policy.model, policy.tokenizer, cfg.env, dataclasses.replace(cfg.eval, questions=args.questions)
    )
    sampler = LLMPolicy(policy.model, policy.tokenizer, temperature=1.0, max_turn_tokens=48, seed=0)
    env = SearchQAVectorEnv(100, cfg.eval_env, autoreset_mode="Disabled", tokenizer=policy.tokenizer)
    try:
        sampled = evaluate_policy(sampler, env, args.questions)
    finally:
        env.close()
    result = {
        "checkpoint": str(args.checkpoint),
        "questions": args.questions,
        "split": args.split,
        "greedy_em": greedy["em"],
        "greedy_searches": greedy["searches"],
        "greedy_answered": greedy["answered"],
        "sampled_reward": sampled["em"],
        "sampled_searches": sampled["searches"],
        "gate": {
            "em_in_0.40_0.60": 0.40 <= greedy["em"] <= 0.60,
            "sampled_reward_ge_0.30": sampled["em"] >= 0.30,
        },
    }
    result["passed"] = all(result["gate"].values())
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")


# -- LLD-2: per-run summaries ----------------------------------------------------------------------------


def commit_of_head() -> str | None:
    """The checked-out commit, or ``None`` outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def _first_at_most(history: Sequence[dict[str, Any]], key: str, threshold: float) -> int | None:
    for r in history:
        value = r.get(key)
        if r["step"] > 0 and value is not None and math.isfinite(value) and value <= threshold:
            return int(r["step"])
    return None


def lld2_summary(run: Path) -> dict[str, Any]:
    """The small JSON that stands for one LLD-2 run once its folder is gone."""
    history = read_metrics(run)
    steps = [r for r in history if r["step"] > 0 and r.get("rollout/reward") is not None]
    start = next((r for r in history if r["step"] == 0), {})
    collapse = behaviour_collapse_step(history)
    precursor = drop_step(history, "lld/probe_onpolicy_train", PROBE_DROP)
    by_step = {r["step"]: r for r in history}
    at: dict[str, dict[str, float | None]] = {}
    for s in AT_STEPS:
        r = by_step.get(s, {})
        window = [x for x in steps if s - 4 <= x["step"] <= s] if s else []
        at[str(s)] = {
            "eval_em": _num(r.get("eval/em")),
            "eval_f1": _num(r.get("eval/f1")),
            "eval_searches": _num(r.get("eval/searches")),
            "eval_answered": _num(r.get("eval/answered")),
            "probe_onpolicy_train": _num(r.get("lld/probe_onpolicy_train")),
            "probe_onpolicy_heldout": _num(r.get("lld/probe_onpolicy_heldout")),
            "probe_oracle": _num(r.get("lld/probe_logp")),
            "searches_5": _num(_mean([x.get("rollout/searches") for x in window]))
            if s
            else _num(start.get("warmstart/searches")),
            "answered_5": _num(_mean([x.get("rollout/answered") for x in window]))
            if s
            else _num(start.get("warmstart/answered")),
            "entropy_5": _num(_mean([x.get("train/entropy") for x in window])) if s else None,
        }
    config: dict[str, Any] = {}
    checkpoint = run / "checkpoint.pt"
    if checkpoint.is_file():
        from searchgym.agents.training.checkpoint import load_checkpoint
        from searchgym.agents.training.checkpoint_checks import stored_config
        from searchgym.options import flat_values

        payload = load_checkpoint(checkpoint)
        config = flat_values(stored_config(payload["config"], payload.get("kind"), checkpoint))
    wall = run / "wall_s"
    arm, seed = run.parent.name, int(run.name.lstrip("s"))
    return {
        "experiment": "lld2",
        "arm": arm,
        "seed": seed,
        "commit": commit_of_head(),
        "options": {
            k: config.get(k)
            for k in (
                "init",
                "lr",
                "warmup_steps",
                "warmup_start_lr",
                "steps",
                "questions_per_step",
                "group_size",
                "minibatch_size",
                "temperature",
                "kl_coef",
                "entropy_coef",
                "llds",
                "llds_coef",
                "llds_ledger",
                "ledger_lambda",
                "ledger_batch",
                "ledger_size",
                "skip_zero_signal",
                "onpolicy_probe_size",
                "seed",
            )
        },
        "steps": len(steps),
        "warmstart": {k.split("/", 1)[1]: _num(v) for k, v in start.items() if k.startswith("warmstart/")},
        "collapse": collapse,
        "collapse_secondary": drop_step(history, "lld/probe_onpolicy_train", SECONDARY_DROP),
        "collapse_reward_rule": collapse_step(steps, smooth=5, fraction=0.5),
        "precursor": precursor,
        "lead": (collapse - precursor) if collapse is not None and precursor is not None else None,
        "precursor_ledger": _first_at_most(history, "lld/ledger_delta", LEDGER_PRECURSOR),
        "at": at,
        "zero_signal_frac_mean": _num(_mean([r.get("train/zero_signal_frac") for r in steps])),
        "max_grad_norm": _num(max((r.get("train/grad_norm_max") or 0.0) for r in steps)) if steps else None,
        "timing_mean_s": {
            k: _num(_mean([r.get(f"time/{k}") for r in steps]))
            for k in ("rollout_s", "update_s", "probe_s", "ledger_s", "step_s")
        },
        "wall_s": _num(float(wall.read_text())) if wall.is_file() and wall.read_text().strip() else None,
        "curves": {"step": [int(r["step"]) for r in steps]}
        | {k: [_num(r.get(k)) for r in steps] for k in CURVES},
        "probe_step0": {
            k: _num(start.get(k))
            for k in ("lld/probe_logp", "lld/probe_onpolicy_train", "lld/probe_onpolicy_heldout")
        },
    }


def cmd_summarize(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    runs = sorted(p.parent for p in args.runs_dir.glob("*/s*/checkpoint.pt"))
    if args.only:
        runs = [r for r in runs if f"{r.parent.name}/{r.name}" in args.only]
    for run in runs:
        summary = lld2_summary(run)
        path = args.out / f"{run.parent.name}_{run.name}.json"
        path.write_text(json.dumps(summary, separators=(",", ":")) + "\n")
        print(f"wrote {path} (collapse {summary['collapse']}, final EM {summary['at']['80']['eval_em']})")


# -- LLD-2: tables, verdict, figures ----------------------------------------------------------------------


def load_summaries(folder: Path) -> dict[str, dict[int, dict[str, Any]]]:
    by_arm: dict[str, dict[int, dict[str, Any]]] = {}
    for path in sorted(folder.glob("*_s*.json")):
        if not re.fullmatch(r"[A-Za-z0-9]+_s\d+\.json", path.name):
            continue  # gate_*.json and other files
        s = json.loads(path.read_text())
        by_arm.setdefault(s["arm"], {})[int(s["seed"])] = s
    return by_arm


def _final(s: dict[str, Any]) -> float | None:
    return s["at"]["80"]["eval_em"]


def lld2_verdict(by_arm: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    """The four criteria, each PASS / FAIL once the runs not yet made could not change it, else undecided."""
    a, lines = by_arm.get("A", {}), []
    ca = sum(1 for s in a.values() if s["collapse"] is not None)
    left = SEEDS - len(a)
    c1 = "PASS" if ca >= 4 else "FAIL" if ca + left < 4 else f"undecided, {len(a)} of {SEEDS} seeds run"
    lines.append(f"C1 A collapses in >= 4 of 5: {ca} of {len(a)} run -> {c1}")
    collapsing = [s for s in a.values() if s["collapse"] is not None]
    leads = [s["lead"] for s in collapsing]
    ok = sum(1 for x in leads if x is not None and x >= LEAD)
    if left:
        c2 = f"undecided, {len(a)} of {SEEDS} seeds run"
    elif len(collapsing) < 2:
        c2 = "FAIL (fewer than 2 collapsing seeds)"
    else:
        c2 = "PASS" if ok >= 0.8 * len(collapsing) else "FAIL"
    lines.append(f"C2 precursor leads by >= {LEAD} in >= 4/5 of collapsing A seeds: leads {leads} -> {c2}")
    for arm in ("B", "C"):
        x = by_arm.get(arm, {})
        paired = sorted(set(x) & set(a))
        collapses = sum(1 for s in x.values() if s["collapse"] is not None)
        wins = sum(1 for k in paired if (_final(x[k]) or 0) > (_final(a[k]) or 0))
        losses = len(paired) - wins
        remaining = SEEDS - len(paired)
        if collapses >= 2 or losses >= 2:
            verdict = "FAIL"
        elif remaining == 0 or (collapses + remaining <= 1 and wins >= 4):
            verdict = "PASS" if collapses <= 1 and wins >= 4 else "FAIL"
        else:
            verdict = f"undecided, {len(paired)} of {SEEDS} paired seeds run"
        lines.append(
            f"C3[{arm}] {ARMS[arm]} collapses in <= 1 of 5 ({collapses} of {len(x)} run) and beats A's final EM "
            f"on >= 4 of 5 ({wins} of {len(paired)} paired) -> {verdict}"
        )
    d = by_arm.get("D", {})
    cd = sum(1 for s in d.values() if s["collapse"] is not None)
    if c1 == "FAIL":
        hm = "not assessable (C1 fails: no vanilla collapse to explain)"
    elif cd >= 2:
        hm = "FAIL (momentum alone does not explain it)"
    elif len(d) == SEEDS and c1 == "PASS":
        hm = "PASS"
    else:
        hm = f"undecided, {len(d)} of {SEEDS} seeds run"
    lines.append(f"H_M D collapses in <= 1 of 5 while C1 holds: {cd} of {len(d)} run -> {hm}")
    return lines


def cmd_lld2(args: argparse.Namespace) -> None:
    by_arm = load_summaries(args.summaries)
    if not by_arm:
        raise SystemExit(f"no LLD-2 summaries under {args.summaries}")
    gates = sorted(args.summaries.glob("gate_*.json"))
    for g in gates:
        r = json.loads(g.read_text())
        print(
            f"gate {g.stem}: greedy EM {r['greedy_em']:.3f}, sampled reward {r['sampled_reward']:.3f} "
            f"({r['questions']} validation questions) -> {'met' if r['passed'] else 'not met'}"
        )
    rows = []
    for arm in sorted(by_arm):
        for seed, s in sorted(by_arm[arm].items()):
            rows.append(
                {
                    "arm": f"{arm} {ARMS.get(arm, arm)}",
                    "seed": seed,
                    "steps": s["steps"],
                    "collapse": s["collapse"],
                    "probe -0.3": s["precursor"],
                    "lead": s["lead"],
                    "ledger <= -0.1": s["precursor_ledger"],
                    "probe -1.0": s["collapse_secondary"],
                    "reward rule": s["collapse_reward_rule"],
                    "EM 0 / 40 / 80": " / ".join(fmt(s["at"][k]["eval_em"]) for k in ("0", "40", "80")),
                    "on-policy train 0 → 80": f"{fmt(s['at']['0']['probe_onpolicy_train'])} → {fmt(s['at']['80']['probe_onpolicy_train'])}",
                    "held-out 0 → 80": f"{fmt(s['at']['0']['probe_onpolicy_heldout'])} → {fmt(s['at']['80']['probe_onpolicy_heldout'])}",
                    "searches 0 → 80": f"{fmt(s['at']['0']['searches_5'])} → {fmt(s['at']['80']['searches_5'])}",
                    "answered 80": s["at"]["80"]["answered_5"],
                    "entropy 40 / 80": f"{fmt(s['at']['40']['entropy_5'])} / {fmt(s['at']['80']['entropy_5'])}",
                    "zero-signal": s["zero_signal_frac_mean"],
                    "min": (s["wall_s"] or 0) / 60 or None,
                }
            )
    print(table(rows))
    print("\nverdict:")
    print("\n".join("  " + line for line in lld2_verdict(by_arm)))
    if args.plots is not None:
        plot_lld2(by_arm, args.plots)


def plot_lld2(by_arm: dict[str, dict[int, dict[str, Any]]], folder: Path) -> None:
    """One figure: behaviour, cross-step likelihood and the learning rate per step, one colour per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("rollout/answered", "answered (share of episodes)"),
        ("rollout/searches", "searches per episode"),
        ("lld/probe_onpolicy_train", "on-policy probe, train (log-lik./token)"),
        ("lld/probe_onpolicy_heldout", "on-policy probe, held-out"),
        ("lld/ledger_delta", "ledger Δ since anchoring (nats/token)"),
        ("train/entropy", "policy entropy (nats/token)"),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), sharex=True)
    colours = {"A": "tab:red", "B": "tab:blue", "C": "tab:green", "D": "tab:purple"}
    for ax, (key, title) in zip(axes.flat, panels, strict=True):
        for arm, runs in sorted(by_arm.items()):
            for i, (_seed, s) in enumerate(sorted(runs.items())):
                ys = [math.nan if v is None else v for v in s["curves"][key]]
                ax.plot(
                    s["curves"]["step"],
                    ys,
                    color=colours.get(arm),
                    alpha=0.8,
                    lw=1,
                    label=f"{arm} {ARMS.get(arm, arm)}" if i == 0 else None,
                )
            if key.startswith("lld/probe_onpolicy"):
                for s in runs.values():
                    base = s["probe_step0"].get(key)
                    if base is not None:
                        ax.axhline(base - PROBE_DROP, color="grey", ls=":", lw=0.8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
    axes.flat[0].legend(fontsize=8)
    seeds = sorted({seed for runs in by_arm.values() for seed in runs})
    fig.suptitle(f"LLD-2 (lr 1e-4 → 1.2e-3 over 80 steps), seeds {seeds}; dotted: step 0 − {PROBE_DROP} nats")
    fig.tight_layout()
    folder.mkdir(parents=True, exist_ok=True)
    fig.savefig(folder / "lld2_curves.png", dpi=90)
    print(f"wrote {folder / 'lld2_curves.png'}")
