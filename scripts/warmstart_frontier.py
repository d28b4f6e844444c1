"""The warm-start recipe's frontier (docs/experiments/warmstart.md): greedy test EM against wall minutes.

    python scripts/warmstart_frontier.py docs/experiments/warmstart [--plot docs/experiments/warmstart_frontier.png]

Reads every frontier point (``e*.json``: one ``searchgym warmstart`` run each, written beside the page) and
prints the page's table — point, lever, options that differ from the recipe's defaults, updates, wall
minutes, greedy test EM with its 95 % interval — sorted by point; ``--plot`` draws EM (with the interval)
against wall minutes, one colour per lever.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from searchgym.app.cli.warmstart import RECIPES


def load_points(folder: Path) -> list[dict[str, Any]]:
    """The frontier points in ``folder``, by number (``e2`` before ``e10``)."""
    points = [json.loads(p.read_text(encoding="utf-8")) for p in folder.glob("e*.json")]

    def number(point: dict[str, Any]) -> int:
        found = re.match(r"e(\d+)", point["point"])
        return int(found[1]) if found else 0

    return sorted(points, key=number)


def changed(options: dict[str, Any]) -> str:
    """The options of a point that differ from the ``headroom`` recipe's defaults, in words."""
    default = vars(RECIPES["headroom"])
    parts = [f"{k.replace('_', ' ')} {v}" for k, v in options.items() if default.get(k) != v]
    return ", ".join(parts) or "the recipe's defaults"


def table(points: list[dict[str, Any]]) -> str:
    """The markdown table of the points."""
    lines = [
        "| point | lever | options (vs the recipe) | updates | wall | greedy test EM [95 %] | questions |",
        "| --- | --- | --- | ---: | ---: | --- | ---: |",
    ]
    for p in points:
        test = p["test"]
        lo, hi = test["em_95ci"]
        lines.append(
            f"| {p['point'].split('_')[0]} | {p['lever']} | {changed(p['options'])} | {p['updates']} | "
            f"{p['wall_s'] / 60:.1f} min | {test['greedy_em']:.3f} [{lo:.3f}, {hi:.3f}] | {test['questions']} |"
        )
    return "\n".join(lines)


def plot(points: list[dict[str, Any]], out: Path) -> None:
    """Greedy test EM against wall minutes, one colour per lever, each point named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levers = sorted({p["lever"] for p in points})
    colours = {lever: plt.get_cmap("tab10")(i % 10) for i, lever in enumerate(levers)}
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for lever in levers:
        mine = [p for p in points if p["lever"] == lever]
        x = [p["wall_s"] / 60 for p in mine]
        y = [p["test"]["greedy_em"] for p in mine]
        err = [
            [p["test"]["greedy_em"] - p["test"]["em_95ci"][0] for p in mine],
            [p["test"]["em_95ci"][1] - p["test"]["greedy_em"] for p in mine],
        ]
        ax.errorbar(x, y, yerr=err, fmt="o", capsize=3, color=colours[lever], label=lever)
        for p, xi, yi in zip(mine, x, y, strict=True):
            ax.annotate(
                p["point"].split("_")[0], (xi, yi), textcoords="offset points", xytext=(5, 4), fontsize=8
            )
    ax.axhspan(0.40, 0.60, color="green", alpha=0.08, label="target EM 0.40-0.60")
    ax.axvline(6.0, color="grey", linestyle="--", linewidth=1, label="6 min")
    ax.set_xlabel("wall minutes (demonstrations and SFT; one thread unless the point says otherwise)")
    ax.set_ylabel("greedy test EM (first 300 test questions)")
    ax.set_title("searchgym warmstart --recipe headroom: the frontier, seed 0")
    ax.set_ylim(0, 0.7)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the folder of frontier points (e*.json)")
    parser.add_argument("--plot", type=Path, default=None, help="also draw the frontier into this PNG")
    args = parser.parse_args(argv)
    points = load_points(args.folder)
    if not points:
        print(f"no frontier points (e*.json) in {args.folder}", file=sys.stderr)
        return 1
    print(table(points))
    if args.plot is not None:
        plot(points, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
