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
