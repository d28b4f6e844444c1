"""What a benchmark score means: the generated world in ``searchgym benchmark``, retriever ablations and
reliance (an agent that never searches relies on search not at all, the oracle wholly), the audit on the
result card, the answerable-only figures, near misses, and one agent name in the table and in ``view``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from searchgym.app.cli import main
from searchgym.audit import audit_questions, audit_shares
from searchgym.result_card import card_audit

# An agent that never searches and answers from "memory" (the golden answer the env's info shows it).
MEMORY_AGENT = textwrap.dedent(
    """
    from searchgym.agents.base import Agent

    class FromMemory(Agent):
        name = "memory"

        def __init__(self, env):
            self.tokenizer = env.unwrapped.tokenizer
            self.ids = []

        def reset(self, info, seed=None):
            self.ids = list(self.tokenizer.encode(f"<answer> {info['golden_answers'][0]} </answer>"))

        def act(self, observation, info):
            return self.ids.pop(0) if self.ids else int(self.tokenizer.eos_token_id or 0)
    """
)

EPISODES = "12"


@pytest.fixture(scope="module")
def ablated(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """The oracle and the memory agent on the generated world, with all three ablations, audited."""
    root = tmp_path_factory.mktemp("reliance")
    (root / "memorypkg.py").write_text(MEMORY_AGENT)
    out = root / "B"
    argv = [
        "benchmark", "--no-progress", "--agent", "oracle", "--agent", "memorypkg:FromMemory",
        "--datasets", "world", "--episodes", EPISODES, "--ablate", "empty,random,shuffled",
        "--answerable-only", "--out", str(out),
    ]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        assert main(argv) == 0
    (root / "first.md").write_text((out / "benchmark.md").read_text())  # a later test reruns into out
    return json.loads((out / "benchmark.json").read_text()), out


def test_the_world_is_benchmarked(ablated: tuple[dict[str, Any], Path]) -> None:
    report, out = ablated
    assert [d["name"] for d in report["datasets"]] == ["world"]
    assert report["datasets"][0]["questions"] == int(EPISODES)
    assert report["datasets"][0]["card"]["split"] == "test"
    rows = {r["agent"]: r for r in report["results"]}
    assert rows["oracle"]["em"]["mean"] == 1.0 and rows["memory"]["em"]["mean"] == 1.0
    assert len(list((out / "pairs").glob("*/world.jsonl"))) == 2


def test_reliance_is_zero_without_search_and_the_em_of_the_oracle(
    ablated: tuple[dict[str, Any], Path],
) -> None:
    report, _ = ablated
    rows = {r["agent"]: r for r in report["reliance"]}
    memory, oracle = rows["memory"], rows["oracle"]
    assert set(memory["ablations"]) == {"empty", "random", "shuffled"}
    assert (
        memory["reliance"]["mean"] == 0.0 and memory["reliance"]["low"] <= 0.0 <= memory["reliance"]["high"]
    )
    assert memory["real"]["search_rate"]["mean"] == 0.0
    assert all(a["search_rate"]["mean"] == 0.0 for a in memory["ablations"].values())
    em = {r["agent"]: r["em"]["mean"] for r in report["results"]}
    assert oracle["reliance"]["mean"] == em["oracle"] == 1.0
    assert oracle["reliance"]["low"] > 0.0  # a drop these questions show
    for kind in ("empty", "random", "shuffled"):  # no ablation leaves the oracle its evidence
        assert oracle["ablations"][kind]["em"]["mean"] == 0.0
        assert oracle["ablations"][kind]["search_rate"]["mean"] == 1.0
    table = (ablated[1].parent / "first.md").read_text()
    assert "## Retriever reliance" in table


def test_the_ablated_pairs_are_cached_by_kind(
    ablated: tuple[dict[str, Any], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out = ablated
    files = sorted(p.name for p in (out / "pairs").glob("*/world.ablate-*.jsonl"))
    assert files == sorted(f"world.ablate-{k}.jsonl" for k in ("empty", "random", "shuffled") for _ in "ab")
    argv = [
        "benchmark", "--no-progress", "--agent", "oracle", "--datasets", "world", "--episodes", EPISODES,
        "--ablate", "empty", "--out", str(out), "--json",
    ]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "pair oracle on world: cached" in err and "pair oracle on world, empty retriever: cached" in err


def test_the_card_carries_the_audit_and_the_answerable_figures_sit_beside(
    ablated: tuple[dict[str, Any], Path], world: Any, retriever: Any
) -> None:
    report, out = ablated
    audit = card_audit(report["datasets"][0]["card"])
    expected = audit_shares(audit_questions(world, world.questions("test")[: int(EPISODES)], retriever, 3))
    assert audit is not None and audit == {k: expected[k] for k in audit}
    assert audit["unanswerable_count"] == 0 and audit["questions"] == int(EPISODES)
    part = {r["agent"]: r for r in report["answerable"]["results"]}
    assert part["oracle"]["questions"] == int(EPISODES) and part["oracle"]["em"]["mean"] == 1.0
    table = (out.parent / "first.md").read_text()
    assert "## Exact match on every question and on the answerable ones" in table
    assert "- world: 12 questions; unanswerable from the corpus 0 (0.0%" in table


def test_an_unaudited_card_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["benchmark", "--no-progress", "--agent", "heuristic", "--datasets", "world", "--episodes", "3"]
    assert main([*argv, "--split", "validation", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["datasets"][0]["card"]["audit"] == "not audited"
    assert report["datasets"][0]["card"]["split"] == "validation"
    assert main([*argv, "--split", "validation"]) == 0
    assert "- world: not audited" in capsys.readouterr().out


def exit_code(argv: list[str]) -> int:
    """The command's exit status, a usage error's (argparse exits) included."""
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--datasets", "world", "--ablate", "empty,blank"],
            "--ablate empty,blank: unknown ablation 'blank'",
        ),
        (["--datasets", "world", "--topk", "0"], "topk"),
    ],
)
def test_bad_benchmark_input_gets_one_line(
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert exit_code(["benchmark", "--no-progress", "--agent", "heuristic", "--episodes", "2", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) <= 2


def test_a_dataset_without_a_corpus_gets_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "test.jsonl").write_text('{"id": "a", "question": "q?", "golden_answers": ["x"]}\n')
    assert main(["benchmark", "--agent", "heuristic", "--datasets", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "no corpus.jsonl there" in err and len(err.splitlines()) == 1


def test_view_names_a_class_agent_as_the_benchmark_does(
    ablated: tuple[dict[str, Any], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report, out = ablated
    assert "memory" in report["agents"]  # the table's name, not memorypkg:FromMemory
    pair = next(p for p in (out / "pairs").glob("memorypkg*/world.jsonl"))
    monkeypatch.chdir(out.parent)  # where the benchmark ran, so the class imports
    page = tmp_path / "page.html"
    assert main(["view", str(pair), "--out", str(page)]) == 0
    text = page.read_text()
    assert '"agent":"memory"' in text and "memorypkg:FromMemory" not in text


def test_answerable_only_leaves_out_what_the_corpus_cannot_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ...test_audit import CORPUS, QUESTIONS

    folder = tmp_path / "scripted"
    folder.mkdir()
    lines = [json.dumps({"id": i, "contents": f'"{t}"\n{x}'}) for i, t, x in CORPUS]
    (folder / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "test.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    argv = ["benchmark", "--no-progress", "--agent", "oracle", "--datasets", str(folder), "--answerable-only"]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    audit = card_audit(report["datasets"][0]["card"])
    assert audit is not None and audit["unanswerable_count"] == 2 and audit["unreachable_count"] == 1
    (whole,) = report["results"]
    (part,) = report["answerable"]["results"]
    assert whole["questions"] == 4 and part["questions"] == 2  # "ok" and "deep"
    # The oracle retrieves the gold where one is named; "deep" names none, so it answers without a search.
    assert part["em"]["mean"] == 1.0


def test_reliance_rows_on_hand_made_records() -> None:
    from searchgym.errors import ConfigError
    from searchgym.score_meaning import reliance_rows

    def records(ems: list[float], searches: int = 1) -> list[dict[str, Any]]:
        return [{"question_id": str(i // 2), "em": em, "searches": searches} for i, em in enumerate(ems)]

    real = {"a": {"d": records([1, 1, 1, 0, 0, 0])}}
    ablated = {"a": {"d": {"empty": records([1, 0, 0, 0, 0, 0], searches=0)}}}
    (row,) = reliance_rows(real, ablated, ["d"], samples=2, resamples=200)
    # mean@2 per question: real 1, 0.5, 0; empty 0.5, 0, 0 -> a drop of 1/3
    assert row["reliance"]["mean"] == pytest.approx(1 / 3)
    assert row["real"]["search_rate"]["mean"] == 1.0
    assert row["ablations"]["empty"]["search_rate"]["mean"] == 0.0
    moved = {"a": {"d": {"empty": records([1, 0, 0, 0, 0, 0, 0, 0])}}}
    with pytest.raises(ConfigError, match="the empty ablation played other questions"):
        reliance_rows(real, moved, ["d"], samples=2)
