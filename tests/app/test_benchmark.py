"""The benchmark report from hand-built episode records: figures, averages, paired comparisons, table, plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from searchgym.app.benchmark import build_report, dataset_group, markdown_report, plot_report, resolve_dataset
from searchgym.errors import ConfigError
from searchgym.stats import mover_sum, paired_difference, wilson


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
    report = build_report(two_agents(), DATASETS)
    paired = {r["dataset"]: r for r in report["paired"]}
    nq = paired["nq_small"]
    # nq_small: base [0, 1, 0, 0], mine [1, 1, 0, 0]: the difference 1/4 with Newcombe's paired interval
    # (tests/test_stats.py checks it against published values); one question only "mine" gets right:
    # McNemar p = 2 * P[X <= 0; n = 1] = 1, and the interval covers 0 as well: they agree.
    assert nq["em_diff"] == paired_difference([0, 1, 0, 0], [1, 1, 0, 0]).to_json()
    assert nq["em_diff"]["mean"] == 0.25 and nq["em_diff"]["low"] < 0 < nq["em_diff"]["high"]
    assert (nq["only_agent"], nq["only_baseline"], nq["mcnemar_p"], nq["disagree"]) == (1, 0, 1.0, False)
    assert paired["hotpotqa_small"]["em_diff"] == paired_difference([1, 1], [1, 0]).to_json()
    # The average over datasets of the paired differences: (0.25 - 0.5) / 2, its limits by square and add.
    expected = mover_sum(
        [(0.5, paired_difference([0, 1, 0, 0], [1, 1, 0, 0])), (0.5, paired_difference([1, 1], [1, 0]))]
    )
    assert paired["all"]["em_diff"] == expected.to_json()
    assert paired["all"]["em_diff"]["mean"] == pytest.approx(-0.125)
    assert paired["all"]["mcnemar_p"] is None


def test_proportions_get_wilson_intervals_that_never_collapse() -> None:
    report = build_report(two_agents(), DATASETS)
    row = {(r["agent"], r["dataset"]): r for r in report["results"]}
    assert row["base", "hotpotqa_small"]["em"] == wilson(2, 2).to_json()  # 2/2: still a real interval
    assert row["base", "hotpotqa_small"]["em"]["low"] < 0.5
    assert row["mine", "hotpotqa_small"]["answered"] == wilson(0, 2).to_json()
    average = {(r["agent"], r["group"]): r for r in report["averages"]}
    assert average["base", "all"]["em"] == mover_sum([(0.5, wilson(1, 4)), (0.5, wilson(2, 2))]).to_json()


def test_the_table_flags_an_interval_and_mcnemar_that_disagree() -> None:
    # 8 of 8 discordant questions favour "mine" among 200: McNemar p = 2 / 2^8 < 0.05 and Newcombe's interval
    # excludes 0 too (they agree). On 20 questions, 10 both right, 5 only "b" right, 5 neither: McNemar's exact
    # p = 2 / 2^5 = 0.0625, while Newcombe's interval is [0.032, 0.434] (it excludes 0): flagged.
    agree = {"a": {"x": records([0] * 8 + [1] * 192)}, "b": {"x": records([1] * 8 + [1] * 192)}}
    row = build_report(agree, [{"name": "x", "group": "other"}])["paired"][0]
    assert row["mcnemar_p"] == pytest.approx(2 / 2**8) and row["em_diff"]["low"] > 0 and not row["disagree"]
    assert "⚠" not in markdown_report(build_report(agree, [{"name": "x", "group": "other"}]))
    split = {
        "a": {"x": records([1] * 10 + [0] * 5 + [0] * 5)},
        "b": {"x": records([1] * 10 + [1] * 5 + [0] * 5)},
    }
    report = build_report(split, [{"name": "x", "group": "other"}])
    row = report["paired"][0]
    assert row["mcnemar_p"] == pytest.approx(0.0625)
    assert (round(row["em_diff"]["low"], 3), round(row["em_diff"]["high"], 3)) == (0.032, 0.434)
    assert row["disagree"] is True
    assert "| x | b | 0.250 [0.032, 0.434] ⚠ |" in markdown_report(report)
    assert "⚠: the interval and McNemar's test disagree" in markdown_report(report)


def test_sampled_records_give_mean_at_k_pass_at_k_and_successes() -> None:
    # Two questions, K = 4 samples each: question 0 solved 1 time in 4, question 1 3 times in 4.
    played = records([1, 0, 0, 0, 1, 1, 0, 1])
    for i, record in enumerate(played):
        record["question_id"] = f"q{i // 4}"
    report = build_report({"a": {"x": played}}, [{"name": "x", "group": "other"}], samples=4, temperature=1.0)
    row = report["results"][0]
    assert row["em"]["mean"] == 0.5 and row["successes"] == [1, 3] and row["pass_at_k"] == 1.0
    assert row["questions"] == 2 and row["episodes"] == 8
    assert row["em"] == wilson(1.0, 2).to_json()  # mean@K over the 2 questions, not 8 trials
    table = markdown_report(report)
    assert "## Exact match, T=1, K=4 (exact match, mean@4" in table and "pass@4" in table
    assert "greedy" in markdown_report(build_report(two_agents(), DATASETS)).splitlines()[0]
    with pytest.raises(ConfigError, match="not 3 per question"):
        build_report({"a": {"x": played}}, [{"name": "x", "group": "other"}], samples=3)


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
    low, high = (
        paired_difference([0, 1, 0, 0], [1, 1, 0, 0]).to_json()["low"],
        paired_difference([0, 1, 0, 0], [1, 1, 0, 0]).high,
    )
    assert f"| nq_small | mine | 0.250 [{low:.3f}, {high:.3f}] | 1 | 1 / 0 |" in table
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
