"""The Search-R1 parquet loader (placed with the retrieval tests: it serves the real-corpora work)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from searchgym.data import load_dataset, load_searchr1
from searchgym.data.searchr1 import read_searchr1
from searchgym.errors import ConfigError, DataFormatError

TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. ... For example, <answer> Beijing </answer>. Question: {q}\n"
)


def row(question: str, answers: Any, source: str = "nq", index: int = 0) -> dict[str, Any]:
    """One row as Search-R1's data scripts write it."""
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": TEMPLATE.format(q=question)}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
        "extra_info": {"split": "test", "index": index},
    }


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    corpus = [
        {"id": "0", "contents": '"Paris"\nParis is the capital of France.'},
        {"id": "1", "contents": '"Berlin"\nBerlin is the capital of Germany.'},
    ]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(c) + "\n" for c in corpus))
    write(
        tmp_path / "test.parquet",
        [
            row("what is the capital of france?", ["Paris", "paris, france"], "nq", 0),
            row("capital of germany?", ["Berlin"], "hotpotqa", 0),  # indexes restart per source
        ],
    )
    write(tmp_path / "train.parquet", [row("where is paris?", ["France"], "nq", 7)])
    return tmp_path


def test_folder_of_parquet_splits(folder: Path) -> None:
    dataset = load_searchr1(folder)
    assert sorted(dataset.splits) == ["test", "train"]
    first, second = dataset.questions("test")
    assert (first.id, first.question, first.golden_answers) == (
        "nq_0",
        "what is the capital of france?",
        ("Paris", "paris, france"),
    )
    assert second.id == "hotpotqa_0" and second.metadata["data_source"] == "hotpotqa"
    assert dataset.questions("train")[0].id == "nq_7"
    assert [p.title for p in dataset.passages] == ["Paris", "Berlin"]


def test_load_dataset_accepts_folder_and_single_file(folder: Path) -> None:
    assert sorted(load_dataset(folder).splits) == ["test", "train"]
    single = load_dataset(folder / "train.parquet")
    assert list(single.splits) == ["train"]
    env = gym.make("SearchQA-v0", dataset=str(folder), split="test")
    _, info = env.reset(seed=0)
    assert info["question_id"] in {"nq_0", "hotpotqa_0"}
    env.close()


def test_prompt_without_marker_and_string_target(tmp_path: Path) -> None:
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"id": "0", "contents": '"T"\nx'}) + "\n")
    r = row("q", "single answer")
    r["prompt"] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "  who is x?  "}]
    r["reward_model"]["ground_truth"]["target"] = ["single answer"]
    write(tmp_path / "dev.parquet", [r])
    (question,) = load_searchr1(tmp_path).questions("dev")
    assert question.question == "who is x?"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.update(prompt=[]), "non-empty list of chat messages"),
        (lambda r: r.update(prompt=[{"role": "user", "content": "Question:   "}]), "no question text"),
        (lambda r: r["reward_model"]["ground_truth"].update(target=[]), "ground_truth.target"),
        (lambda r: r.update(data_source=""), "data_source"),
    ],
    ids=["empty prompt", "empty question", "no answers", "no source"],
)
def test_malformed_rows_name_file_and_row(tmp_path: Path, mutate: Any, message: str) -> None:
    bad = row("second?", ["b"], index=1)
    mutate(bad)
    path = write(tmp_path / "test.parquet", [row("first?", ["a"]), bad])
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"id": "0", "contents": '"T"\nx'}) + "\n")
    with pytest.raises(DataFormatError, match=message) as info:
        load_searchr1(tmp_path).questions("test")
    assert info.value.path == str(path) and info.value.line == 2
    assert f"{path}:2:" in str(info.value)


def test_file_level_errors(tmp_path: Path) -> None:
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"id": "0", "contents": '"T"\nx'}) + "\n")
    write(tmp_path / "a.parquet", [{"data_source": "nq", "prompt": [{"role": "user", "content": "q"}]}])
    with pytest.raises(DataFormatError, match=r"missing column\(s\) \['reward_model'\]"):
        load_searchr1(tmp_path / "a.parquet")
    write(tmp_path / "b.parquet", [row("q1", ["x"], index=3), row("q2", ["y"], index=3)])
    with pytest.raises(DataFormatError, match="duplicate question id 'nq_3'"):
        load_searchr1(tmp_path / "b.parquet")
    (tmp_path / "c.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataFormatError, match="not a readable parquet file"):
        load_searchr1(tmp_path / "c.parquet")
    with pytest.raises(ConfigError, match="no corpus"):
        load_searchr1(write(tmp_path / "sub.parquet", [row("q", ["a"])]), corpus=tmp_path / "none.jsonl")
    with pytest.raises(ConfigError, match="no split"):
        load_searchr1(tmp_path, splits=["nope"])


def test_a_parquet_row_bomb_is_refused_before_its_rows_are_decoded(tmp_path: Path) -> None:
    row = {
        "data_source": "nq",
        "prompt": [{"role": "user", "content": "Question: where?"}],
        "reward_model": {"style": "rule", "ground_truth": {"target": ["x"]}},
        "extra_info": {"split": "test", "index": 0},
    }
    path = tmp_path / "bomb.parquet"
    pq.write_table(pa.Table.from_pylist([row] * 5000), path)  # identical rows compress to almost nothing
    assert path.stat().st_size < 20_000
    with pytest.raises(DataFormatError, match=r"holds 5,000 rows, more than the 1,000 searchgym reads"):
        read_searchr1(path, max_rows=1000)
    # Under the cap, the first duplicate fails at its row, in the first decoded batch.
    with pytest.raises(DataFormatError, match=r"bomb\.parquet:2: duplicate question id"):
        read_searchr1(path)


# -- supporting passage ids ------------------------------------------------------------------------------------

CORPUS_LINE = json.dumps({"id": "0", "contents": '"Alpha"\nAlpha is a letter.'})


@pytest.mark.parametrize(
    ("value", "expected"), [("12", ("12",)), (0, ("0",)), (["3", "4"], ("3", "4")), (None, ())]
)
def test_searchr1_rows_read_supporting_ids(tmp_path: Path, value: Any, expected: tuple[str, ...]) -> None:
    row = {
        "data_source": "nq",
        "prompt": [{"role": "user", "content": "Question: who?"}],
        "reward_model": {"style": "rule", "ground_truth": {"target": ["x"]}},
        "extra_info": {"index": 0, "supporting_passage_ids": value},
    }
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "test.parquet")
    (tmp_path / "corpus.jsonl").write_text(CORPUS_LINE + "\n")
    (question,) = load_searchr1(tmp_path / "test.parquet").questions("test")
    assert question.supporting_ids == expected


def test_searchr1_rows_with_bad_supporting_ids_name_file_and_row(tmp_path: Path) -> None:
    rows = [
        {
            "data_source": "nq",
            "prompt": [{"role": "user", "content": f"Question: q{i}?"}],
            "reward_model": {"style": "rule", "ground_truth": {"target": ["x"]}},
            "extra_info": {"index": i, "supporting_passage_ids": value},
        }
        for i, value in enumerate([1.0, 2.5])
    ]
    path = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    (tmp_path / "corpus.jsonl").write_text(CORPUS_LINE + "\n")
    with pytest.raises(DataFormatError, match=r"metadata\.supporting_passage_ids") as err:
        load_searchr1(path)
    assert err.value.path == str(path) and err.value.line == 1
