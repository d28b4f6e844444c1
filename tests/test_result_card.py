"""The result card: what it holds, ``eval --out`` and ``benchmark`` writing it, and agents whose cards differ
refused a pairing, the field named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchgym.app.benchmark import build_report, markdown_report
from searchgym.app.cli import main
from searchgym.envs import EnvSpec
from searchgym.errors import ConfigError
from searchgym.result_card import CARD_FIELDS, card_differences, check_cards, result_card

from .conftest import QUICKSTART, require

WORLD = EnvSpec(split="test").to_record()


def card(**changes: object) -> dict[str, object]:
    return result_card({**WORLD, **changes}, env="SearchQA-v0", temperature=0.0, samples=1, seed=0)


def test_every_setting_on_the_card_changes_it() -> None:
    base = card()
    assert list(base) == list(CARD_FIELDS)
    assert base["corpus_sha256"].startswith("sha256:") and base["questions_sha256"].startswith("sha256:")
    assert base["normaliser_sha256"].startswith("sha256:")
    changed = {
        "split": card(split="validation"),
        "corpus_sha256": card(world_seed=1),
        "topk": card(topk=5),
        "max_turns": card(max_turns=2),
        "prompt_style": card(prompt_style="chat"),
        "reward": card(reward="f1"),
        "retriever": card(retriever="rank_bm25"),
        "retriever_faults": card(retriever_faults="empty=0.5,seed=1"),
        "temperature": result_card(WORLD, env="SearchQA-v0", temperature=1.0, samples=1, seed=0),
        "samples": result_card(WORLD, env="SearchQA-v0", temperature=0.0, samples=4, seed=0),
        "seed": result_card(WORLD, env="SearchQA-v0", temperature=0.0, samples=1, seed=7),
    }
    for field, other in changed.items():
        assert field in card_differences(base, other), field
    # An agent's own sizes are not on the card: a model trained on short turns still compares.
    assert card_differences(base, card(max_turn_tokens=48, max_context_tokens=1024)) == []


def test_a_recording_cassette_carries_the_retriever_it_records(tmp_path: Path) -> None:
    cassette = tmp_path / "c.json"
    recording = card(retriever=f"cassette:{cassette};record-missing=bm25")
    assert card_differences(recording, card()) == []
    cassette.write_text("{}")
    replay = card(retriever=f"cassette:{cassette}")
    assert card_differences(replay, card()) == ["retriever", "index_sha256"]


def test_differing_cards_are_refused_naming_the_field() -> None:
    check_cards({"a": card(), "b": card()}, "dataset world")
    with pytest.raises(
        ConfigError, match=r"cannot pair b with a on dataset world: .* differ in topk \(3 vs 5\)"
    ):
        check_cards({"a": card(), "b": card(topk=5)}, "dataset world")
    records = [
        {"question_id": "q0", "em": 1.0, "f1": 1.0, "searches": 1, "end_reason": "answered", "answer": "x"}
    ]
    episodes = {"a": {"world": records}, "b": {"world": records}}
    datasets = [{"name": "world", "group": "other"}]
    report = build_report(episodes, datasets, cards={"a": {"world": card()}, "b": {"world": card()}})
    assert report["datasets"][0]["card"] == card()
    table = markdown_report(report)
    assert "## Result card" in table
    assert f"| world | SearchQA-v0 | test | {card()['questions_sha256'][7:19]} |" in table
    with pytest.raises(ConfigError, match="differ in prompt_style"):
        build_report(
            episodes, datasets, cards={"a": {"world": card()}, "b": {"world": card(prompt_style="chat")}}
        )


def test_eval_out_writes_the_card_into_its_manifest(tmp_path: Path) -> None:
    out = tmp_path / "e.jsonl"
    argv = ["eval", "--agent", "random", "--episodes", "2", "--samples", "2", "--seed", "3", "--topk", "2",
            "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    written = json.loads((tmp_path / "e.jsonl.manifest.json").read_text())["card"]
    assert written == result_card({**WORLD, "topk": 2}, env="SearchQA-v0", temperature=0.0, samples=2, seed=3)


@pytest.mark.slow
def test_benchmark_reports_the_card_and_refuses_a_pair_played_under_another(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quick = require(QUICKSTART)
    out = tmp_path / "B"
    base = [
        "benchmark",
        "--no-progress",
        "--datasets",
        str(quick),
        "--episodes",
        "3",
        "--out",
        str(out),
        "--json",
    ]
    assert main([*base, "--agent", "oracle"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    shown = report["datasets"][0]["card"]
    assert shown["topk"] == 3 and shown["samples"] == 1 and shown["corpus_sha256"].startswith("sha256:")
    # The oracle's pair, cached, as a run with another answer normaliser left it (its identity unchanged).
    record = next((out / "pairs").glob("*/*.jsonl.run.json"))
    saved = json.loads(record.read_text())
    saved["card"]["normaliser_sha256"] = "sha256:" + "0" * 64
    record.write_text(json.dumps(saved))
    assert main([*base, "--agent", "oracle", "--agent", "heuristic"]) == 2
    err = capsys.readouterr().err
    assert "pair oracle on flashrag_quickstart_nq: cached" in err
    assert "cannot pair heuristic with oracle on dataset flashrag_quickstart_nq" in err
    assert "differ in normaliser_sha256" in err


def test_the_audited_shares_round_trip_through_json() -> None:
    import json

    from searchgym.result_card import NOT_AUDITED, card_audit, with_audit

    shares = {
        "questions": 40, "topk": 3, "unanswerable": 0.05, "answer_absent": 0.025, "gold_missing": 0.025,
        "unreachable": 0.1, "unanswerable_count": 2, "answer_absent_count": 1, "gold_missing_count": 1,
        "unreachable_count": 4, "kinds": {"bridge": {}},
    }  # fmt: skip
    card = {"env": "SearchQA-v0", "split": "test"}
    audited = with_audit(card, shares)
    back = json.loads(json.dumps(audited))
    assert card_audit(back) == {k: v for k, v in shares.items() if k != "kinds"}
    assert card_differences(back, card) == []  # the audit follows from the fields: no card differs by it
    plain = with_audit(card, None)
    assert plain["audit"] == NOT_AUDITED and card_audit(json.loads(json.dumps(plain))) is None
