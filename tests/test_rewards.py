import pytest

from searchgym.errors import ConfigError
from searchgym.rewards import exact_match, f1_score, get_metric, normalize_answer, sub_exact_match


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Beatles", "beatles"),
        ("  a  Tale of Two   Cities! ", "tale of two cities"),
        ("U.S.A.", "usa"),
        ("An apple, the pear", "apple pear"),
        ("Théâtre", "théâtre"),
        ("", ""),
    ],
)
def test_normalize_answer(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


@pytest.mark.parametrize(
    ("pred", "gold", "em", "subem"),
    [
        ("Paris", ["paris"], 1.0, 1.0),
        ("the Paris", ["Paris", "Lutetia"], 1.0, 1.0),
        ("Lutetia.", ["Paris", "Lutetia"], 1.0, 1.0),
        ("Paris, France", ["Paris"], 0.0, 1.0),
        ("Pari", ["Paris"], 0.0, 0.0),
        ("anything", [""], 0.0, 0.0),
        ("", [], 0.0, 0.0),
    ],
)
def test_exact_and_sub_exact_match(pred: str, gold: list[str], em: float, subem: float) -> None:
    assert exact_match(pred, gold) == em
    assert sub_exact_match(pred, gold) == subem


@pytest.mark.parametrize(
    ("pred", "gold", "f1"),
    [
        ("Paris", ["Paris"], 1.0),
        ("Paris France", ["Paris"], 2 * (0.5 * 1.0) / 1.5),
        ("new york city", ["York", "New York"], 2 * (2 / 3 * 1.0) / (2 / 3 + 1.0)),
        ("Rome", ["Paris"], 0.0),
        ("", ["Paris"], 0.0),
    ],
)
def test_f1(pred: str, gold: list[str], f1: float) -> None:
    assert f1_score(pred, gold) == pytest.approx(f1)


def test_unknown_metric_lists_valid_names() -> None:
    with pytest.raises(ConfigError, match=r"choose one of \['em', 'f1', 'subem'\]"):
        get_metric("bleu")


# -- golden answers as a str or a sequence ----------------------------------------------------------------


@pytest.mark.parametrize("metric", [exact_match, sub_exact_match, f1_score])
@pytest.mark.parametrize("gold", ["Paris", ["Paris"], ("Lutetia", "Paris")])
def test_a_str_golden_answer_is_one_answer(metric, gold) -> None:
    assert metric("Paris", gold) == 1.0


@pytest.mark.parametrize("metric", [exact_match, sub_exact_match, f1_score])
def test_a_str_golden_answer_is_not_scored_character_by_character(metric) -> None:
    # Iterated as characters, "ab" would hold the answer "a" and "b": a prediction "b" would score.
    assert metric("b", "ab") == 0.0


@pytest.mark.parametrize("bad", [[1], ["Paris", None], b"Paris", [b"Paris"]])
def test_non_string_golden_answers_are_refused(bad) -> None:
    with pytest.raises(ConfigError, match="golden answers"):
        exact_match("Paris", bad)


# -- F1's yes/no/noanswer rule ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pred", "gold", "f1"),
    [
        ("yes", ["yes"], 1.0),
        ("Yes.", ["yes"], 1.0),
        ("no", ["yes"], 0.0),
        ("yes", ["yes it is"], 0.0),  # a special prediction against another answer: 0, not 2/3
        ("yes it is", ["yes"], 0.0),  # a special golden answer against another prediction: 0, not 2/3
        ("noanswer", ["no answer"], 0.0),
        ("no answer", ["noanswer"], 0.0),
        ("no", ["no way", "no"], 1.0),  # the rule applies per golden answer; the best counts
        ("no way", ["no", "no way"], 1.0),
        ("Paris France", ["Paris"], 2 * (0.5 * 1.0) / 1.5),  # ordinary answers unchanged
    ],
)
def test_f1_special_answers(pred: str, gold: list[str], f1: float) -> None:
    assert f1_score(pred, gold) == pytest.approx(f1)


# -- agreement with an independent re-implementation of Search-R1's normaliser ----------------------------


def _reference_normalize(s: str) -> str:
    """Search-R1's ``qa_em`` normaliser, re-written from its description: lower, remove punctuation, remove
    articles, fix white space (applied in that order, the innermost first)."""
    import re
    import string

    lowered = s.lower()
    no_punct = "".join(ch for ch in lowered if ch not in set(string.punctuation))
    no_articles = re.sub(r"\b(a|an|the)\b", " ", no_punct)
    return " ".join(no_articles.split())


def _reference_em(prediction: str, golden_answers: object) -> int:
    if isinstance(golden_answers, str):
        golden_answers = [golden_answers]
    pred = _reference_normalize(prediction)
    return int(any(_reference_normalize(g) == pred for g in golden_answers))  # type: ignore[attr-defined]


def test_normaliser_agrees_with_search_r1_on_all_shared_data() -> None:
    import json
    import os
    from pathlib import Path

    shared_data = Path(
        os.environ.get("SEARCHGYM_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
    )
    if not (shared_data / "nq_open_oracle_2655").is_dir():
        pytest.skip(f"shared data folder {shared_data} is absent")
    strings: list[str] = []
    golds: list[list[str]] = []
    for folder in sorted(p for p in shared_data.iterdir() if p.is_dir()):
        for path in sorted(folder.glob("*.jsonl")):
            if path.name == "corpus.jsonl":
                continue
            for line in path.read_text(encoding="utf-8").splitlines():
                record = json.loads(line)
                strings.append(record["question"])
                strings.extend(record["golden_answers"])
                golds.append(record["golden_answers"])
    assert len(golds) == 1100 + 2655 + 17
    agree = sum(normalize_answer(s) == _reference_normalize(s) for s in strings)
    print(f"normaliser agreement: {agree}/{len(strings)} strings of {len(golds)} questions")
    assert agree == len(strings)
    # Scores too: each question's golden answers against each of its own answers and against the question.
    for gold in golds:
        for pred in [*gold, gold[0].upper() + "!", "the " + gold[-1]]:
            assert exact_match(pred, gold) == _reference_em(pred, gold)
            assert exact_match(pred, gold[0]) == _reference_em(pred, gold[0])
