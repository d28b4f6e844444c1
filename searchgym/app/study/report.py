"""A study's report from its summaries: what ran, every definition per run, every warning signal's onset and
lead, the verdict per criterion, and the figure."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from searchgym.errors import ConfigError

from .criteria import CRITERION_KINDS, Verdict
from .protocol import Protocol
from .rules import EVAL_EM, RunView, level
from .summary import KIND_CODES, STAGE_CODES, em_vector, eval_series, load_summaries, series

__all__ = ["Judge", "plot", "report"]


class Judge:
    """A protocol's definitions and criteria over one set of summaries (``{arm: {seed: summary}}``)."""

    def __init__(self, protocol: Protocol, summaries: dict[str, dict[int, dict[str, Any]]]) -> None:
        self.protocol = protocol
        self.summaries = summaries
        self.seeds = protocol.seeds
        self.definitions = protocol.all_definitions()
        self._views: dict[tuple[str, int], RunView | None] = {}

    def arms_of(self, names: Sequence[str]) -> list[str]:
        """Arm names, ``"trained"`` standing for every arm but the control, in the protocol's order."""
        wanted = set(names)
        trained = "trained" in wanted
        return [a for a in self.protocol.arms if a in wanted or (trained and a != self.protocol.control)]

    def view(self, arm: str, seed: int) -> RunView | None:
        """The run of ``arm`` and ``seed``; ``None`` until its summary (and its control's) is in."""
        key = (arm, seed)
        if key not in self._views:
            s = self.summaries.get(arm, {}).get(seed)
            control = self.protocol.control
            c = self.summaries.get(control, {}).get(seed) if control is not None else None
            peers = {a: by_seed[seed] for a, by_seed in self.summaries.items() if seed in by_seed}
            ready = s is not None and (control is None or c is not None)
            self._views[key] = RunView(arm, seed, s, c, peers, self.definitions) if ready else None  # type: ignore[arg-type]
        return self._views[key]

    def views(self, arm: str) -> list[RunView]:
        """The runs of ``arm`` that are in, by seed."""
        return [v for seed in self.seeds if (v := self.view(arm, seed)) is not None]

    def warmstart_vector(self) -> list[int] | None:
        """The warm-start's per-question greedy EM: the control's step-0 evaluation (else any arm's)."""
        arms = [self.protocol.control] if self.protocol.control else list(self.protocol.arms)
        for arm in arms:
            for seed in self.seeds:
                s = self.summaries.get(str(arm), {}).get(seed)
                if s is not None and (vector := em_vector(s, 0)) is not None:
                    return vector
        return None

    def verdicts(self) -> list[Verdict]:
        """Every criterion's verdict, in the protocol's order (one per arm it judges)."""
        return [v for c in self.protocol.criteria for v in CRITERION_KINDS[c.kind].evaluate(self, c)]


def _eval_steps(judge: Judge) -> list[int]:
    ev = judge.protocol.evaluation
    if ev is not None:
        return list(ev.steps)
    return sorted(
        {int(t) for by_seed in judge.summaries.values() for s in by_seed.values() for t in s["eval"]}
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---" for _ in header) + " |",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def report(protocol: Protocol, summaries_dir: Path | None = None, figure: Path | None = None) -> str:
    """The report of ``protocol`` from the summaries in ``summaries_dir`` (default: the protocol's); draws the
    figure into ``figure`` when given.

    Raises:
        ConfigError: the folder holds no summary of the protocol's arms.
    """
    folder = summaries_dir if summaries_dir is not None else protocol.summaries_dir
    found = load_summaries(folder) if folder.is_dir() else {}
    summaries = {arm: by_seed for arm, by_seed in found.items() if arm in protocol.arms}
    if not summaries:
        raise ConfigError(
            f"no summaries of {protocol.name}'s arms in {folder}: `searchgym study run {protocol.path}` writes them"
        )
    judge = Judge(protocol, summaries)
    runs = protocol.runs()
    have = [(a, s) for a, s in runs if s in summaries.get(a, {})]
    lines = [f"study {protocol.name}: {len(have)} of {len(runs)} runs summarised in {folder}"]
    missing = [f"{a} s{s}" for a, s in runs if (a, s) not in have]
    if missing:
        lines.append(f"missing: {', '.join(missing)} (criteria wait for them: undecided)")
    extra = sorted(set(found) - set(protocol.arms))
    if extra:
        lines.append(f"left out: summaries of arms the protocol does not name ({', '.join(extra)})")
    if protocol.control is not None:
        for seed, c in sorted(summaries.get(protocol.control, {}).items()):
            evals = eval_series(c)
            frozen = "all equal" if len(set(evals.values())) <= 1 else "NOT all equal"
            lines.append(
                f"control s{seed}: greedy EM by step {{{', '.join(f'{t}: {v:.4g}' for t, v in evals.items())}}} "
                f"(weights frozen: {frozen})"
            )
    lines += ["", *_runs_table(judge), "", *_signals_table(judge)]
    for arm in protocol.losses:
        lines += ["", *_losses_table(judge, arm)]
    lines += ["", "verdict:"]
    lines += ["  " + v.line() for v in judge.verdicts()] or ["  (no criteria)"]
    if figure is not None:
        plot(judge, figure)
        lines.append(f"figure: {figure}")
    return "\n".join(lines)


def lost_questions(s: dict[str, Any]) -> dict[str, Any] | None:
    """The questions a run had right at its greedy-EM peak and wrong at its end, with each one's kind and the
    stage it failed at in the end (``None`` when the summary lacks the per-question records or never fell).

    Returns:
        ``peak`` and ``end`` (steps), ``lost`` and ``gained`` (counts between them), ``by_kind`` and
        ``by_stage`` (counts of the lost questions, by letter code of :data:`.summary.KIND_CODES` and
        :data:`.summary.STAGE_CODES`).
    """
    evals = eval_series(s)
    if not evals:
        return None
    end = max(evals)
    peak = max(evals, key=lambda t: (evals[t], -t))
    if peak == end:
        return None
    a, b = s["eval"][str(peak)], s["eval"][str(end)]
    if "stage_by_question" not in b or "kind_by_question" not in b:
        return None
    was, now = a["em_by_question"], b["em_by_question"]
    lost = [i for i, (x, y) in enumerate(zip(was, now, strict=True)) if x == "1" and y == "0"]
    gained = sum(x == "0" and y == "1" for x, y in zip(was, now, strict=True))
    by_kind: dict[str, int] = {}
    by_stage: dict[str, int] = {}
    for i in lost:
        by_kind[b["kind_by_question"][i]] = by_kind.get(b["kind_by_question"][i], 0) + 1
        by_stage[b["stage_by_question"][i]] = by_stage.get(b["stage_by_question"][i], 0) + 1
    return {
        "peak": peak,
        "end": end,
        "lost": len(lost),
        "gained": gained,
        "by_kind": by_kind,
        "by_stage": by_stage,
    }


def _losses_table(judge: Judge, arm: str) -> list[str]:
    """``arm``'s questions lost between its peak and its end, per seed and pooled: by kind and by stage."""
    kinds = {code: name for name, code in KIND_CODES.items()} | {"?": "other"}
    stages = {code: name for name, code in STAGE_CODES.items()}
    header = ["seed", "peak → end", "lost / gained", *kinds.values(), *(stages[c] for c in "arm")]
    rows: list[list[str]] = []
    by_kind: dict[str, int] = {}
    by_stage: dict[str, int] = {}
    pooled: dict[str, Any] = {"lost": 0, "gained": 0, "by_kind": by_kind, "by_stage": by_stage}
    for v in judge.views(arm):
        found = lost_questions(v.summary)
        if found is None:
            rows.append(
                [
                    f"s{v.seed}",
                    "no fall, or no per-question records",
                    "–",
                    *("–" for _ in kinds),
                    "–",
                    "–",
                    "–",
                ]
            )
            continue
        pooled["lost"] += found["lost"]
        pooled["gained"] += found["gained"]
        for code, n in found["by_kind"].items():
            by_kind[code] = by_kind.get(code, 0) + n
        for code, n in found["by_stage"].items():
            by_stage[code] = by_stage.get(code, 0) + n
        rows.append(_loss_row(f"s{v.seed}", f"{found['peak']} → {found['end']}", found, kinds))
    rows.append(_loss_row("pooled", "", pooled, kinds))
    return [
        f"{arm}: questions right at the peak and wrong at the end, by kind and by the end's failure stage",
        *_table(header, rows),
    ]


def _loss_row(seed: str, steps: str, found: dict[str, Any], kinds: dict[str, str]) -> list[str]:
    return [
        seed,
        steps,
        f"{found['lost']} / {found['gained']}",
        *(str(found["by_kind"].get(c, 0)) for c in kinds),
        *(str(found["by_stage"].get(c, 0)) for c in "arm"),
    ]


def _runs_table(judge: Judge) -> list[str]:
    """Per arm and seed: each definition, greedy EM at the evaluation points, sampled test reward, minutes."""
    p = judge.protocol
    steps = _eval_steps(judge)
    header = ["arm", "seed", *p.definitions, f"greedy EM {'/'.join(map(str, steps))}", "sampled test", "min"]
    rows = []
    for arm in p.arms:
        for v in judge.views(arm):
            if arm == p.control:
                cells = ["–"] * len(p.definitions)
            else:
                cells = [v.find(name).cell for name in p.definitions]
            ems = v.values(EVAL_EM)
            sampled = (v.summary.get("sampled_test") or {}).get("sampled_reward")
            wall = v.summary.get("wall_s")
            rows.append(
                [
                    arm,
                    str(v.seed),
                    *cells,
                    " ".join(level(ems.get(t)) for t in steps),
                    level(sampled),
                    level(wall / 60 if wall is not None else None, 1),
                ]
            )
    return _table(header, rows)


def _signals_table(judge: Judge) -> list[str]:
    """Every warning signal's onset per run, and its lead (event step minus onset) where the event happened."""
    p = judge.protocol
    signals = p.report_signals()
    event = p.lead_event()
    logged = {
        name
        for name, d in signals.items()
        for by_seed in judge.summaries.values()
        for s in by_seed.values()
        if all(series(s, m) for m in d.metrics)
    }
    title = (
        f"warning signals: onset step (lead = {event} step − onset)"
        if event
        else "warning signals: onset step"
    )
    silent = [n for n in signals if n not in logged]
    if silent:
        title += f"; not logged by these runs: {', '.join(silent)}"
    names = [n for n in signals if n in logged]
    header = ["arm", "seed", *([event] if event else []), *names]
    rows = []
    for arm in p.arms:
        if arm == p.control:
            continue
        for v in judge.views(arm):
            at = v.find(event).step if event else None
            cells = []
            for name in names:
                onset = v.find(name).step
                lead = f" ({at - onset:+d})" if onset is not None and at is not None else ""
                cells.append("–" if onset is None else f"{onset}{lead}")
            rows.append([arm, str(v.seed), *([str(at) if at is not None else "–"] if event else []), *cells])
    return [title, *_table(header, rows)]


def _paired_metric(p: Protocol) -> tuple[str, int]:
    """The metric the figure pairs with the control, and its smoothing width (the protocol's own, if any)."""
    for d in p.definitions.values():
        if d.params.get("paired"):
            return str(d.params["metric"]), int(d.params.get("width", 10))
    return "rollout/sampled_reward", 10


def plot(judge: Judge, path: Path) -> None:
    """The study's figure: the paired metric (trailing mean), greedy EM at the evaluation points, the
    held-out on-policy probe against its step-0 value, and entropy; one colour per arm, one line per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = judge.protocol
    metric, width = _paired_metric(p)
    fig, axes = plt.subplots(1, 4, figsize=(20, 4))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, arm in enumerate(p.arms):
        for v in judge.views(arm):
            style = {
                "color": colours[i % len(colours)],
                "alpha": 0.8,
                "label": arm if v.seed == p.seeds[0] else None,
            }
            if p.control is not None and arm != p.control:
                d = v.values(metric, paired=True)
                smooth = {
                    t: statistics.fmean(d[s] for s in range(t - width + 1, t + 1))
                    for t in d
                    if all(s in d for s in range(t - width + 1, t + 1))
                }
                axes[0].plot(list(smooth), list(smooth.values()), **style)
            em = v.values(EVAL_EM)
            axes[1].plot(list(em), list(em.values()), marker="o", **style)
            probe = v.values("lld/probe_onpolicy_heldout")
            start = v.start("lld/probe_onpolicy_heldout")
            if start is not None:
                axes[2].plot([0, *probe], [0.0, *(x - start for x in probe.values())], **style)
            entropy = v.values("train/entropy")
            axes[3].plot(list(entropy), list(entropy.values()), **style)
    axes[0].axhline(0, color="grey", lw=0.8)
    axes[0].set_title(f"{metric} − control ({width}-step trailing mean)")
    axes[1].set_title("greedy EM")
    axes[2].set_title("held-out on-policy probe − step 0 (nat/token)")
    axes[3].set_title("entropy of the sampled tokens")
    for ax in axes:
        ax.set_xlabel("step")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"study {p.name}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
