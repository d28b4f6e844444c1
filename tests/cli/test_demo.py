"""``searchgym demo``: its confidence intervals, its verdict sentences, and a small-budget run end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from searchgym.cli.demo import demo_dir, protocol_sentence, verdict, wilson
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


def row(name: str, em: float, answered: float = 1.0, n: int = 200) -> dict[str, object]:
    return {"model": name, "test_em": em, "answered": answered, "n": n}


def test_the_protocol_sentence_follows_the_numbers() -> None:
    untrained = {"answered": 0.0, "searches": 0.0, "test_em": 0.0}
    taught = {"answered": 1.0, "searches": 1.47, "test_em": 0.045}
    assert protocol_sentence(untrained, taught) == (
        "SFT taught the protocol: episodes ending with an answer 0% -> 100%, searches per episode 0.00 -> 1.47, "
        "test EM 0.000 -> 0.045."
    )
    silent = {"answered": 0.0, "searches": 0.0, "test_em": 0.0}
    assert protocol_sentence(untrained, silent).startswith("SFT did not teach the protocol: ")
    no_search = {"answered": 1.0, "searches": 0.0, "test_em": 0.0}
    assert protocol_sentence(untrained, no_search).startswith("SFT did not teach the protocol: ")


def test_verdict_says_when_the_budget_cannot_separate_runs() -> None:
    lines = verdict([row("SFT", 0.035), row("GRPO", 0.015, answered=0.175), row("GRPO+LLDS", 0.60)])
    assert "GRPO: test EM -0.020" in lines[0] and "cannot tell them apart" in lines[0]
    assert lines[1] == "GRPO: answered share -0.825 vs the warm-start — lower, beyond the 95% intervals."
    assert "GRPO+LLDS: test EM +0.565" in lines[2] and "higher, beyond the 95% intervals" in lines[2]
    assert len(lines) == 3  # an unchanged answered share is not worth a line


@pytest.mark.slow
def test_demo_runs_end_to_end_on_a_small_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    from searchgym.agents.training.metrics import read_metrics
    from searchgym.cli import main, plot

    drawn: list[dict[str, Any]] = []
    draw = plot.draw

    def recording_draw(*args: Any, **kwargs: Any) -> Any:
        drawn.append(kwargs)
        return draw(*args, **kwargs)

    monkeypatch.setattr(plot, "draw", recording_draw)

    args = [
        "demo",
        "--run-dir",
        str(tmp_path),
        "--threads",
        "1",
        "--extra-worlds",
        "0",
        "--demos-per-world",
        "12",
    ]
    args += ["--sft-epochs", "1", "--layers", "1", "--grpo-steps", "1", "--questions-per-step", "2"]
    assert main([*args, "--eval-questions", "4", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert (
        "em_95ci" in out
        and re.search(r"^SFT (taught|did not teach) the protocol: ", out, flags=re.MULTILINE)
        and "untrained tiny model" in out
        and "GRPO+LLDS (action)" in out
        and "docs/experiments/learn2.md" in out
        and "docs/experiments/lld3.md" in out
    )
    headroom = re.search(
        r"Headroom at the warm-start \((\d+) test questions, 4 samples at T 1\): greedy EM ([0-9.]+)", out
    )
    assert headroom is not None and headroom.group(1) == "4"
    # The headroom line measures the warm-start itself: `bench headroom` on the same checkpoint and questions
    # (the command the demo prints) gives the same figures.
    command = re.search(r"\(searchgym bench headroom (.+)\)", out)
    assert command is not None and str(tmp_path / "sft" / "checkpoint.pt") in command.group(1)
    assert main(["bench", "headroom", *command.group(1).split(), "--json", "--no-progress"]) == 0
    bench = json.loads(capsys.readouterr().out)
    demo = json.loads((tmp_path / "headroom.json").read_text())
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
    # and the warm-start's greedy EM on those questions is what its own evaluation scored on them
    sft_episodes = [json.loads(line) for line in (tmp_path / "sft" / "eval_episodes.jsonl").open()]
    assert bench["greedy_em"] == pytest.approx(sum(e["em"] for e in sft_episodes[:4]) / 4)
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    # The GRPO runs skip their step-0 evaluation: the figure gets the SFT run's EM as the warm-start line.
    sft_em = read_metrics(tmp_path / "sft" / "metrics.jsonl")[-1]["eval/em"]
    assert [d["warm_start_em"] for d in drawn] == [sft_em]
    assert drawn[0]["title"].startswith("searchgym demo: GRPO vs GRPO+LLDS")
    assert (tmp_path / "grpo" / "metrics.jsonl").is_file() and (
        tmp_path / "grpo_llds" / "checkpoint.pt"
    ).is_file()


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
