"""The answerability audit: exact counts on a scripted corpus (an answer absent, a gold passage missing, an
answer reached only at k > 3), every generated-world question answerable, and the ``searchgym audit``
command with its bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from searchgym.app.cli import main
from searchgym.audit import AnswerIndex, audit_questions, audit_shares, oracle_query
from searchgym.data import load_flashrag
from searchgym.errors import ConfigError
from searchgym.retrieval import BM25Retriever

CORPUS = [
    ("0", "Alpha Town", "Alpha Town is a town founded by Mira Quell in 1802."),
    ("1", "Beta River", "The Beta River flows through Alpha Town."),
    ("2", "Zorb flux", "zorb flux zorb flux zorb flux, the flux of zorb."),
    ("3", "Zorb flux again", "zorb flux zorb flux zorb flux and more flux of zorb."),
    ("4", "Zorb flux third", "zorb flux zorb flux zorb flux, flux."),
    ("5", "Gadget", "a zorb measured by Qwertina Lark once."),
]
QUESTIONS: list[dict[str, Any]] = [
    # answerable and reached by its gold title
    {"id": "ok", "question": "Who founded Alpha Town?", "golden_answers": ["Mira Quell"],
     "metadata": {"type": "bridge", "supporting_passage_ids": ["0"]}},
    # the answer is in no passage
    {"id": "absent", "question": "Who named the Beta River?", "golden_answers": ["Oskar Pell"],
     "metadata": {"type": "bridge", "supporting_passage_ids": ["1"]}},
    # a named gold passage is not in the corpus
    {"id": "gone", "question": "When was Alpha Town founded?", "golden_answers": ["1802"],
     "metadata": {"type": "comparison", "supporting_passage_ids": ["0", "99"]}},
    # no gold named: the question is the query, and three passages outrank the one with the answer
    {"id": "deep", "question": "zorb flux?", "golden_answers": ["Qwertina Lark"]},
]  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("scripted")
    lines = [json.dumps({"id": i, "contents": f'"{t}"\n{x}'}) for i, t, x in CORPUS]
    (root / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    (root / "test.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return root


def audit(folder: Path, k: int) -> list[dict[str, Any]]:
    dataset = load_flashrag(folder)
    return audit_questions(dataset, dataset.questions("test"), BM25Retriever(dataset.passages), k)


def test_scripted_cases_are_counted_exactly(folder: Path) -> None:
    records = {r["question_id"]: r for r in audit(folder, 3)}
    assert records["ok"]["answerable"] and records["ok"]["reachable"] and records["ok"]["answer_rank"] == 1
    assert not records["absent"]["answer_in_corpus"] and not records["absent"]["answerable"]
    assert records["gone"]["gold_missing"] == ["99"] and records["gone"]["answer_in_corpus"]
    assert not records["gone"]["answerable"]
    deep = records["deep"]
    assert deep["answerable"] and deep["answer_rank"] == 4 and not deep["reachable"]
    shares = audit_shares(list(records.values()))
    assert {
        k: shares[f"{k}_count"] for k in ("unanswerable", "answer_absent", "gold_missing", "unreachable")
    } == {
        "unanswerable": 2,
        "answer_absent": 1,
        "gold_missing": 1,
        "unreachable": 1,
    }
    assert shares["questions"] == 4 and shares["unanswerable"] == 0.5 and shares["unreachable"] == 0.25
    assert shares["kinds"]["bridge"]["answer_absent_count"] == 1
    assert shares["kinds"]["comparison"]["gold_missing_count"] == 1
    assert shares["kinds"]["(no kind)"]["unreachable_count"] == 1
    # At k = 4 the deep question is reached: nothing else changes.
    wider = audit_shares(audit(folder, 4))
    assert wider["unreachable_count"] == 0 and wider["unanswerable_count"] == 2


def test_answers_match_whole_words_after_normalisation(folder: Path) -> None:
    index = AnswerIndex(load_flashrag(folder).passages)
    assert index.holds(["the Beta river"])  # article and case normalised away
    assert not index.holds(["Quel"]) and not index.holds(["flu"])  # parts of words are no match
    assert not index.holds([""])


def test_the_oracle_query_is_the_gold_titles_else_the_question(folder: Path) -> None:
    dataset = load_flashrag(folder)
    by_id = {q.id: q for q in dataset.questions("test")}
    assert oracle_query(by_id["ok"], dataset) == "Alpha Town"
    assert oracle_query(by_id["gone"], dataset) == "Alpha Town"  # the missing one has no title
    assert oracle_query(by_id["deep"], dataset) == "zorb flux?"


def test_every_generated_world_question_is_answerable(world: Any, retriever: Any) -> None:
    for split in ("test", "validation"):
        shares = audit_shares(audit_questions(world, world.questions(split), retriever, 3))
        assert shares["questions"] == len(world.questions(split))
        assert shares["unanswerable_count"] == 0 and shares["gold_missing_count"] == 0


def test_k_must_be_positive(folder: Path) -> None:
    dataset = load_flashrag(folder)
    with pytest.raises(ConfigError, match="--topk must be a positive integer"):
        audit_questions(dataset, dataset.questions("test"), BM25Retriever(dataset.passages), 0)


def test_the_audit_command_prints_the_shares_and_writes_the_records(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "audit.jsonl"
    assert main(["audit", str(folder), "--topk", "3", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| all | 4 | 2 (50.0%) | 1 (25.0%) | 1 (25.0%) | 1 (25.0%) |" in table
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["question_id"] for r in records] == ["ok", "absent", "gone", "deep"]
    assert main(["audit", str(folder), "--json", "--topk", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["unreachable_count"] == 0


def exit_code(argv: list[str]) -> int:
    """The command's exit status, a usage error's (argparse exits) included."""
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--topk", "0"], "--topk"),
        (["--retriever", "nonsense"], "unknown retriever 'nonsense'"),
    ],
)
def test_bad_audit_options_get_one_line(
    folder: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert exit_code(["audit", str(folder), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) <= 2


def test_a_folder_without_a_corpus_gets_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "test.jsonl").write_text(json.dumps(QUESTIONS[0]) + "\n")
    assert main(["audit", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "corpus.jsonl does not exist" in err and len(err.splitlines()) == 1


def test_a_possessive_or_a_hyphen_does_not_hide_an_answer() -> None:
    from searchgym.audit import holds_answer

    assert holds_answer(["Andy Warhol"], "a print of Andy Warhol's studio")
    assert holds_answer(["Jean-Jacques Rousseau"], "Jean-Jacques Rousseau's Emile")
    assert holds_answer(["Jean Jacques Rousseau"], "Jean-Jacques Rousseau wrote")
    assert not holds_answer(["Warhol"], "the Warholian style")
    assert holds_answer(["Orwell"], "the narrator\u2014Orwell, writing")  # an em dash joins no words
