from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import searchgym  # noqa: F401
from searchgym.agents import Agent, OracleAgent, RandomAgent, evaluate, run_episode


class FuzzAgent(Agent):
    """Random tokens mixed with whole tag phrases, so that random episodes also search and answer."""

    def __init__(self, tokenizer, seed: int = 0) -> None:  # type: ignore[no-untyped-def]
        self.vocab = tokenizer.vocab_size
        self.phrases = [
            tokenizer.encode(p) for p in ("<search>", " q", "</search>", "<answer>", " a", "</answer>")
        ]
        self.phrases.append([tokenizer.eos_token_id])
        self.rng = np.random.default_rng(seed)
        self.queue: list[int] = []

    def act(self, observation, info) -> int:  # type: ignore[no-untyped-def]
        if not self.queue:
            if self.rng.random() < 0.5:
                self.queue = list(self.phrases[self.rng.integers(len(self.phrases))])
            else:
                self.queue = [int(self.rng.integers(self.vocab))]
        return self.queue.pop(0)


def test_oracle_reaches_em_099_on_500_world_test_questions() -> None:
    env = gym.make("SearchQA-v0", split="test")
    base = env.unwrapped
    summary = evaluate(env, OracleAgent(base.dataset, "test", base.tokenizer), 500)
    assert summary.episodes == 500
    assert summary.em >= 0.99
    assert summary.valid_format >= 0.99 and summary.retrieval_recall is not None


def test_oracle_reaches_em_095_on_hotpotqa(hotpot_dir: Path) -> None:
    env = gym.make("SearchQA-v0", dataset=str(hotpot_dir), split="test")
    base = env.unwrapped
    summary = evaluate(env, OracleAgent(base.dataset, "test", base.tokenizer), len(base.questions))
    assert summary.episodes == 1100
    assert summary.em >= 0.95


@pytest.mark.slow
def test_random_policy_5000_episodes_end_within_limits() -> None:
    max_turns, max_turn_tokens, max_context = 4, 24, 1024
    env = gym.make(
        "SearchQA-v0", max_turns=max_turns, max_turn_tokens=max_turn_tokens, max_context_tokens=max_context
    )
    base = env.unwrapped
    tok = base.tokenizer
    agent = FuzzAgent(tok, seed=0)
    reasons: dict[str, int] = {}
    searched = 0
    for episode in range(5000):
        record = run_episode(env, agent, seed=episode)
        info = record.info
        assert info["end_reason"] in ("answered", "turn_budget", "context_limit")
        assert info["turn"] <= max_turns
        assert info["length"] <= max_context
        assert record.steps <= max_turns * max_turn_tokens
        reasons[info["end_reason"]] = reasons.get(info["end_reason"], 0) + 1
        searched += info["searches"] > 0
    assert reasons.get("answered", 0) > 0 and reasons.get("turn_budget", 0) > 0 and searched > 0
    # Plain uniform random tokens.
    uniform = RandomAgent(tok.vocab_size, seed=1)
    for episode in range(5000):
        record = run_episode(env, uniform, seed=episode)
        assert record.info["end_reason"] in ("answered", "turn_budget", "context_limit")
        assert record.steps <= max_turns * max_turn_tokens


def test_oracle_demonstration_tokens_are_policy_tokens() -> None:
    env = gym.make("SearchQA-v0", split="test")
    base = env.unwrapped
    record = run_episode(
        env, OracleAgent(base.dataset, "test", base.tokenizer), options={"question_index": 5}
    )
    obs_sources = base.episode.sources[: base.episode.length]
    policy_text = base.tokenizer.decode(base.episode.tokens[: base.episode.length][obs_sources == 2])
    assert policy_text.endswith(f"<answer> {record.info['golden_answers'][0]} </answer>")
    assert np.count_nonzero(obs_sources == 2) == record.steps


# -- all-hop recall and a true-upper-bound oracle ------------------------------------------------------------


def tiny_multihop() -> Any:
    """Four-hop questions over passages whose titles are shared, so a title query cannot pin them."""
    from searchgym.data import Dataset, Passage, Question

    passages = [
        Passage(f"p{i}", "Shared Title", f"fact {word} number {i} about the shared subject")
        for i, word in enumerate(["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"])
    ]
    passages += [
        Passage(f"x{i}", "Shared Title", f"distractor {i} about the shared subject") for i in range(6)
    ]
    passages[4] = Passage("p4", "Echo Page", "fact echo number 4 about the shared subject")  # unique title
    questions = [
        Question("q0", "Which four facts?", ("alpha",), ("p0", "p1", "p2", "p3")),
        Question("q1", "Which two facts?", ("echo",), ("p4", "p5")),
    ]
    return Dataset("tiny", passages, {"test": questions})


def test_summary_reports_any_and_all_hop_recall() -> None:
    data = tiny_multihop()
    # Title-only queries, one hop per turn: some supporting passages are never retrieved.
    env = gym.make("SearchQA-v0", dataset=data, split="test", max_turns=3)
    base = env.unwrapped
    weak = evaluate(env, OracleAgent(base.dataset, "test", base.tokenizer, max_turns=3), 2)
    # q1 finds its uniquely titled passage but not the other: "any" counts it, "all" does not.
    assert weak.records[1].info["gold_retrieved"] and not weak.records[1].info["gold_all_retrieved"]
    assert weak.retrieval_recall is not None and weak.retrieval_recall_all is not None
    assert weak.retrieval_recall > weak.retrieval_recall_all
    for record in weak.records:
        info = record.info
        assert info["gold_all_retrieved"] == (info["gold_recall"] == 1.0)
    env.close()


def test_oracle_from_env_retrieves_every_supporting_passage() -> None:
    data = tiny_multihop()
    # Four hops in two search turns (max_turns 3): passages are packed two per query, pinned by their text.
    env = gym.make("SearchQA-v0", dataset=data, split="test", max_turns=3)
    summary = evaluate(env, OracleAgent.from_env(env), 2)
    assert summary.retrieval_recall_all == 1.0 and summary.em == 1.0
    assert [r.info["searches"] for r in summary.records] == [2, 2]
    env.close()


def test_oracle_from_env_is_an_upper_bound_on_hotpotqa(hotpot_dir: Path) -> None:
    env = gym.make("SearchQA-v0", dataset=str(hotpot_dir), split="test")
    summary = evaluate(env, OracleAgent.from_env(env), 300)
    assert summary.retrieval_recall_all == 1.0 and summary.em >= 0.95
    env.close()
