"""Demonstrators: the oracle, the shortcut teacher, their mixtures, and what supervised warm-start keeps."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest
from scipy.stats import binom

import searchgym  # noqa: F401 - registers the env ids
from searchgym.agents.demonstrations import (
    generate_demonstrations,
    parse_demonstrator,
    read_demonstrations,
    write_demonstrations,
)
from searchgym.agents.scripted import shortcut_turns
from searchgym.errors import ConfigError, DataFormatError


def test_parse_demonstrator_names_and_mixtures() -> None:
    assert parse_demonstrator("oracle") == {"oracle": 1.0}
    assert parse_demonstrator("shortcut") == {"shortcut": 1.0}
    assert parse_demonstrator("mix:oracle=0.1,shortcut=0.9") == {"oracle": 0.1, "shortcut": 0.9}
    assert parse_demonstrator("mix:oracle=1, shortcut=3") == {"oracle": 0.25, "shortcut": 0.75}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("teacher", "unknown demonstrator"),
        ("mix:", "is not TEACHER=WEIGHT"),
        ("mix:oracle=0.1,wizard=0.9", "is not TEACHER=WEIGHT"),
        ("mix:oracle", "is not TEACHER=WEIGHT"),
        ("mix:oracle=a", "not a number"),
        ("mix:oracle=-1,shortcut=2", "finite and >= 0"),
        ("mix:oracle=nan", "finite and >= 0"),
        ("mix:oracle=0,shortcut=0", "sum to 0"),
        ("mix:oracle=1,oracle=2", "twice"),
    ],
)
def test_parse_demonstrator_refuses_what_it_cannot_read(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_demonstrator(spec)


def test_the_shortcut_answers_a_bridge_question_after_its_first_hop() -> None:
    env = gym.make("SearchQA-v0", split="train")
    base = env.unwrapped
    bridge = next(q for q in base.questions if q.kind == "bridge")
    first, second = (base.dataset.passage_index[p] for p in bridge.supporting_ids)
    assert shortcut_turns(base.dataset, bridge.id, "train") == [
        f"<search> {first.title} </search>",
        f"<answer> {second.title} </answer>",
    ]
    for kind in ("attribute", "comparison"):
        other = next(q for q in base.questions if q.kind == kind)
        assert shortcut_turns(base.dataset, other.id, "train") is None


def test_a_mixture_draws_its_shortcut_share_on_bridge_questions() -> None:
    env = gym.make("SearchQA-v0", split="train")
    base = env.unwrapped
    demos = list(generate_demonstrations(env, 400, seed=3, demonstrator="mix:oracle=0.1,shortcut=0.9"))
    kinds = {q.id: q.kind for q in base.questions}
    bridge = [d for d in demos if kinds[d.question_id] == "bridge"]
    shortcut = [d for d in bridge if d.demonstrator == "shortcut"]
    # The shortcut's share of the bridge questions is Binomial(n, 0.9): inside its central 99.9 % range.
    low, high = binom.ppf([0.0005, 0.9995], len(bridge), 0.9)
    assert len(bridge) > 50 and low <= len(shortcut) <= high
    # Only bridge questions can be short-cut; the oracle plays (and solves) every other question.
    assert all(d.demonstrator == "oracle" for d in demos if kinds[d.question_id] != "bridge")
    assert all(d.reward == 0.0 for d in shortcut)
    assert sum(d.reward for d in demos if d.demonstrator == "oracle") >= 0.95 * (len(demos) - len(shortcut))
    tok = base.tokenizer
    text = tok.decode([t for t, s in zip(shortcut[0].tokens, shortcut[0].sources, strict=True) if s == 2])
    assert text.count("<search>") == 1 and text.endswith("</answer>")
    # The draw of episode i depends on (seed, i) only: a shorter file is a prefix of a longer one.
    again = list(generate_demonstrations(env, 40, seed=3, demonstrator="mix:oracle=0.1,shortcut=0.9"))
    assert [d.demonstrator for d in again] == [d.demonstrator for d in demos[:40]]


def test_the_teacher_travels_through_the_file(tmp_path: Path) -> None:
    env = gym.make("SearchQA-v0", split="train")
    path = tmp_path / "demos.jsonl"
    write_demonstrations(generate_demonstrations(env, 30, demonstrator="shortcut"), path)
    demos = read_demonstrations(path)
    assert {d.demonstrator for d in demos} == {"oracle", "shortcut"}
    # A file written before teachers were recorded reads as the oracle's.
    record = json.loads(path.read_text().splitlines()[0])
    del record["demonstrator"]
    path.write_text(json.dumps(record) + "\n" + json.dumps({**record, "demonstrator": "wizard"}) + "\n")
    with pytest.raises(DataFormatError, match=r"demos.jsonl:2: .*demonstrator must be one of"):
        read_demonstrations(path)
    path.write_text(json.dumps(record) + "\n")
    assert read_demonstrations(path)[0].demonstrator == "oracle"


def test_the_question_kind_travels_through_the_file(tmp_path: Path) -> None:
    env = gym.make("SearchQA-v0", split="train")
    path = tmp_path / "demos.jsonl"
    write_demonstrations(generate_demonstrations(env, 12), path)
    questions = env.unwrapped.questions
    assert [d.kind for d in read_demonstrations(path)] == [q.kind for q in questions[:12]]
    assert {"attribute", "bridge"} <= {q.kind for q in questions[:12]}
    record = json.loads(path.read_text().splitlines()[0])
    del record["kind"]  # a file that names no kind reads as kind ""
    path.write_text(json.dumps(record) + "\n" + json.dumps({**record, "kind": 3}) + "\n")
    with pytest.raises(DataFormatError, match=r"demos.jsonl:2: .*kind must be a string"):
        read_demonstrations(path)
    path.write_text(json.dumps(record) + "\n")
    assert read_demonstrations(path)[0].kind == ""


def test_sft_keeps_unrewarded_demonstrations_only_when_asked(tmp_path: Path) -> None:
    from searchgym.agents.sft import load_sft_demonstrations
    from searchgym.agents.training.config import SFTConfig

    env = gym.make("SearchQA-v0", split="train")
    path = tmp_path / "demos.jsonl"
    write_demonstrations(generate_demonstrations(env, 30, demonstrator="shortcut"), path)
    tokenizer = env.unwrapped.tokenizer
    every = read_demonstrations(path)
    rewarded = [d for d in every if d.reward > 0]
    assert 0 < len(rewarded) < len(every)
    kept = load_sft_demonstrations(SFTConfig(demos=str(path)), tokenizer)
    assert [d.question_id for d in kept] == [d.question_id for d in rewarded]
    kept = load_sft_demonstrations(SFTConfig(demos=str(path), keep_unrewarded=True), tokenizer)
    assert len(kept) == len(every)
    generated = load_sft_demonstrations(
        SFTConfig(demo_episodes=30, demonstrator="shortcut", keep_unrewarded=True), tokenizer
    )
    assert [d.demonstrator for d in generated] == [d.demonstrator for d in every]
    with pytest.raises(ConfigError, match="unknown demonstrator"):
        SFTConfig(demonstrator="wizard")
