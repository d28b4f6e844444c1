"""``searchgym warmstart``: the recipe builds a checkpoint and its card end to end (tiny sizes), and refuses
what it must."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchgym.app.cli.warmstart import RECIPES, Recipe, card_text

TINY = [
    "--threads",
    "1",
    "--layers",
    "1",
    "--hidden",
    "32",
    "--epochs",
    "1",
    "--batch-size",
    "4",
    "--demos-per-world",
    "8",
    "--eval-questions",
    "4",
    "--headroom-questions",
    "4",
    "--headroom-samples",
    "2",
    "--no-progress",
]


def test_the_headroom_recipe_plays_a_demo_sized_world() -> None:
    recipe = RECIPES["headroom"]
    assert recipe.env()["topk"] == 1 and "shortcut" in recipe.mix and "oracle" in recipe.mix
    assert "1 passage per search" in recipe.world()
    # the default world is not touched
    from searchgym.envs import EnvSpec

    assert EnvSpec().topk == 3


@pytest.mark.slow
def test_the_recipe_builds_a_warm_start_and_its_card(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from searchgym.app.cli import main

    run_dir = tmp_path / "ws"
    assert main(["warmstart", "--recipe", "headroom", "--run-dir", str(run_dir), "--seed", "1", *TINY]) == 0
    out = capsys.readouterr().out
    assert (run_dir / "checkpoint.pt").is_file() and (run_dir / "demos.jsonl").is_file()
    card = json.loads((run_dir / "card.json").read_text())
    assert card["recipe"] == "headroom" and card["seed"] == 1 and card["threads"] == 1
    assert card["options"] == {**vars(Recipe()), "layers": 1, "hidden": 32, "epochs": 1, "batch_size": 4}
    assert sum(card["demonstrations"].values()) == 8 and card["wall_s"] > 0
    assert card["test"]["questions"] == 4 and 0 <= card["test"]["greedy_em"] <= 1
    lo, hi = card["test"]["em_95ci"]
    assert lo <= card["test"]["greedy_em"] <= hi
    headroom = card["headroom"]
    assert headroom["questions"] == 4 and headroom["samples"] == 2
    assert headroom["command"].startswith(f"searchgym bench headroom --init {run_dir / 'checkpoint.pt'} ")
    # the card's headroom figures are the command's
    argv = headroom["command"].split()[3:]
    assert main(["bench", "headroom", *argv, "--json", "--no-progress"]) == 0
    bench = json.loads(capsys.readouterr().out)
    assert {k: headroom[k] for k in ("greedy_em", "pass_at_k", "by_kind")} == {
        k: bench[k] for k in ("greedy_em", "pass_at_k", "by_kind")
    }
    gate = headroom["gate"]
    if gate is not None:
        bridge = bench["by_kind"]["bridge"]
        assert gate["greedy_em"] == bridge["greedy_em"]
        assert gate["met"] == (
            bridge["greedy_em"] <= 0.2 and (bridge["solvable_given_greedy_wrong"] or 0) >= 0.2
        )
    assert (run_dir / "card.md").read_text() == card_text(card) + "\n"
    assert "greedy test EM" in out and "recipe `headroom`" in out
    # a second build into the same folder is refused unless asked for
    capsys.readouterr()
    assert main(["warmstart", "--run-dir", str(run_dir), *TINY]) != 0
    assert "already holds a warm-start; pass --overwrite" in capsys.readouterr().err


def test_a_bad_schedule_gets_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from searchgym.app.cli import main

    assert main(["warmstart", "--run-dir", str(tmp_path), "--lr-schedule", "cosine"]) != 0
    err = capsys.readouterr().err
    assert err == "searchgym: error: --lr-schedule must be constant or linear, got 'cosine'\n"
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--batch-order", "sorted", "--batch-order must be random or length, got 'sorted'"),
        ("--curriculum", "attribute", "--curriculum: curriculum must be KIND:N with N >= 1 epochs"),
    ],
)
def test_a_bad_batch_order_or_curriculum_gets_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, message: str
) -> None:
    from searchgym.app.cli import main

    assert main(["warmstart", "--run-dir", str(tmp_path), option, value]) != 0
    err = capsys.readouterr().err
    assert err.startswith(f"searchgym: error: {message}") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # nothing written
