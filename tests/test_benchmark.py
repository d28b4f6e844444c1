"""The benchmark report from hand-built episode records: figures, averages, paired comparisons, table, plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from searchgym.benchmark import build_report, dataset_group, markdown_report, plot_report, resolve_dataset
from searchgym.errors import ConfigError


def records(
    ems: list[int], *, prefix: str = "q", searches: int = 1, answered: bool = True
) -> list[dict[str, Any]]:
    return [
        {
            "question_id": f"{prefix}{i}",
            "em": float(em),
            "f1": float(em),
            "searches": searches,
            "end_reason": "answered" if answered else "max_turns",
        }
        for i, em in enumerate(ems)
    ]


DATASETS = [{"name": "nq_small", "group": "general"}, {"name": "hotpotqa_small", "group": "multi-hop"}]


def two_agents() -> dict[str, dict[str, list[dict[str, Any]]]]:
    return {
        "base": {"nq_small": records([0, 1, 0, 0]), "hotpotqa_small": records([1, 1], prefix="h")},
        "mine": {
            "nq_small": records([1, 1, 0, 0], searches=2),
            "hotpotqa_small": records([1, 0], prefix="h", answered=False),
        },
    }


def test_the_paired_difference_and_mcnemar_match_the_hand_computed_case() -> None:
    report = build_report(two_agents(), DATASETS, resamples=20_000)
    paired = {r["dataset"]: r for r in report["paired"]}
    nq = paired["nq_small"]
    # Per-question differences on nq_small are [1, 0, 0, 0]: mean 1/4, exact bootstrap interval [0, 0.75]
    # (see tests/test_stats.py); one question only "mine" gets right: McNemar p = 2 * P[X <= 0; n = 1] = 1.
    assert nq["em_diff"] == {"mean": 0.25, "low": 0.0, "high": 0.75}
    assert (nq["only_agent"], nq["only_baseline"], nq["mcnemar_p"]) == (1, 0, 1.0)
    # hotpotqa: differences [0, -1] -> -0.5 in [-1, 0].
    assert paired["hotpotqa_small"]["em_diff"] == {"mean": -0.5, "low": -1.0, "high": 0.0}
    # The average over datasets of the paired differences: (0.25 - 0.5) / 2.
    assert paired["all"]["em_diff"]["mean"] == pytest.approx(-0.125)
    assert paired["all"]["mcnemar_p"] is None


def test_figures_per_dataset_and_averages_unweighted_over_datasets() -> None:
    report = build_report(two_agents(), DATASETS)
    row = {(r["agent"], r["dataset"]): r for r in report["results"]}
    assert row["mine", "nq_small"]["em"]["mean"] == 0.5
    assert row["mine", "nq_small"]["searches"]["mean"] == 2.0
    assert row["mine", "hotpotqa_small"]["answered"]["mean"] == 0.0
    assert row["base", "nq_small"]["episodes"] == 4
    average = {(r["agent"], r["group"]): r for r in report["averages"]}
    # base: nq 0.25, hotpotqa 1.0 -> 0.625 over datasets (the pooled mean over 6 questions would be 0.5).
    assert average["base", "all"]["em"]["mean"] == pytest.approx(0.625)
    assert average["base", "general"]["em"]["mean"] == 0.25
    assert average["base", "multi-hop"]["em"]["mean"] == 1.0
    assert average["base", "all"]["datasets"] == ["nq_small", "hotpotqa_small"]


def test_groups_without_datasets_have_no_average() -> None:
    report = build_report({"a": {"x": records([1])}}, [{"name": "x", "group": "other"}])
    assert [r["group"] for r in report["averages"]] == ["all"]
    assert report["paired"] == []
    assert "Paired" not in markdown_report(report)


def test_agents_that_played_different_questions_are_refused() -> None:
    episodes = two_agents()
    episodes["mine"]["nq_small"] = records([1, 1, 0], prefix="q")
    with pytest.raises(ConfigError, match="played different questions of nq_small"):
        build_report(episodes, DATASETS)


def test_the_markdown_table_and_the_plot(tmp_path: Path) -> None:
    report = build_report(two_agents(), DATASETS)
    table = markdown_report(report)
    assert (
        "| nq_small (general) | hotpotqa_small (multi-hop) | general avg | multi-hop avg | all avg |" in table
    )
    assert "| base | 0.250 [" in table
    assert "| nq_small | mine | 0.250 [0.000, 0.750] | 1 | 1 / 0 |" in table
    assert "| all (avg) | mine |" in table
    pytest.importorskip("matplotlib")
    path = tmp_path / "b.png"
    plot_report(report, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5_000


@pytest.mark.parametrize(
    ("name", "group"),
    [
        ("nq_open_oracle_2655", "general"),
        ("flashrag_quickstart_nq", "general"),
        ("triviaqa", "general"),
        ("PopQA-test", "general"),
        ("hotpotqa_dev_distractor_1100", "multi-hop"),
        ("2wikimultihopqa", "multi-hop"),
        ("musique_ans", "multi-hop"),
        ("bamboogle", "multi-hop"),
        ("my_questions", "other"),
        ("nqx", "other"),
    ],
)
def test_dataset_groups_follow_search_r1(name: str, group: str) -> None:
    assert dataset_group(name) == group


def test_dataset_names_resolve_inside_the_data_root(tmp_path: Path) -> None:
    for name in ("nq_open_oracle", "hotpotqa_dev", "flashrag_quickstart_nq", "bamboogle"):
        (tmp_path / name).mkdir()
    assert resolve_dataset("hotpotqa", tmp_path) == tmp_path / "hotpotqa_dev"
    assert resolve_dataset("bamboogle", tmp_path) == tmp_path / "bamboogle"
    assert resolve_dataset(str(tmp_path / "bamboogle"), None) == tmp_path / "bamboogle"
    with pytest.raises(ConfigError, match=r"names several folders.*flashrag_quickstart_nq, nq_open_oracle"):
        resolve_dataset("nq", tmp_path)
    with pytest.raises(ConfigError, match="names no folder"):
        resolve_dataset("musique", tmp_path)
    with pytest.raises(ConfigError, match="--data-root"):
        resolve_dataset("musique", None)
