"""``searchgym plot``: the training curves of one or more runs, overlaid, in six panels."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

COMMAND = ("plot",)
HELP = (
    "plot runs' training curves in six panels: reward/EM, probe likelihood, LLD by advantage sign, gradient "
    "norm, entropy, searches"
)

FIGURE_TITLE = "training curves per GRPO step"
"""The figure's title when none is given (each panel names its own metrics)."""
WARM_START = "; warm-start EM (dashed)"
"""Added to the first panel's title when a warm-start EM line is drawn there."""

# (title, metric keys drawn in the panel, one line style each; legend names of the keys; log scale)
PANELS: list[tuple[str, tuple[str, ...], tuple[str, ...], bool]] = [
    ("rollout reward; test EM (dots)", ("rollout/reward", "eval/em"), (), False),
    (
        "probe set: log-lik. per token, by action",
        ("lld/probe_logp", "lld/probe_logp_first", "lld/probe_logp_search", "lld/probe_logp_answer"),
        ("all", "first", "search", "answer"),
        False,
    ),
    (
        "LLD: Δ log π of the step's own responses",
        ("lld/delta_adv_pos", "lld/delta_adv_zero", "lld/delta_adv_neg"),
        ("A > 0", "A = 0", "A < 0"),
        False,
    ),
    ("gradient norm: max (solid) / mean per update", ("train/grad_norm_max", "train/grad_norm"), (), True),
    ("entropy", ("train/entropy",), (), False),
    ("searches per episode", ("rollout/searches",), (), False),
]
STYLES = ("-", "--", ":", "-.")
"""Line style of a panel's 1st, 2nd, … metric."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders holding metrics.jsonl")
    parser.add_argument(
        "--out",
        default=None,
        help="PNG path (default: curves.png in the first run's folder, FIRST_RUN_DIR/curves.png)",
    )
    parser.add_argument(
        "--labels",
        nargs="+",
        default=None,
        help="one label per run (default: the folder name); runs sharing a label share a colour (seeds)",
    )
    parser.add_argument("--smooth", type=int, default=1, help="moving-average window, in steps")
    parser.add_argument("--title", default=None, help=f"figure title (default: {FIGURE_TITLE!r})")
    parser.add_argument(
        "--warm-start-em",
        type=float,
        default=None,
        help="the warm-start's test EM, drawn as a grey dashed line in the first panel (for runs trained "
        "with --no-eval-at-start; a run evaluated at step 0 draws its own line)",
    )


def _smooth(values: list[float], window: int) -> list[float]:
    import numpy as np

    if window <= 1 or len(values) < window:
        return values
    arr = np.asarray(values, dtype=float)
    kernel = np.ones(window) / window
    # Valid part of the convolution, left-padded with the running mean so lengths match.
    head = [float(np.nanmean(arr[: i + 1])) for i in range(window - 1)]
    return head + list(np.convolve(arr, kernel, mode="valid"))


def _plain_values(ax: Any) -> None:
    """Ticks in the data's own values: no offset (``1e-17 + 2.3`` for a flat curve carrying float noise),
    and a curve flat to rounding drawn mid-panel on a readable range instead of a magnified noise band."""
    import numpy as np

    ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    lines = ax.get_lines()
    if not lines:
        return
    ys = np.concatenate([np.asarray(line.get_ydata(), dtype=float) for line in lines])
    ys = ys[np.isfinite(ys)]
    if ys.size == 0:
        return
    low, high = float(ys.min()), float(ys.max())
    centre = (low + high) / 2
    if high - low <= 1e-9 * max(1.0, abs(centre)):
        pad = max(0.05 * abs(centre), 0.05)
        ax.set_ylim(centre - pad, centre + pad)


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pairs = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in pairs], [float(p[1]) for p in pairs]


def run(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    from searchgym.agents.training.metrics import read_metrics
    from searchgym.errors import ConfigError

    labels = args.labels or [Path(r).name for r in args.runs]
    if len(labels) != len(args.runs):
        raise ConfigError(f"--labels needs one label per run ({len(args.runs)}), got {len(labels)}")
    runs = []
    for path in args.runs:
        metrics = Path(path) / "metrics.jsonl"
        if not metrics.is_file():
            raise ConfigError(f"{path} has no metrics.jsonl; is it a run folder?")
        runs.append(read_metrics(metrics))
    fig = draw(runs, labels, smooth=args.smooth, title=args.title, warm_start_em=args.warm_start_em)
    out = Path(args.out) if args.out else Path(args.runs[0]) / "curves.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=72)
    plt.close(fig)
    where = "" if args.out else " (the first run's folder; --out PATH writes elsewhere)"
    print(f"wrote {out}{where}")
    return 0


def draw(
    runs: list[list[dict[str, Any]]],
    labels: list[str],
    *,
    smooth: int = 1,
    title: str | None = None,
    warm_start_em: float | None = None,
) -> Any:
    """The figure of :data:`PANELS` for runs' metric records (one list per run), one colour per label.

    Few points get markers (a one-step run still shows), step axes have integer ticks, and the warm-start's
    EM is a dashed level line in the first panel: a run's own step-0 evaluation in its colour, and
    ``warm_start_em`` (known from elsewhere, e.g. the SFT run) in grey. The first panel's title names that
    line only when one is drawn.
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    colours = {label: f"C{i % 10}" for i, label in enumerate(dict.fromkeys(labels))}
    fig, axes = plt.subplots(2, 3, figsize=(14, 7))
    for ax, (panel_title, keys, names, log) in zip(axes.flat, PANELS, strict=True):
        seen: set[str] = set()
        warm_line = False
        for records, label in zip(runs, labels, strict=True):
            colour = colours[label]
            for j, key in enumerate(keys):
                x, y = _series(records, key)
                if not x:
                    continue
                legend = label if (label not in seen and j == 0) else None
                if key.startswith("eval/"):  # evaluated rarely: points, not a line
                    ax.plot(x, y, "o", color=colour, markersize=4, label=legend)
                    if x[0] == 0:  # the initial policy (the warm-start), evaluated as step 0
                        ax.axhline(y[0], color=colour, ls="--", lw=0.8, alpha=0.6)
                        warm_line = True
                else:
                    ys = _smooth(y, smooth)
                    marker = "o" if len(x) <= 12 else None  # single or few points stay visible
                    ax.plot(
                        x,
                        ys,
                        STYLES[j % len(STYLES)],
                        color=colour,
                        lw=1.0,
                        alpha=0.8,
                        label=legend,
                        marker=marker,
                        markersize=3,
                    )
                if legend:
                    seen.add(label)
        if "eval/em" in keys and warm_start_em is not None:
            ax.axhline(warm_start_em, color="0.4", ls="--", lw=0.8)
            warm_line = True
        if names:  # which line style is which metric
            proxies = [Line2D([], [], color="0.3", ls=STYLES[j], lw=1) for j in range(len(names))]
            ax.legend(proxies, names, fontsize=7, loc="best", framealpha=0.6)
        if keys[0].startswith("lld/delta"):
            ax.axhline(0.0, color="k", lw=0.6)
        if log and ax.has_data():
            ax.set_yscale("log")
        elif ax.has_data():
            _plain_values(ax)
        ax.set_title(panel_title + (WARM_START if warm_line else ""), fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        lo, hi = ax.get_xlim()
        if hi - lo < 2:  # one step: widen, or the integer locator falls back to fractional ticks
            ax.set_xlim((lo + hi) / 2 - 1, (lo + hi) / 2 + 1)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    handles, _ = axes.flat[0].get_legend_handles_labels()
    for label in colours:  # one legend entry per label, even when its runs miss the first panel's keys
        if label not in {h.get_label() for h in handles}:
            handles.append(Line2D([], [], color=colours[label], label=label))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=8)
    fig.suptitle(title or FIGURE_TITLE, fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    return fig
