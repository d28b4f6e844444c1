"""LEARN-2's summaries, criteria G1-G3 and flip table (docs/experiments/learn2.md); run through
``python scripts/lld_report.py learn2-summarize RUNS_DIR --out DIR`` and ``lld_report.py learn2 DIR``.

A summary is the learning study's (``learn_report.run_summary``: curves, each evaluation's per-question EM);
the report recomputes every table and verdict of learn2.md from the summaries and the headroom records
committed beside them (``headroom_*.json`` figures, ``headroom_warmstart.jsonl`` per question).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from searchgym.app.study.experiments import learn as learn_report
from searchgym.app.study.experiments.learn import em_vector, fmt, level, paired_gain, probe_change
from searchgym.stats import bootstrap_mean, mcnemar_p

CONTROL = "control"
RL_ARMS = ("grpo", "scst")
SFT_ARM = "sft"
G1_GAIN = 0.15
"""G1: the least mean gain in greedy test EM over the warm-start, per seed."""
G1_P = 0.01
"""G1: McNemar's p must be below this."""
RESAMPLES = 10_000
KINDS = ("attribute", "bridge", "comparison")
STAGES = ("retrieval_miss", "misread", "no_answer")

CURVES = (*learn_report.CURVES, "rollout/greedy_reward", "rollout/beats_greedy_frac", "time/greedy_s")
KEYS = (*learn_report.CONFIG_KEYS, "epochs", "batch_size", "demos", "keep_unrewarded")


def summarize(runs_dir: Path, out: Path, only: Sequence[str] | None, commit: str | None) -> None:
    learn_report.summarize(runs_dir, out, only, commit, CURVES, KEYS)


def final_vector(s: dict[str, Any]) -> list[int] | None:
    """The per-question greedy EM of a run's last evaluation."""
    steps = sorted(int(k) for k in s["eval"])
    return em_vector(s, steps[-1]) if steps else None


def paired(a: list[int], b: list[int]) -> dict[str, Any]:
    """``b - a`` per question: mean, paired bootstrap 95 % interval, McNemar's p, questions gained and lost."""
    diff = [y - x for x, y in zip(a, b, strict=True)]
    interval = bootstrap_mean(diff, resamples=RESAMPLES)
    p, lost, gained = mcnemar_p([x > 0 for x in a], [y > 0 for y in b])
    return {
        "mean": interval.mean,
        "lo": interval.low,
        "hi": interval.high,
        "p": p,
        "gained": gained,
        "lost": lost,
    }


def first_test_questions(n: int) -> list[Any]:
    """The first ``n`` test questions of the generated world (seed 0), in evaluation order."""
    from searchgym.data import load_dataset

    return list(load_dataset(None, world_seed=0).splits["test"][:n])


def question_kinds(n: int) -> list[str]:
    """The kinds of the first ``n`` test questions of the generated world (seed 0), in evaluation order."""
    return [q.kind for q in first_test_questions(n)]


def headroom_records(folder: Path) -> dict[str, dict[str, Any]]:
    """The warm-start's per-question headroom records (``headroom_warmstart.jsonl``) by question id: the greedy
    episode's failure stage, and the sampled EMs at each temperature."""
    path = folder / "headroom_warmstart.jsonl"
    if not path.is_file():
        return {}
    return {r["question_id"]: r for r in map(json.loads, path.read_text().splitlines())}


def _seed_verdict(met: int, done: int, seeds: int) -> str:
    if met >= 2:
        return "MET"
    return "NOT MET" if met + (seeds - done) < 2 else "undecided (seeds missing)"


def report(folder: Path, plots: Path | None = None, seeds: int = 3) -> str:
    """Every table and verdict of learn2.md's part 2, from the summaries in ``folder``."""
    by_arm = learn_report.load(folder)
    controls = by_arm.get(CONTROL, {})
    lines: list[str] = []
    for name in ("base", "warmstart"):
        path = folder / f"headroom_{name}.json"
        if path.is_file():
            h = json.loads(path.read_text())
            b = h["by_kind"].get("bridge", {}) if "by_kind" in h else {}
            lines.append(
                f"headroom of {name} ({h['questions']} questions, K {h['samples']}, T {h['temperature']}): greedy EM "
                f"{level(h['greedy_em'])}, mean@K {level(h['mean_at_k'])}, pass@K {level(h['pass_at_k'])}, solvable | "
                f"greedy wrong {level(h['solvable_given_greedy_wrong'])}; bridge: greedy EM {level(b.get('greedy_em'))}, "
                f"solvable | greedy wrong {level(b.get('solvable_given_greedy_wrong'))}"
            )
    warm = next((em_vector(r, 0) for r in controls.values() if em_vector(r, 0) is not None), None)
    for seed, run in sorted(controls.items()):
        evals = {k: round(v["em"], 4) for k, v in run["eval"].items()}
        lines.append(f"control s{seed}: greedy test EM by step {evals} (weights frozen: must all be equal)")
    if warm is None:
        lines.append("no control evaluation at step 0 yet: no criterion can be computed")
        return "\n".join(lines)
    lines.append(f"warm-start greedy test EM: {level(statistics.fmean(warm))} ({len(warm)} questions)")
    lines += [
        "",
        "| arm | seed | greedy EM: warm → end | gain [95 % CI] | McNemar p (lost / gained) | G1 | d(sampled reward) vs control | Δ probe train / held-out | min |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    gains: dict[str, list[dict[str, Any]]] = {}
    for arm in [a for a in (*RL_ARMS, SFT_ARM) if a in by_arm] + sorted(
        a for a in by_arm if a not in (*RL_ARMS, SFT_ARM, CONTROL)
    ):
        for seed, s in sorted(by_arm[arm].items()):
            end = final_vector(s)
            if end is None or len(end) != len(warm):
                continue
            g = paired(warm, end) | {"seed": seed}
            g["g1"] = g["mean"] >= G1_GAIN and g["lo"] > 0 and g["p"] < G1_P
            gains.setdefault(arm, []).append(g)
            c = controls.get(seed)
            d = paired_gain(s, c) if c and arm != SFT_ARM else {"mean": None}
            probes = probe_change(s) if arm != SFT_ARM else {k: None for k in learn_report.PROBES}
            pr = list(probes.values())
            lines.append(
                f"| {arm} | {seed} | {level(statistics.fmean(warm))} → {level(statistics.fmean(end))} "
                f"| {fmt(g['mean'])} [{fmt(g['lo'])}, {fmt(g['hi'])}] | {g['p']:.2g} ({g['lost']} / {g['gained']}) "
                f"| {'✓' if g['g1'] and arm in RL_ARMS else '✗' if arm in RL_ARMS else '·'} | {fmt(d['mean'])} "
                f"| {fmt(pr[0])} / {fmt(pr[1])} | {level((s['wall_s'] or 0) / 60, 1)} |"
            )
    verdicts: list[str] = []
    best: tuple[float, str] | None = None
    for arm in RL_ARMS:
        gs = gains.get(arm, [])
        if not gs:
            continue
        met = sum(g["g1"] for g in gs)
        mean = statistics.fmean(g["mean"] for g in gs)
        verdicts.append(
            f"{arm}: G1 {_seed_verdict(met, len(gs), seeds)} ({met} of {len(gs)} seeds; mean gain {fmt(mean)})"
        )
        if best is None or mean > best[0]:
            best = (mean, arm)
    if best is not None:
        arm = best[1]
        verdicts.append(f"best RL arm: {arm}")
        sft = {g: s for g, s in by_arm.get(SFT_ARM, {}).items()}
        g2 = []
        for seed, s in sorted(by_arm[arm].items()):
            a, b = (final_vector(sft[seed]) if seed in sft else None), final_vector(s)
            if a is None or b is None or len(a) != len(b):
                continue
            r = paired(a, b)
            g2.append(r["lo"] > 0)
            verdicts.append(
                f"  G2 s{seed}: {arm} − sft {fmt(r['mean'])} [{fmt(r['lo'])}, {fmt(r['hi'])}] {'✓' if r['lo'] > 0 else '✗'}"
            )
        verdicts.append(f"{arm}: G2 {_seed_verdict(sum(g2), len(g2), seeds)} ({sum(g2)} of {len(g2)} seeds)")
        verdicts += flip_table(folder, warm, [final_vector(s) for s in by_arm[arm].values()], arm)
    lines += ["", "verdict:", *("  " + v for v in verdicts)]
    return "\n".join(lines)


def flip_table(folder: Path, warm: list[int], ends: Sequence[list[int] | None], arm: str) -> list[str]:
    """G3: questions gained and lost against the warm-start, pooled over seeds, by kind and by the warm-start's
    failure stage (where the headroom records have it)."""
    questions = first_test_questions(len(warm))
    ids, kinds = [q.id for q in questions], [q.kind for q in questions]
    records = headroom_records(folder)
    gained: Counter[str] = Counter()
    lost: Counter[str] = Counter()
    by_stage: Counter[str] = Counter()
    solvable = {q for q, r in records.items() if any(x > 0 for v in r["samples"].values() for x in v)}
    flipped: Counter[bool] = Counter()
    seeds = 0
    for end in ends:
        if end is None or len(end) != len(warm):
            continue
        seeds += 1
        for qid, kind, w, e in zip(ids, kinds, warm, end, strict=True):
            if e > w:
                gained[kind] += 1
                if qid in records:
                    by_stage[records[qid]["stage"]] += 1
                    flipped[qid in solvable] += 1
            elif e < w:
                lost[kind] += 1
    net = {k: gained[k] - lost[k] for k in KINDS}
    total = sum(net.values())
    out = ["flips against the warm-start, pooled over seeds (gained / lost / net):"]
    out += [f"  {k}: {gained[k]} / {lost[k]} / {net[k]:+d}" for k in KINDS]
    if records:
        out.append(
            "  gained questions among the first "
            f"{len(records)}, by the warm-start's failure stage: "
            + ", ".join(f"{s} {by_stage[s]}" for s in STAGES)
        )
        wrong = sum(1 for q in solvable if records[q]["greedy"] == 0)
        out.append(
            f"  of those, {flipped[True]} were solved by some sample of the warm-start ({seeds} seeds x its {wrong} "
            f"solvable greedy-wrong questions: {seeds * wrong}), {flipped[False]} by none of its samples"
        )
    met = total > 0 and net["bridge"] >= total / 2 and net["bridge"] == max(net.values())
    out.append(f"{arm}: G3 {'MET' if met else 'NOT MET'} (bridge {net['bridge']:+d} of net {total:+d})")
    return out
