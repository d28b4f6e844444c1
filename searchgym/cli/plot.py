"""``searchgym plot``: the three-phase view of one or more training runs, overlaid."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

COMMAND = ("plot",)
HELP = "plot reward/EM, likelihood of correct responses, gradient norm, entropy and searches of runs"

# (title, metric keys drawn in the panel: the first solid, the second dashed)
PANELS: list[tuple[str, tuple[str, ...]]] = [
    ("reward (solid) / test EM (dots)", ("rollout/reward", "eval/em")),
    ("log-lik. of correct responses / token", ("lld/logp_token_correct",)),
    ("displacement of correct responses / token", ("lld/displacement",)),
    ("gradient norm", ("train/grad_norm",)),
    ("entropy", ("train/entropy",)),
    ("searches per episode", ("rollout/searches",)),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders holding metrics.jsonl")
    parser.add_argument("--out", default=None, help="PNG path (default: FIRST_RUN_DIR/curves.png)")
    parser.add_argument(
        "--labels",
        nargs="+",
        default=None,
        help="one label per run (default: the folder name); runs sharing a label share a colour (seeds)",
    )
    parser.add_argument("--smooth", type=int, default=1, help="moving-average window, in steps")
    parser.add_argument("--title", default=None, help="figure title")


def _smooth(values: list[float], window: int) -> list[float]:
    import numpy as np

    if window <= 1 or len(values) < window:
        return values
    arr = np.asarray(values, dtype=float)
    kernel = np.ones(window) / window
    # Valid part of the convolution, left-padded with the running mean so lengths match.
    head = [float(np.nanmean(arr[: i + 1])) for i in range(window - 1)]
    return head + list(np.convolve(arr, kernel, mode="valid"))


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pairs = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in pairs], [float(p[1]) for p in pairs]


def run(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    from searchgym.errors import ConfigError

    labels = args.labels or [Path(r).name for r in args.runs]
    if len(labels) != len(args.runs):
        raise ConfigError(f"--labels needs one label per run ({len(args.runs)}), got {len(labels)}")
    runs = []
    for path in args.runs:
        metrics = Path(path) / "metrics.jsonl"
        if not metrics.is_file():
            raise ConfigError(f"{path} has no metrics.jsonl; is it a run folder?")
        from searchgym.agents.grpo.runtime import read_metrics

        runs.append(read_metrics(metrics))
    colours = {label: f"C{i % 10}" for i, label in enumerate(dict.fromkeys(labels))}
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    for ax, (title, keys) in zip(axes.flat, PANELS, strict=True):
        seen: set[str] = set()
        for records, label in zip(runs, labels, strict=True):
            for j, key in enumerate(keys):
                x, y = _series(records, key)
                if not x:
                    continue
                legend = label if (label not in seen and j == 0) else None
                if key.startswith("eval/"):  # evaluated rarely: points, not a line
                    ax.plot(x, y, "o", color=colours[label], markersize=4, label=legend)
                else:
                    ax.plot(x, _smooth(y, args.smooth), color=colours[label], lw=1.0, alpha=0.8, label=legend)
                if legend:
                    seen.add(label)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    handles, names = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="lower center", ncol=min(len(names), 6), fontsize=8)
    if args.title:
        fig.suptitle(args.title, fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    out = Path(args.out) if args.out else Path(args.runs[0]) / "curves.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=72)
    plt.close(fig)
    print(f"wrote {out}")
    return 0
