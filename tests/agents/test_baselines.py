from pathlib import Path

import gymnasium as gym
import pytest

import searchgym  # noqa: F401
from searchgym.agents import (
    HeuristicAgent,
    OracleAgent,
    RandomAgent,
    evaluate,
    generate_demonstrations,
    read_demonstrations,
    write_demonstrations,
)
from searchgym.agents.heuristic import extract_answer, parse_information
from searchgym.errors import DataFormatError


@pytest.mark.parametrize(
    ("question", "passages", "expected"),
    [
        (
            "In what year was Ana Bel born?",
            [("Ana Bel", "Ana Bel (born 1917 in Kobeir) is a chemist.")],
            "1917",
        ),
        (
            "What is the occupation of Ana Bel?",
            [("Ana Bel", "Ana Bel (born 1917) is an economist.")],
            "economist",
        ),
        (
            "Who was born earlier, Ana Bel or Tom Ru?",
            [("Ana Bel", "Ana Bel (born 1950)."), ("Tom Ru", "Tom Ru (born 1901).")],
            "Tom Ru",
        ),
        (
            "Who founded Lyku Works?",
            [("Lyku Works", "Lyku Works is a firm founded in 1901 by Tom Ru.")],
            "Tom Ru",
        ),
        ("Who founded X?", [], ""),
    ],
)
def test_extract_answer_rule(question: str, passages: list[tuple[str, str]], expected: str) -> None:
    assert extract_answer(question, passages) == expected


def test_parse_information_reads_the_last_block() -> None:
    text = '<information>Doc 1(Title: "Old") x</information> ... <information>Doc 1(Title: "A") a b\nDoc 2(Title: "B") c</information>'
    assert parse_information(text) == [("A", "a b"), ("B", "c")]


def test_heuristic_beats_random_and_stays_below_oracle() -> None:
    env = gym.make("SearchQA-v0", split="test")
    summary = evaluate(env, HeuristicAgent(env.unwrapped.tokenizer), 200)
    assert 0.2 < summary.em < 0.99
    assert summary.valid_format == 1.0 and summary.searches == 1.0


@pytest.mark.parametrize("cls", [RandomAgent, HeuristicAgent, OracleAgent], ids=lambda c: c.__name__)
def test_every_builtin_agent_is_built_from_the_env(cls: type) -> None:
    """``Agent(env)``, wrapped or not, plays as ``Agent.from_env(env)`` does: the same episodes."""
    env = gym.make("SearchQA-v0", split="test")
    for given in (env, env.unwrapped):
        by_env, by_factory = evaluate(env, cls(given), 6), evaluate(env, cls.from_env(env), 6)
        assert [r.transcript for r in by_env.records] == [r.transcript for r in by_factory.records]
    if cls is OracleAgent:
        assert by_env.em == 1.0
    with pytest.raises(TypeError, match="needs an env, or a dataset with its split and tokenizer"):
        OracleAgent(env.unwrapped.dataset)


def test_demonstrations_round_trip_and_are_oracle_transcripts(tmp_path: Path) -> None:
    env = gym.make("SearchQA-v0", split="train")
    path = tmp_path / "demos.jsonl"
    assert write_demonstrations(generate_demonstrations(env, 20), path) == 20
    demos = read_demonstrations(path)
    assert len(demos) == 20 and all(d.reward == 1.0 for d in demos)
    tok = env.unwrapped.tokenizer
    policy = [t for t, s in zip(demos[0].tokens, demos[0].sources, strict=True) if s == 2]
    assert tok.decode(policy).startswith("<search>") and tok.decode(policy).endswith("</answer>")
    path.write_text(path.read_text().splitlines()[0] + '\n{"question_id": "q", "tokens": [1]}\n')
    with pytest.raises(DataFormatError, match=r"demos.jsonl:2:"):
        read_demonstrations(path)


def test_segment_agent_drops_leftovers_between_episodes() -> None:
    from searchgym.agents import SegmentAgent

    class Fixed(SegmentAgent):
        def generate(self, observations, infos):  # type: ignore[no-untyped-def]
            return [[1, 2, 3]]

    agent = Fixed()
    assert agent.act({}, {}) == 1
    agent.reset({})
    assert agent.act({}, {}) == 1  # not 2: the previous episode's leftovers are gone
