"""Long stages show a progress bar: the greedy evaluation (``train sft``'s closing one, the demo's scoring of
the untrained model, every trainer's) and the demo's demonstrations; ``progress`` off hides them."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


def test_train_sft_shows_its_closing_evaluation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from searchgym.agents.sft import train_sft
    from searchgym.agents.training.config import SFTConfig

    def run(folder: str, progress: bool) -> str:
        config = SFTConfig(
            run_dir=str(tmp_path / folder),
            demo_episodes=4,
            epochs=1,
            batch_size=4,
            tiny_layers=1,
            tiny_hidden=32,
            max_turn_tokens=8,
            eval_questions=3,
            eval_batch=2,
            threads=1,
            progress=progress,
            tensorboard=False,
        )
        train_sft(config)
        return capsys.readouterr().err

    err = run("shown", True)
    assert (
        "eval:" in err and "/3 [" in err and "question" in err
    )  # the closing evaluation's bar, in questions
    assert "sft: 100%" in err
    assert run("hidden", False) == ""


def test_the_warm_start_demonstrations_show_a_bar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from searchgym.app.cli.warmstart import RECIPES, write_demonstrations

    counts = write_demonstrations(tmp_path / "d.jsonl", RECIPES["headroom"], 0, cap=5, progress=True)
    assert sum(counts.values()) == 5
    assert "demos: 100%" in capsys.readouterr().err
    counts = write_demonstrations(tmp_path / "e.jsonl", RECIPES["headroom"], 0, cap=5, progress=False)
    assert sum(counts.values()) == 5
    assert capsys.readouterr().err == ""
