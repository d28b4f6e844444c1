"""``searchgym plot``: what the figure shows for short runs (markers, integer steps, the warm-start line)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from searchgym.cli import main
from searchgym.cli.plot import draw


def record(step: int, **metrics: float) -> dict[str, float]:
    return {"step": step, **metrics}


def test_a_one_step_run_is_drawn_with_markers_and_integer_steps() -> None:
    fig = draw([[record(1, **{"rollout/reward": 0.5, "train/entropy": 2.0})]], ["run"])
    reward, entropy = fig.axes[0], fig.axes[4]
    for ax in (reward, entropy):
        (line,) = ax.get_lines()
        assert line.get_marker() == "o" and list(line.get_xdata()) == [1]  # one point, visible
    fig.canvas.draw()
    ticks = [t for t in reward.get_xticks() if reward.get_xlim()[0] <= t <= reward.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)  # steps, not 0.8, 1.0, 1.2
    plt.close(fig)


def test_the_warm_start_evaluation_is_a_level_line() -> None:
    runs = [
        [record(0, **{"eval/em": 0.25}), record(1, **{"rollout/reward": 0.1}), record(2, **{"eval/em": 0.5})]
    ]
    fig = draw(runs, ["run"])
    ax = fig.axes[0]
    levels = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert len(levels) == 1 and list(levels[0].get_ydata()) == [0.25, 0.25]
    points = [ln for ln in ax.get_lines() if ln.get_marker() == "o" and ln.get_linestyle() == "None"]
    assert [list(p.get_xdata()) for p in points] == [[0, 2]]
    plt.close(fig)
    no_start = draw([[record(1, **{"eval/em": 0.5})]], ["run"])  # evaluated only later: no level line
    assert not [ln for ln in no_start.axes[0].get_lines() if ln.get_linestyle() == "--"]
    plt.close(no_start)


def test_plot_command_writes_the_png(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "rollout/reward": 0.5}\n')
    assert main(["plot", str(run), "--out", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").stat().st_size > 1000
    assert main(["plot", str(tmp_path)]) == 2  # not a run folder: a clear error, not a traceback
