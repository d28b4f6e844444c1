"""``searchgym plot``: what the figure shows for short runs (markers, integer steps, the warm-start line)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from searchgym.app.cli import main
from searchgym.app.cli.plot import FIGURE_TITLE, PANELS, WARM_START, draw


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
    assert ax.get_title() == PANELS[0][0] + WARM_START
    plt.close(fig)
    no_start = draw([[record(1, **{"eval/em": 0.5})]], ["run"])  # evaluated only later: no level line
    assert not [ln for ln in no_start.axes[0].get_lines() if ln.get_linestyle() == "--"]
    assert "warm-start" not in no_start.axes[0].get_title()  # and no promise of one
    plt.close(no_start)


def dashed_levels(ax: plt.Axes) -> list[list[float]]:
    return [list(ln.get_ydata()) for ln in ax.get_lines() if ln.get_linestyle() == "--"]


def test_a_known_warm_start_em_is_drawn_when_the_runs_evaluate_only_at_the_end() -> None:
    """The demo's case: its GRPO runs skip the step-0 evaluation, the SFT run measured the same EM."""
    runs = [
        [record(1, **{"rollout/reward": 0.1}), record(2, **{"rollout/reward": 0.2, "eval/em": 0.5})],
        [record(1, **{"rollout/reward": 0.3}), record(2, **{"rollout/reward": 0.1, "eval/em": 0.25})],
    ]
    fig = draw(runs, ["GRPO", "GRPO+LLDS"], warm_start_em=0.04)
    first = fig.axes[0]
    assert dashed_levels(first) == [[0.04, 0.04]]
    assert first.get_title() == PANELS[0][0] + WARM_START
    assert all(not dashed_levels(ax) for ax in fig.axes[1:6])  # only the EM panel gets it
    plt.close(fig)


def test_the_figure_title_names_the_figure_and_each_panel_its_own() -> None:
    runs = [[record(1, **{"rollout/reward": 0.5, "rollout/searches": 1.0})]]
    fig = draw(runs, ["run"])
    assert fig._suptitle.get_text() == FIGURE_TITLE  # not the last panel's title ("searches per episode")
    assert [ax.get_title() for ax in fig.axes[:6]] == [title for title, *_ in PANELS]
    plt.close(fig)
    fig = draw(runs, ["run"], title="searchgym demo: GRPO vs GRPO+LLDS")
    assert fig._suptitle.get_text() == "searchgym demo: GRPO vs GRPO+LLDS"
    assert fig.axes[5].get_title() == "searches per episode"
    plt.close(fig)


def test_plot_command_writes_the_png(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "rollout/reward": 0.5}\n')
    assert main(["plot", str(run), "--out", str(tmp_path / "c.png"), "--warm-start-em", "0.1"]) == 0
    assert (tmp_path / "c.png").stat().st_size > 1000
    assert main(["plot", str(tmp_path)]) == 2  # not a run folder: a clear error, not a traceback


def test_a_flat_curve_shows_its_value_without_an_offset() -> None:
    """A curve flat to float rounding (Δ log π of 0 ± 1e-17 on a step with no update) reads 0 on its axis,
    not ticks of 1e-17 magnifying the noise."""
    noise = [0.0, 1e-17, -2e-17, 3e-17]
    runs = [
        [
            record(i + 1, **{"lld/delta_adv_zero": v, "train/entropy": 2.3 + v * 10})
            for i, v in enumerate(noise)
        ]
    ]
    fig = draw(runs, ["run"])
    fig.canvas.draw()
    for ax, value in ((fig.axes[2], 0.0), (fig.axes[4], 2.3)):
        low, high = ax.get_ylim()
        assert low < value < high and high - low > 0.01, (low, high)
        assert ax.yaxis.get_offset_text().get_text() == ""
        labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
        assert labels and not any("e" in label for label in labels), labels
    plt.close(fig)


def test_plot_says_where_it_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        run.mkdir()
        (run / "metrics.jsonl").write_text('{"step": 1, "rollout/reward": 0.5}\n')
    assert main(["plot", *map(str, runs)]) == 0
    assert capsys.readouterr().out.strip() == (
        f"wrote {runs[0] / 'curves.png'} (the first run's folder; --out PATH writes elsewhere)"
    )
    assert (runs[0] / "curves.png").is_file()


@pytest.mark.parametrize(
    "bad",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"step": 1, "rollout/reward": "abc"}',
        '{"step": 1, "rollout/reward": [1]}',
    ],
    ids=["nested", "string-value", "list-value"],
)
def test_a_bad_metrics_line_is_one_typed_line_in_plot_and_on_resume(
    tmp_path: Path, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from searchgym.agents.training.metrics import MetricLogger
    from searchgym.errors import DataFormatError

    run = tmp_path / "run"
    run.mkdir()
    good = [json.dumps({"step": s, "rollout/reward": 1.0 / (s + 1)}) for s in (0, 2)]
    (run / "metrics.jsonl").write_text(f"{good[0]}\n{bad}\n{good[1]}\n")
    assert main(["plot", str(run), "--out", str(tmp_path / "curves.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "metrics.jsonl:2" in err
    with pytest.raises(DataFormatError, match=r"metrics\.jsonl:2"):
        MetricLogger(run, resume_step=2, tensorboard=False)
