import json
from pathlib import Path
from typing import Any

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


# -- bytes of the files ----------------------------------------------------------------------------------------


def folder_of_bytes(root: Path, corpus: bytes | None = None, test: bytes | None = None) -> Path:
    """A folder of :data:`GOOD_CORPUS` and :data:`GOOD_TEST`, or of the bytes given for either file."""
    root.mkdir(parents=True, exist_ok=True)
    good_corpus = ("\n".join(GOOD_CORPUS) + "\n").encode()
    (root / "corpus.jsonl").write_bytes(corpus if corpus is not None else good_corpus)
    (root / "test.jsonl").write_bytes(test if test is not None else ("\n".join(GOOD_TEST) + "\n").encode())
    return root


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"id": "2", "contents": "\\"G\\"\\n\xff\xfe bad"}', "not valid UTF-8"),
        (b'{"id": "2", "contents": "\\"G\\"\\n\xed\xa0\x80 surrogate bytes"}', "not valid UTF-8"),
        (b'{"id": "2", "contents": "\\"G\\"\\n\\ud800 lone"}', "lone UTF-16 surrogate"),
    ],
    ids=["invalid utf-8", "encoded surrogate", "escaped surrogate"],
)
def test_bad_text_in_a_data_file_names_file_and_line(tmp_path: Path, line: bytes, message: str) -> None:
    root = folder_of_bytes(tmp_path / "d", corpus=("\n".join(GOOD_CORPUS) + "\n").encode() + line + b"\n")
    with pytest.raises(DataFormatError, match=message) as err:
        load_flashrag(root)
    assert err.value.path == str(root / "corpus.jsonl") and err.value.line == 3


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    root = folder_of_bytes(tmp_path / "d", corpus=b"\xef\xbb\xbf" + ("\n".join(GOOD_CORPUS) + "\n").encode())
    assert [p.id for p in load_flashrag(root).passages] == ["0", "1"]


# -- a stray file in the folder --------------------------------------------------------------------------------


def test_a_stray_jsonl_breaks_only_a_request_for_it(tmp_path: Path) -> None:
    root = folder_of_bytes(tmp_path / "d")
    (root / "results.jsonl").write_text('{"em": 1.0}\nnot json at all\n')
    dataset = load_dataset(root)
    assert [q.id for q in dataset.questions("test")] == ["q0"]
    with pytest.raises(DataFormatError, match=r"results.jsonl:1: missing field 'id'"):
        dataset.questions("results")
    with pytest.raises(DataFormatError, match=r"results\.jsonl"):
        load_flashrag(root, splits=("test", "results"))  # named splits are read at once


def test_env_on_a_folder_with_a_stray_file(tmp_path: Path) -> None:
    import gymnasium as gym

    import searchgym  # noqa: F401

    root = folder_of_bytes(tmp_path / "d")
    (root / "results.jsonl").write_bytes(b"\xff\xfe garbage\n")
    env = gym.make("SearchQA-v0", dataset=str(root), split="test")
    _, info = env.reset(seed=0)
    assert info["question"] == "What is Alpha?"
    env.close()


# -- supporting passage ids ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [(["0", 1], ("0", "1")), (0, ("0",)), ("12", ("12",)), (None, ()), ([], ())],
)
def test_supporting_ids_accept_a_list_or_one_id(
    tmp_path: Path, value: Any, expected: tuple[str, ...]
) -> None:
    record = {
        "id": "q",
        "question": "?",
        "golden_answers": ["a"],
        "metadata": {"supporting_passage_ids": value},
    }
    root = folder_of_bytes(tmp_path / "d", test=json.dumps(record).encode() + b"\n")
    (question,) = load_flashrag(root).questions("test")
    assert question.supporting_ids == expected and question.hops == len(expected)


@pytest.mark.parametrize("value", [1.5, True, {"id": "0"}, [["0"]], ["0", None], [1.0]])
def test_supporting_ids_of_another_type_name_file_and_line(tmp_path: Path, value: Any) -> None:
    records = [
        {"id": "q0", "question": "?", "golden_answers": ["a"]},
        {"id": "q1", "question": "?", "golden_answers": ["a"], "metadata": {"gold_passage_ids": value}},
    ]
    root = folder_of_bytes(tmp_path / "d", test="".join(json.dumps(r) + "\n" for r in records).encode())
    with pytest.raises(DataFormatError, match=r"metadata\.gold_passage_ids") as err:
        load_flashrag(root).questions("test")
    assert err.value.path == str(root / "test.jsonl") and err.value.line == 2
