"""``searchgym demo``: its confidence intervals, its verdict sentences, and a small-budget run end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from searchgym.app.cli.demo import demo_dir, paired_gain, row, verdict, wilson
from searchgym.errors import ConfigError


def test_the_demo_interval_is_the_one_wilson_rule() -> None:
    from searchgym import stats

    interval = stats.wilson(5, 29)
    assert wilson(5 / 29, 29) == (interval.low, interval.high)
    lo, hi = wilson(0.5, 100)
    assert lo == pytest.approx(0.4038, abs=1e-4) and hi == pytest.approx(0.5962, abs=1e-4)
    lo, hi = wilson(0.0, 200)
    assert lo == 0.0 and hi == pytest.approx(0.0188, abs=1e-4)  # never a zero-width interval at 0
    assert wilson(0.3, 0) == (0.0, 1.0)


def test_the_paired_gain_is_counted_question_by_question() -> None:
    before = {"q1": 1.0, "q2": 0.0, "q3": 0.0, "q4": 1.0}
    after = {"q4": 0.0, "q3": 1.0, "q2": 1.0, "q1": 1.0}  # order does not matter: questions pair by id
    g = paired_gain(before, after)
    assert g["gain"] == pytest.approx(0.25) and (g["lost"], g["gained"]) == (1, 2)
    # McNemar: 3 discordant questions, P[X <= 1] for X ~ Binomial(3, 1/2) is 1/2, doubled and capped at 1
    assert g["p"] == pytest.approx(1.0)
    assert g["low"] <= 0.25 <= g["high"]
    wide = paired_gain({f"q{i}": 0.0 for i in range(40)}, {f"q{i}": float(i < 20) for i in range(40)})
    assert wide["gain"] == pytest.approx(0.5) and wide["low"] > 0.3 and wide["p"] < 1e-5
    with pytest.raises(ValueError, match="same questions"):
        paired_gain(before, {"q1": 1.0, "q2": 0.0, "q3": 0.0, "q5": 1.0})


def test_the_verdict_follows_the_paired_interval() -> None:
    base = {f"q{i}": float(i < 10) for i in range(50)}
    better = {q: float(i < 30) for i, q in enumerate(base)}
    rows = [
        row("warm-start", {"metrics": {}, "outcomes": base}, None, 60.0),
        row("GRPO", {"metrics": {}, "outcomes": better}, base, 1.0),
        row("same", {"metrics": {}, "outcomes": dict(base)}, base, 1.0),
        row("worse", {"metrics": {}, "outcomes": {q: 0.0 for q in base}}, base, 1.0),
    ]
    assert rows[0]["test_em"] == pytest.approx(0.2) and "gain" not in rows[0]
    assert rows[1]["gain"] == "+0.400" and rows[1]["lost/gained"] == "0/20"
    lines = verdict(rows)
    assert len(lines) == 3
    assert lines[0].startswith("GRPO: greedy test EM +0.400 [") and "beyond the paired interval" in lines[0]
    assert "on the same 50 questions (20 gained, 0 lost" in lines[0]
    assert "the interval holds 0" in lines[1]
    assert lines[2].startswith("worse: greedy test EM -0.200") and "worse, beyond" in lines[2]


def _outcomes(path: Path, step: int) -> dict[str, float]:
    records = [json.loads(line) for line in path.open()]
    return {r["question_id"]: r["em"] for r in records if r["step"] == step}


@pytest.mark.slow
def test_demo_runs_end_to_end_on_a_small_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    from searchgym.app.cli import main, plot

    drawn: list[dict[str, Any]] = []
    draw = plot.draw

    def recording_draw(*args: Any, **kwargs: Any) -> Any:
        drawn.append(kwargs)
        return draw(*args, **kwargs)

    monkeypatch.setattr(plot, "draw", recording_draw)
    # played from a folder with no ../shared beside it: the demo needs nothing but the package
    work = tmp_path / "clone"
    work.mkdir()
    monkeypatch.chdir(work)
    args = ["demo", "--threads", "1", "--warmstart-layers", "1", "--warmstart-hidden", "32"]
    args += ["--warmstart-epochs", "1", "--warmstart-batch-size", "4", "--demos-per-world", "12"]
    args += ["--grpo-steps", "1", "--questions-per-step", "2", "--eval-questions", "6"]
    assert main([*args, "--headroom-questions", "4", "--headroom-samples", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    root = work / "runs" / "demo"
    assert f"demo runs go to {Path('runs/demo')}/; the world: the generated world (seed 0), 1 passage" in out
    assert "em_95ci" in out and "mcnemar_p" in out and "GRPO+LLDS (action)" in out
    assert "docs/experiments/learn2.md" in out and "docs/experiments/warmstart.md" in out
    # every paired figure is recomputed from the per-question outcomes the runs wrote
    summary = json.loads((root / "summary.json").read_text())
    warm = _outcomes(root / "warmstart" / "eval_episodes.jsonl", 0)
    assert len(warm) == 6 and summary["rows"][0]["test_em"] == pytest.approx(sum(warm.values()) / 6)
    for r, folder in zip(summary["rows"][1:], ("grpo", "grpo_llds"), strict=True):
        after = _outcomes(root / folder / "eval_episodes.jsonl", 1)
        assert set(after) == set(warm)
        assert r["paired"]["gain"] == pytest.approx(sum(after.values()) / 6 - sum(warm.values()) / 6)
        gained = sum(after[q] > warm[q] for q in warm)
        assert r["paired"]["gained"] == gained and r["lost/gained"].endswith(f"/{gained}")
        assert f"{r['model']}: greedy test EM {r['paired']['gain']:+.3f}" in out
    headroom = re.search(
        r"Headroom at the warm-start \((\d+) test questions, 2 samples at T 1\): greedy EM ([0-9.]+)", out
    )
    assert headroom is not None and headroom.group(1) == "4"
    # The headroom line measures the warm-start itself: `bench headroom` on the same checkpoint and questions
    # (the command the demo prints) gives the same figures.
    command = re.search(r"\(searchgym bench headroom (.+)\)", out)
    assert command is not None and str(Path("runs/demo/warmstart/checkpoint.pt")) in command.group(1)
    assert main(["bench", "headroom", *command.group(1).split(), "--json", "--no-progress"]) == 0
    bench = json.loads(capsys.readouterr().out)
    demo = json.loads((root / "headroom.json").read_text())
    keys = (
        "questions",
        "greedy_em",
        "pass_at_k",
        "solvable_given_greedy_wrong",
        "greedy_gain_bound",
        "by_kind",
    )
    assert {k: demo[k] for k in keys} == {k: bench[k] for k in keys}
    assert headroom.group(2) == f"{bench['greedy_em']:.3f}"
    # and the warm-start's greedy EM on those questions is what the demo's own evaluation scored on them
    firsts = [json.loads(line) for line in (root / "warmstart" / "eval_episodes.jsonl").open()][:4]
    assert bench["greedy_em"] == pytest.approx(sum(e["em"] for e in firsts) / 4)
    assert (root / "curves.png").stat().st_size > 10_000
    # The GRPO runs skip their step-0 evaluation: the figure gets the warm-start's EM as its line.
    assert [d["warm_start_em"] for d in drawn] == [summary["rows"][0]["test_em"]]
    assert drawn[0]["title"].startswith("searchgym demo: GRPO vs GRPO+LLDS")
    assert (root / "grpo" / "metrics.jsonl").is_file() and (root / "grpo_llds" / "checkpoint.pt").is_file()
    assert summary["machine"]["cores"] and summary["grpo"]["steps"] == 1


def test_a_second_demo_never_replaces_the_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert demo_dir(None, False) == Path("runs/demo")
    (tmp_path / "runs" / "demo").mkdir(parents=True)
    assert demo_dir(None, False) == Path("runs/demo")  # an empty folder holds nothing to lose
    (tmp_path / "runs" / "demo" / "demos.jsonl").write_text("{}\n")
    assert demo_dir(None, False) == Path("runs/demo-2")
    (tmp_path / "runs" / "demo-2").mkdir()
    (tmp_path / "runs" / "demo-2" / "sft").mkdir()
    assert demo_dir(None, False) == Path("runs/demo-3")
    with pytest.raises(ConfigError, match="--overwrite"):
        demo_dir("runs/demo", False)
    assert demo_dir("runs/demo", True) == Path("runs/demo")


def test_the_demo_names_its_recipe_options_in_its_refusals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from searchgym.app.cli import main

    run_dir = tmp_path / "demo"
    assert main(["demo", "--run-dir", str(run_dir), "--warmstart-lr-schedule", "cosine"]) != 0
    err = capsys.readouterr().err
    assert err == "searchgym: error: --warmstart-lr-schedule must be constant or linear, got 'cosine'\n"
    assert not run_dir.exists()  # nothing written
