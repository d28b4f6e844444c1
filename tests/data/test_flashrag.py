import json
from pathlib import Path

import pytest

from searchgym.data import load_dataset, load_flashrag
from searchgym.errors import ConfigError, DataFormatError


def write_folder(root: Path, corpus_lines: list[str], test_lines: list[str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_text("\n".join(corpus_lines) + "\n", encoding="utf-8")
    (root / "test.jsonl").write_text("\n".join(test_lines) + "\n", encoding="utf-8")
    return root


GOOD_CORPUS = [
    json.dumps({"id": "0", "contents": '"Alpha"\nAlpha is a letter.'}),
    json.dumps({"id": "1", "contents": '"Beta"\nBeta follows alpha.'}),
]
GOOD_TEST = [
    json.dumps(
        {
            "id": "q0",
            "question": "What is Alpha?",
            "golden_answers": ["a letter"],
            "metadata": {"supporting_passage_ids": ["0"]},
        }
    )
]


def test_loads_a_folder(tmp_path: Path) -> None:
    ds = load_flashrag(write_folder(tmp_path / "ok", GOOD_CORPUS, GOOD_TEST))
    assert [p.title for p in ds.passages] == ["Alpha", "Beta"]
    assert ds.passages[0].text == "Alpha is a letter."
    (q,) = ds.questions("test")
    assert q.golden_answers == ("a letter",) and q.supporting_ids == ("0",)


@pytest.mark.parametrize(
    ("corpus", "test", "bad_file", "line", "message"),
    [
        ([*GOOD_CORPUS, "{not json"], GOOD_TEST, "corpus.jsonl", 3, "invalid JSON"),
        ([json.dumps({"id": "0"})], GOOD_TEST, "corpus.jsonl", 1, "missing field 'contents'"),
        ([*GOOD_CORPUS, json.dumps({"id": "0", "contents": "x"})], GOOD_TEST, "corpus.jsonl", 3, "duplicate"),
        (
            GOOD_CORPUS,
            [json.dumps({"id": "q", "question": "?", "golden_answers": 3})],
            "test.jsonl",
            1,
            "golden_answers",
        ),
        (GOOD_CORPUS, ["", json.dumps([1, 2])], "test.jsonl", 2, "expected a JSON object"),
        (
            GOOD_CORPUS,
            [json.dumps({"id": "q", "question": 5, "golden_answers": []})],
            "test.jsonl",
            1,
            "'question' must be str",
        ),
    ],
)
def test_malformed_record_names_file_and_line(
    tmp_path: Path, corpus: list[str], test: list[str], bad_file: str, line: int, message: str
) -> None:
    root = write_folder(tmp_path / "bad", corpus, test)
    with pytest.raises(DataFormatError, match=message) as err:
        load_flashrag(root).questions("test")  # a discovered split is read on first use
    assert err.value.path == str(root / bad_file)
    assert err.value.line == line
    assert f"{bad_file}:{line}:" in str(err.value)


def test_missing_folder_and_split(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="neither 'world' nor an existing"):
        load_dataset(tmp_path / "nope")
    root = write_folder(tmp_path / "ok", GOOD_CORPUS, GOOD_TEST)
    with pytest.raises(ConfigError, match="no split 'train'"):
        load_flashrag(root).questions("train")


def test_real_hotpotqa_folder(hotpot_dir: Path) -> None:
    ds = load_dataset(hotpot_dir)
    assert len(ds.passages) == 10787
    questions = ds.questions("test")
    assert len(questions) == 1100
    assert all(q.supporting_ids and all(p in ds.passage_index for p in q.supporting_ids) for q in questions)
    assert load_dataset(hotpot_dir) is ds  # cached per process


def test_duplicate_question_ids_are_rejected(tmp_path: Path) -> None:
    root = write_folder(tmp_path / "dup", GOOD_CORPUS, [GOOD_TEST[0], GOOD_TEST[0]])
    with pytest.raises(DataFormatError, match="duplicate question id 'q0'") as err:
        load_flashrag(root, splits=("test",))
    assert err.value.line == 2
