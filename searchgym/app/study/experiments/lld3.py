"""LLD-3's summaries, criteria C1–C4 and figure (docs/experiments/lld3.md); run through
``python scripts/lld_report.py lld3-summarize RUNS_DIR --out DIR`` and ``lld_report.py lld3 DIR``.

The summaries are the learning study's (``learn_report.run_summary``) with the curves and options this
study reads besides: the ledger, the gradient norm, LLD per advantage sign, the regularisers' own metrics,
the behaviour rule's inputs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from searchgym.app.study.experiments import learn as learn_report

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


# -- definitions (lld3.md, part 1) -------------------------------------------------------------------------

CONTROL = "control"
CURES = ("llds", "ledger", "sapo")
ARMS = ("grpo", *CURES)
LEARN_WINDOW = (21, 50)
LEARN_GAIN = 0.02
"""Learned: mean paired gain over :data:`LEARN_WINDOW` at least this, its 95 % interval above 0."""
COLLAPSE_WIDTH = 10
COLLAPSE_BELOW = -0.03
"""Collapse: the first step ``t >= 10`` whose trailing 10-step mean paired gain is at or below this."""
PROBE_DRAWDOWN = 0.05
"""Precursor P: the held-out on-policy probe this far (nat/token) below its highest earlier value."""
LEDGER_BELOW = -0.1
"""Precursor R: ``lld/ledger_delta`` at or below this (nat/token)."""
LEAD = 5
SEEDS = 3
HELDOUT = "lld/probe_onpolicy_heldout"


def paired(arm: dict[str, Any], control: dict[str, Any]) -> dict[int, float]:
    """``d_t``: the arm's sampled reward minus the control's, step by step (the steps both have)."""
    a = learn_report.series(arm, "rollout/sampled_reward")
    c = learn_report.series(control, "rollout/sampled_reward")
    return {t: a[t] - c[t] for t in sorted(a) if t in c}


def learned(d: dict[int, float]) -> dict[str, Any]:
    lo_step, hi_step = LEARN_WINDOW
    xs = [v for t, v in d.items() if lo_step <= t <= hi_step]
    if len(xs) < 2:
        return {"mean": None, "lo": None, "met": None}
    mean = statistics.fmean(xs)
    lo = mean - 1.96 * statistics.stdev(xs) / math.sqrt(len(xs))
    return {"mean": mean, "lo": lo, "met": mean >= LEARN_GAIN and lo > 0}


def trailing(d: dict[int, float], width: int = COLLAPSE_WIDTH) -> dict[int, float]:
    """``D_t``: the trailing ``width``-step mean of ``d`` (full windows of consecutive steps only)."""
    return {
        t: statistics.fmean(d[s] for s in range(t - width + 1, t + 1))
        for t in d
        if all(s in d for s in range(t - width + 1, t + 1))
    }


def collapse_step(d: dict[int, float]) -> int | None:
    return next((t for t, v in trailing(d).items() if t >= COLLAPSE_WIDTH and v <= COLLAPSE_BELOW), None)


def probe_onset(s: dict[str, Any], key: str = HELDOUT, drawdown: float = PROBE_DRAWDOWN) -> int | None:
    """Precursor P: the first probe step at which ``key`` is ``drawdown`` below its highest earlier value."""
    best = s["probe_step0"].get(key)
    for t, v in sorted(learn_report.series(s, key).items()):
        if best is not None and v <= best - drawdown:
            return t
        best = v if best is None else max(best, v)
    return None


def ledger_onset(s: dict[str, Any]) -> int | None:
    """Precursor R: the first step with ``lld/ledger_delta`` at or below :data:`LEDGER_BELOW`."""
    return next(
        (t for t, v in sorted(learn_report.series(s, "lld/ledger_delta").items()) if v <= LEDGER_BELOW), None
    )


def behaviour(s: dict[str, Any]) -> int | None:
    """The behaviour rule of :func:`diagnostics.behaviour_collapse_step` on the summary's curves."""
    from searchgym.agents.grpo.diagnostics import behaviour_collapse_step

    curves = s["curves"]
    history = [
        {"step": t, "rollout/answered": a, "rollout/searches": n}
        for t, a, n in zip(
            curves["step"], curves["rollout/answered"], curves["rollout/searches"], strict=True
        )
        if a is not None and n is not None
    ]
    return behaviour_collapse_step(history)


def window_mean(s: dict[str, Any], key: str, lo: int, hi: int) -> float | None:
    xs = [v for t, v in learn_report.series(s, key).items() if lo <= t <= hi]
    return statistics.fmean(xs) if xs else None


def phases(s: dict[str, Any], collapse: int) -> dict[str, list[float | None]]:
    """C4's windows: W1 = steps 1–30, W2 = the 15 steps before the collapse, W3 = it and the 14 after."""
    windows = [(1, 30), (collapse - 15, collapse - 1), (collapse, min(collapse + 14, s["steps"]))]
    return {
        key: [window_mean(s, key, lo, hi) for lo, hi in windows]
        for key in ("lld/delta_adv_pos", "train/grad_norm")
    }


def phases_hold(p: dict[str, list[float | None]]) -> bool:
    (a1, a2, a3), (_, g2, g3) = p["lld/delta_adv_pos"], p["train/grad_norm"]
    if None in (a1, a2, a3, g2, g3):
        return False
    return a1 > a2 > a3 and g3 > g2  # type: ignore[operator]


def final_em(s: dict[str, Any]) -> float | None:
    return s["eval"].get(str(s["steps"]), {}).get("em")


# -- the report ----------------------------------------------------------------------------------------------

fmt, level = learn_report.fmt, learn_report.level


def _count_word(hits: int, done: int, need: int, seeds: int = SEEDS) -> str:
    """MET / NOT MET / undecided for 'at least ``need`` of ``seeds``' with ``done`` seeds in."""
    if hits >= need:
        return "MET"
    if hits + (seeds - done) < need:
        return "NOT MET"
    return "undecided (seeds missing)"


def seed_rows(by_arm: dict[str, dict[int, dict[str, Any]]]) -> dict[str, dict[int, dict[str, Any]]]:
    """Per arm and seed: everything the criteria read (learned, collapse, precursors, phases, final EM)."""
    controls = by_arm.get(CONTROL, {})
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for arm in ARMS:
        for seed, s in sorted(by_arm.get(arm, {}).items()):
            c = controls.get(seed)
            if c is None:
                continue
            d = paired(s, c)
            collapse = collapse_step(d)
            p, r = probe_onset(s), ledger_onset(s)
            row = {
                "learned": learned(d),
                "collapse": collapse,
                "behaviour": behaviour(s),
                "P": p,
                "R": r,
                "lead_P": collapse - p if collapse is not None and p is not None else None,
                "lead_R": collapse - r if collapse is not None and r is not None else None,
                "phases": phases(s, collapse) if collapse is not None else None,
                "em": {k: v["em"] for k, v in s["eval"].items()},
                "final_em": final_em(s),
                "sampled_test": (s.get("sampled_test") or {}).get("sampled_reward"),
                "blocks": learn_report.block_means(s, c),
                "minutes": (s["wall_s"] or 0) / 60,
            }
            out.setdefault(arm, {})[seed] = row
    return out


def verdict(rows: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    grpo = rows.get("grpo", {})
    done = len(grpo)
    both = [seed for seed, r in grpo.items() if r["learned"]["met"] and r["collapse"] is not None]
    lines = [
        f"C1 learn, then collapse: {_count_word(len(both), done, 2)} (grpo learned and collapsed in seeds {both}, {done} of {SEEDS} run)"
    ]
    collapsed = [seed for seed, r in grpo.items() if r["collapse"] is not None]
    if len(collapsed) >= 2:
        leads = {k: [grpo[s][f"lead_{k}"] for s in collapsed] for k in ("P", "R")}
        met = [k for k, v in leads.items() if all(x is not None and x >= LEAD for x in v)]
        word = "MET by " + " and ".join(met) if met else "NOT MET"
        lines.append(
            f"C2 a precursor leads by >= {LEAD} steps: {word} (leads in collapsed seeds {collapsed}: P {leads['P']}, R {leads['R']})"
        )
    else:
        lines.append(
            f"C2 a precursor leads by >= {LEAD} steps: not applicable ({len(collapsed)} grpo seed(s) collapsed, 2 needed)"
        )
    for cure in CURES:
        cr = rows.get(cure, {})
        paired_seeds = sorted(set(cr) & set(grpo))
        collapses = sum(cr[s]["collapse"] is not None for s in cr)
        above = sum((cr[s]["final_em"] or 0) > (grpo[s]["final_em"] or 0) for s in paired_seeds)
        ok_collapse = collapses <= 1
        c3 = _count_word(above, len(paired_seeds), 2) if ok_collapse else "NOT MET"
        if ok_collapse and len(cr) < SEEDS and c3 == "MET":
            c3 = "undecided (seeds missing)" if collapses + (SEEDS - len(cr)) > 1 else "MET"
        lines.append(
            f"C3 {cure}: {c3} (collapsed in {collapses} of {len(cr)}; final greedy EM above grpo's in {above} of {len(paired_seeds)} paired seeds)"
        )
    held = [s for s in both if grpo[s]["phases"] is not None and phases_hold(grpo[s]["phases"])]
    lines.append(
        f"C4 the phases: {_count_word(len(held), done, 2)} (held in seeds {held} of learned-and-collapsed {both})"
    )
    return lines


def report(folder: Path, plots: Path | None = None) -> str:
    """Every table and verdict of lld3.md's part 2, from the summaries in ``folder``."""
    by_arm = learn_report.load(folder)
    lines: list[str] = []
    for seed, c in sorted(by_arm.get(CONTROL, {}).items()):
        evals = {k: round(v["em"], 4) for k, v in c["eval"].items()}
        lines.append(f"control s{seed}: greedy test EM by step {evals} (weights frozen: must all be equal)")
    rows = seed_rows(by_arm)
    lines += [
        "",
        "| arm | seed | learned: d, steps 21–50 [lo] | 10-step block means of d | collapse (behaviour) | P / R onset | greedy test EM 25/50/75/100 | sampled test | min |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for arm in ARMS:
        for seed, r in sorted(rows.get(arm, {}).items()):
            le = r["learned"]
            ems = " ".join(level(r["em"].get(str(t))) for t in (25, 50, 75, 100))
            lines.append(
                f"| {arm} | {seed} | {fmt(le['mean'])} [{fmt(le['lo'])}] {'✓' if le['met'] else '✗'} "
                f"| {' '.join(fmt(b) for b in r['blocks'])} | {r['collapse'] or '–'} ({r['behaviour'] or '–'}) "
                f"| {r['P'] or '–'} / {r['R'] or '–'} | {ems} | {level(r['sampled_test'])} | {level(r['minutes'], 1)} |"
            )
    phase_rows = [
        (arm, seed, r) for arm in ARMS for seed, r in sorted(rows.get(arm, {}).items()) if r["phases"]
    ]
    if phase_rows:
        lines += [
            "",
            "| arm | seed | Δ(A>0) W1 / W2 / W3 | grad norm W1 / W2 / W3 |",
            "| --- | --- | --- | --- |",
        ]
        for arm, seed, r in phase_rows:
            a, g = r["phases"]["lld/delta_adv_pos"], r["phases"]["train/grad_norm"]
            lines.append(
                f"| {arm} | {seed} | {' / '.join(fmt(x, 4) for x in a)} | {' / '.join(level(x) for x in g)} |"
            )
    lines += ["", "verdict:", *("  " + v for v in verdict(rows))]
    if plots is not None:
        plot(by_arm, plots)
        lines.append(f"figure: {plots / 'lld3_curves.png'}")
    return "\n".join(lines)


def plot(by_arm: dict[str, dict[int, dict[str, Any]]], folder: Path) -> None:
    """Paired gain (10-step trailing mean), held-out probe, Δ(A>0) and greedy test EM, per arm and seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    controls = by_arm.get(CONTROL, {})
    for i, arm in enumerate((CONTROL, *ARMS)):
        for seed, s in sorted(by_arm.get(arm, {}).items()):
            style = {
                "color": colours[i % len(colours)],
                "alpha": 0.8,
                "label": arm if seed == min(by_arm[arm]) else None,
            }
            c = controls.get(seed)
            if arm != CONTROL and c is not None:
                big_d = trailing(paired(s, c))
                axes[0].plot(list(big_d), list(big_d.values()), **style)
            p = learn_report.series(s, HELDOUT)
            start = s["probe_step0"].get(HELDOUT)
            if start is not None:
                axes[1].plot([0, *p], [0.0, *(v - start for v in p.values())], **style)
            if arm != CONTROL:
                a = learn_report.series(s, "lld/delta_adv_pos")
                axes[2].plot(list(a), list(a.values()), **style)
            em = sorted((int(k), v["em"]) for k, v in s["eval"].items())
            axes[3].plot([t for t, _ in em], [v for _, v in em], marker="o", **style)
    axes[0].axhline(0, color="grey", lw=0.8)
    axes[0].axhline(COLLAPSE_BELOW, color="grey", lw=0.8, ls="--")
    axes[0].set_title("sampled reward − frozen control (10-step trailing mean)")
    axes[1].set_title("held-out on-policy probe − step 0 (nat/token)")
    axes[2].set_title("Δ log-lik. of the step's A>0 responses (nat/token)")
    axes[3].set_title("greedy test EM (500 questions)")
    for ax in axes:
        ax.set_xlabel("step")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    folder.mkdir(parents=True, exist_ok=True)
    fig.savefig(folder / "lld3_curves.png", dpi=90)
