"""The learning study's summaries, criteria and figure (docs/experiments/learn.md); run through
``python scripts/lld_report.py learn-summarize RUNS_DIR --out DIR`` and ``lld_report.py learn DIR``.

A run folder is kept only as long as the machine: ``summarize`` writes one small JSON per finished run (its
per-step curves, each evaluation's per-question EM, the sampled test reward:
:func:`searchgym.app.study.summary.run_summary`), and ``report`` recomputes every table and verdict of learn.md
from those files alone.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from searchgym.app.study.summary import em_vector, run_summary, series
from searchgym.app.study.summary import load_summaries as load

CURVES = (
    "rollout/sampled_reward",
    "rollout/reward",
    "rollout/em",
    "rollout/f1",
    "rollout/answered",
    "rollout/searches",
    "rollout/informative_frac",
    "rollout/zero_adv_groups",
    "train/entropy",
    "train/lr",
    "train/grad_norm",
    "train/gns_groups",
    "lld/probe_logp",
    "lld/probe_onpolicy_train",
    "lld/probe_onpolicy_heldout",
    "lld/delta_adv_pos",
    "time/step_s",
    "time/rollout_s",
    "time/update_s",
    "time/probe_s",
)
PROBES = ("lld/probe_onpolicy_train", "lld/probe_onpolicy_heldout")
L1_GAIN = 0.03
"""L1: the mean paired gain in sampled training reward over the last half of the run."""
L2_GAIN = 0.03
"""L2: the gain in greedy test EM over the warm-start, pooled over seeds."""
L3_DROP = 0.1
"""L3: the most either on-policy probe may end below its step-0 value, nat/token."""
BOOTSTRAP = 10_000
CONTROL = "control"


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
)


def summarize(
    runs_dir: Path,
    out: Path,
    only: Sequence[str] | None,
    commit: str | None,
    curves: Sequence[str] = CURVES,
    keys: Sequence[str] = CONFIG_KEYS,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    runs = sorted(p.parent for p in runs_dir.glob("*/s*/checkpoint.pt"))
    if only:
        runs = [r for r in runs if f"{r.parent.name}/{r.name}" in only]
    for run in runs:
        summary = run_summary(run, commit, curves, keys)
        path = out / f"{run.parent.name}_{run.name}.json"
        path.write_text(json.dumps(summary, separators=(",", ":")) + "\n")
        final = summary["eval"].get(str(summary["steps"]), {}).get("em")
        print(f"wrote {path} ({summary['steps']} steps, final greedy EM {final})")


def paired_gain(
    arm: dict[str, Any], control: dict[str, Any], key: str = "rollout/sampled_reward"
) -> dict[str, Any]:
    """L1 for one seed: the per-step difference arm − control of ``key`` over the last half of the run
    (steps > steps / 2), its mean and normal 95 % interval (mean ± 1.96 · sd / √n)."""
    a, c = series(arm, key), series(control, key)
    if arm["config"].get("reward") == "f1" and key == "rollout/sampled_reward":
        c = series(control, "rollout/f1")  # the control's F1 of the same samples
    last = arm["steps"]
    d = [a[t] - c[t] for t in sorted(a) if t > last / 2 and t in c]
    if len(d) < 2:
        return {"n": len(d), "mean": None, "lo": None, "hi": None, "met": None}
    mean, sd = statistics.fmean(d), statistics.stdev(d)
    half = 1.96 * sd / math.sqrt(len(d))
    return {
        "n": len(d),
        "mean": mean,
        "lo": mean - half,
        "hi": mean + half,
        "met": mean >= L1_GAIN and mean - half > 0,
    }


def block_means(arm: dict[str, Any], control: dict[str, Any], width: int = 10) -> list[float | None]:
    """Mean paired difference of sampled reward per block of ``width`` steps (the table of part 2)."""
    a, c = series(arm, "rollout/sampled_reward"), series(control, "rollout/sampled_reward")
    out: list[float | None] = []
    for lo in range(1, arm["steps"] + 1, width):
        d = [a[t] - c[t] for t in range(lo, lo + width) if t in a and t in c]
        out.append(statistics.fmean(d) if d else None)
    return out


def pooled_em_gain(arms: Sequence[dict[str, Any]], warm: list[int]) -> dict[str, Any]:
    """L2: question-level greedy EM gain at the last step over the warm-start, averaged over the seeds, with
    a percentile bootstrap over questions (:data:`BOOTSTRAP` resamples, seed 0)."""
    import numpy as np

    finals = [em_vector(s, s["steps"]) for s in arms]
    finals = [f for f in finals if f is not None and len(f) == len(warm)]
    if not finals:
        return {"seeds": 0, "mean": None, "lo": None, "hi": None, "met": None}
    d = np.mean(np.array(finals, dtype=float), axis=0) - np.array(warm, dtype=float)
    rng = np.random.default_rng(0)
    boot = d[rng.integers(0, len(d), size=(BOOTSTRAP, len(d)))].mean(axis=1)
    lo, hi = (float(x) for x in np.percentile(boot, [2.5, 97.5]))
    mean = float(d.mean())
    return {"seeds": len(finals), "mean": mean, "lo": lo, "hi": hi, "met": mean >= L2_GAIN and lo > 0}


def probe_change(s: dict[str, Any]) -> dict[str, float | None]:
    """L3 for one seed: each on-policy probe at the last step minus step 0."""
    out: dict[str, float | None] = {}
    for k in PROBES:
        values, start = series(s, k), s["probe_step0"].get(k)
        end = values.get(s["steps"])
        out[k] = end - start if end is not None and start is not None else None
    return out


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:+.{digits}f}" if isinstance(value, float) else str(value)


def level(value: Any, digits: int = 3) -> str:
    """A level (EM, reward, minutes): no sign."""
    return "–" if value is None else f"{float(value):.{digits}f}"


def report(folder: Path, plots: Path | None = None, seeds: int = 3) -> str:
    """Every table and verdict of learn.md's part 2, from the summaries in ``folder``."""
    by_arm = load(folder)
    controls = by_arm.get(CONTROL, {})
    lines: list[str] = []
    gns = folder / "gns_warmstart.json"
    if gns.is_file():
        g = json.loads(gns.read_text())
        lines.append(
            f"gradient noise scale at the warm-start ({g['groups']} groups x {g['group_size']}): B_noise "
            f"{g['noise_scale_groups']:.4g} groups ({g['noise_scale_rollouts']:.4g} rollouts), informative "
            f"{g['informative_frac']:.3f}, SNR of a {g['minibatch_groups']:g}-group update {g['snr_minibatch']:.3g}"
        )
    warm = next((em_vector(r, 0) for r in controls.values() if em_vector(r, 0) is not None), None)
    for seed, run in sorted(controls.items()):
        evals = {k: round(v["em"], 4) for k, v in run["eval"].items()}
        lines.append(f"control s{seed}: greedy test EM by step {evals} (weights frozen: must all be equal)")
    lines.append("")
    lines.append(
        "| arm | seed | L1: d(sampled reward), steps > half [95 % CI] | 10-step block means of d | "
        "greedy EM 0 → end | sampled test reward | Δ probe train / held-out | min |"
    )
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    verdicts: list[str] = []
    best: tuple[float, str] | None = None
    for arm in sorted(a for a in by_arm if a != CONTROL):
        l1s, l3s = [], []
        for seed, s in sorted(by_arm[arm].items()):
            c = controls.get(seed)
            l1 = paired_gain(s, c) if c else {"mean": None, "lo": None, "hi": None, "met": None}
            blocks = block_means(s, c) if c else []
            probes = probe_change(s)
            l3 = all(v is not None and v >= -L3_DROP for v in probes.values())
            l1s.append(l1)
            l3s.append(l3)
            ws = c["eval"].get("0", {}).get("em") if c else None
            end = s["eval"].get(str(s["steps"]), {}).get("em")
            st = s.get("sampled_test") or {}
            cst = (c or {}).get("sampled_test") or {}
            lines.append(
                f"| {arm} | {seed} | {fmt(l1['mean'])} [{fmt(l1['lo'])}, {fmt(l1['hi'])}] {'✓' if l1['met'] else '✗'} "
                f"| {' '.join(fmt(b, 3) for b in blocks)} | {level(ws)} → {level(end)} "
                f"| {level(cst.get('sampled_reward'))} → {level(st.get('sampled_reward'))} "
                f"| {fmt(probes[PROBES[0]])} / {fmt(probes[PROBES[1]])} | {level((s['wall_s'] or 0) / 60, 1)} |"
            )
        means = [x["mean"] for x in l1s if x["mean"] is not None]
        if means and (best is None or statistics.fmean(means) > best[0]):
            best = (statistics.fmean(means), arm)
        met = sum(bool(x["met"]) for x in l1s)
        done = len(l1s)
        if met >= 2:
            l1_word = "MET"
        elif met + (seeds - done) < 2:
            l1_word = "NOT MET"
        else:
            l1_word = "undecided (seeds missing)"
        l2: dict[str, Any] = (
            pooled_em_gain(list(by_arm[arm].values()), warm)
            if warm
            else {"mean": None, "lo": None, "hi": None, "met": None, "seeds": 0}
        )
        if l2["mean"] is None or l2["seeds"] < seeds:
            l2_word = "undecided (seeds missing)"
        else:
            l2_word = "MET" if l2["met"] else "NOT MET"
        l3_word = "MET" if all(l3s) and done else "NOT MET" if l3s else "undecided"
        verdicts.append(
            f"{arm}: L1 {l1_word} ({met} of {done} seeds run); L2 {l2_word} (EM gain {fmt(l2['mean'])} "
            f"[{fmt(l2['lo'])}, {fmt(l2['hi'])}], {l2['seeds']} seeds); L3 {l3_word}"
        )
    lines.append("")
    lines.append("verdict:")
    lines.extend("  " + v for v in verdicts)
    if best is not None:
        lines.append(f"  best arm by mean d: {best[1]} ({fmt(best[0])})")
    if plots is not None:
        plot(by_arm, plots)
        lines.append(f"figure: {plots / 'learn_curves.png'}")
    return "\n".join(lines)


def plot(by_arm: dict[str, dict[int, dict[str, Any]]], folder: Path) -> None:
    """Paired gain in sampled reward (10-step moving mean), entropy and the on-policy probes, per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    controls = by_arm.get(CONTROL, {})
    for i, arm in enumerate(sorted(by_arm)):
        for seed, s in sorted(by_arm[arm].items()):
            style = {
                "color": colours[i % len(colours)],
                "alpha": 0.8,
                "label": arm if seed == min(by_arm[arm]) else None,
            }
            c = controls.get(seed)
            if arm != CONTROL and c is not None:
                a, b = series(s, "rollout/sampled_reward"), series(c, "rollout/sampled_reward")
                steps = [t for t in sorted(a) if t in b]
                d = [a[t] - b[t] for t in steps]
                smooth = [statistics.fmean(d[max(0, j - 9) : j + 1]) for j in range(len(d))]
                axes[0].plot(steps, smooth, **style)
            e = series(s, "train/entropy")
            axes[1].plot(sorted(e), [e[t] for t in sorted(e)], **style)
            p = series(s, "lld/probe_onpolicy_heldout")
            start = s["probe_step0"].get("lld/probe_onpolicy_heldout")
            if start is not None:
                axes[2].plot([0, *sorted(p)], [0.0, *(p[t] - start for t in sorted(p))], **style)
    axes[0].axhline(0, color="grey", lw=0.8)
    axes[0].axhline(L1_GAIN, color="grey", lw=0.8, ls="--")
    axes[0].set_title("sampled reward − frozen control (10-step mean)")
    axes[1].set_title("entropy of the sampled tokens")
    axes[2].axhline(-L3_DROP, color="grey", lw=0.8, ls="--")
    axes[2].set_title("held-out on-policy probe − step 0 (nat/token)")
    for ax in axes:
        ax.set_xlabel("step")
    axes[1].legend()  # every arm, the control included
    fig.suptitle("LEARN: GRPO against a frozen control, paired seeds")
    fig.tight_layout()
    fig.savefig(folder / "learn_curves.png", dpi=110)
    plt.close(fig)
