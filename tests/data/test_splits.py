"""Split slices (``test[:2000]``, ``test[2000:]``, ``train[10%:]``): parsed once in the data layer, so every
command and env that takes a split takes a slice of one; bad slices are one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

import searchgym  # noqa: F401  (registers the envs)
from searchgym.app.cli import main
from searchgym.data import load_dataset, parse_split
from searchgym.errors import ConfigError


def folder_with_only_a_test_split(root: Path, n: int = 20) -> Path:
    """A FlashRAG folder shaped like ../shared/data/nq_open_oracle_2655: one ``test`` split, no ``train``."""
    root.mkdir(parents=True)
    corpus = [
        {"id": str(i), "contents": f'"Entity {i}"\nEntity {i} was founded in year {1900 + i}.'}
        for i in range(n)
    ]
    tests = [
        {
            "id": f"q{i}",
            "question": f"When was Entity {i} founded?",
            "golden_answers": [str(1900 + i)],
            "metadata": {"gold_passage_ids": [str(i)]},
        }
        for i in range(n)
    ]
    for name, rows in (("corpus", corpus), ("test", tests)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return root


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("test", list(range(20))),
        ("test[:5]", [0, 1, 2, 3, 4]),
        ("test[15:]", [15, 16, 17, 18, 19]),
        ("test[3:6]", [3, 4, 5]),
        ("test[:-18]", [0, 1]),
        ("test[-2:]", [18, 19]),
        ("test[:10%]", [0, 1]),
        ("test[90%:]", [18, 19]),
        ("test[25%:30%]", [5]),
        ("test[:1000]", list(range(20))),  # a stop past the end keeps what there is, as a Python slice
        (" test[ 2 : 4 ] ", [2, 3]),
    ],
)
def test_a_slice_selects_as_python_and_hugging_face_do(
    tmp_path: Path, spec: str, expected: list[int]
) -> None:
    dataset = load_dataset(folder_with_only_a_test_split(tmp_path / "d"))
    assert [q.id for q in dataset.questions(spec)] == [f"q{i}" for i in expected]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "train",
            r"has no split 'train'; available: \['test'\] \(a slice of one is written NAME\[START:STOP\]",
        ),
        ("test[a:]", r"slice bound 'a' is not an integer or a percentage \(e\.g\. test\[:2000\]"),
        ("test[1:2:3]", r"START:STOP, without a step"),
        ("test[5]", r"START:STOP, without a step"),
        ("test[:]", r"selects the whole split; write 'test'"),
        ("test[1:2", r"is not NAME or NAME\[START:STOP\]"),
        ("[1:2]", r"is not NAME or NAME\[START:STOP\]"),
        ("test[150%:]", r"a percentage bound lies in -100%\.\.100%"),
        ("test[30:]", r"split 'test\[30:\]' selects no questions: split 'test' has 20"),
        ("test[6:3]", r"selects no questions"),
        ("train[:10]", r"has no split 'train'; available: \['test'\]$"),
    ],
)
def test_a_bad_split_is_one_clear_error(tmp_path: Path, spec: str, message: str) -> None:
    dataset = load_dataset(folder_with_only_a_test_split(tmp_path / "d"))
    with pytest.raises(ConfigError, match=message) as caught:
        dataset.questions(spec)
    assert "\n" not in str(caught.value)


def test_find_question_and_the_env_work_on_a_slice(world: object) -> None:
    dataset = load_dataset(None)
    held_out = dataset.questions("test[900:]")
    assert len(held_out) == 100 and held_out[0] is dataset.questions("test")[900]
    assert dataset.find_question("test[900:]", held_out[5].id) is held_out[5]
    env = gym.make("SearchQA-v0", split="train[:10%]")
    try:
        assert len(env.unwrapped.questions) == round(len(dataset.questions("train")) * 0.1)
        _, info = env.reset(seed=0, options={"question_id": env.unwrapped.questions[3].id})
        assert info["question_id"] == env.unwrapped.questions[3].id
    finally:
        env.close()


def test_file_stems_are_safe_for_files_and_hydra() -> None:
    assert parse_split("test").file_stem == "test"
    assert parse_split("test[:2000]").file_stem == "test_0-2000"
    assert parse_split("test[2000:]").file_stem == "test_2000-end"
    assert parse_split("train[10%:-5]").file_stem == "train_10pct-m5"


def test_every_command_takes_a_slice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = str(folder_with_only_a_test_split(tmp_path / "d"))
    episodes = tmp_path / "episodes.jsonl"
    argv = ["eval", "--agent", "oracle", "--dataset", data, "--split", "test[15:]", "--episodes", "5"]
    assert main([*argv, "--out", str(episodes), "--json", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["em"] == 1.0
    played = [json.loads(line)["question_id"] for line in episodes.read_text().splitlines()]
    assert played == ["q15", "q16", "q17", "q18", "q19"]
    out = tmp_path / "bench"
    args = ["benchmark", "--agent", "oracle", "--datasets", data, "--split", "test[:4]", "--out", str(out)]
    assert main([*args, "--no-progress"]) == 0
    capsys.readouterr()
    (pairs,) = (out / "pairs").rglob("*.jsonl")
    assert len(pairs.read_text().splitlines()) == 4


def test_a_bad_slice_on_the_command_line_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(folder_with_only_a_test_split(tmp_path / "d"))
    assert main(["eval", "--agent", "oracle", "--dataset", data, "--split", "test[x:]", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("searchgym: error: split 'test[x:]': slice bound 'x'"), err


@pytest.mark.parametrize("command", ["trl", "grpo", "sft"])
def test_training_checks_its_splits_before_writing_its_run_folder(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(folder_with_only_a_test_split(tmp_path / "d"))
    run_dir = tmp_path / "run"
    assert main(["train", command, "--dataset", data, "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "searchgym: error: --split: dataset 'd' has no split 'train'; available: ['test'] (a slice of one is "
        "written NAME[START:STOP], e.g. test[:2000], test[2000:], train[10%:], train[:-500])"
    ]
    assert not run_dir.exists()


def test_a_held_out_probe_may_not_overlap_the_training_slice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(folder_with_only_a_test_split(tmp_path / "d"))
    argv = [
        "train",
        "grpo",
        "--dataset",
        data,
        "--run-dir",
        str(tmp_path / "run"),
        "--eval-split",
        "test[15:]",
    ]
    assert main([*argv, "--split", "test[:15]", "--onpolicy-heldout-split", "test[10:]"]) == 2
    err = capsys.readouterr().err
    assert (
        "--onpolicy-heldout-split 'test[10:]' shares 5 questions with the training split 'test[:15]'" in err
    )
    assert not (tmp_path / "run").exists()
