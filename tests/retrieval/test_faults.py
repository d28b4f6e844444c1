"""Retriever faults: rates within binomial bounds, reproducible from the seed, independent of the agent."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import searchgym  # noqa: F401 - registers the env ids
from searchgym.agents import HeuristicAgent, RandomAgent
from searchgym.agents.evaluate import run_episode
from searchgym.app.cli import main
from searchgym.data import load_dataset
from searchgym.envs import SearchQAEnv, SearchQAVectorEnv
from searchgym.errors import ConfigError
from searchgym.retrieval import FaultyRetriever, RetrieverFaults, make_retriever
from searchgym.retrieval.faults import FAULT_KINDS, apply_faults, parse_faults

PASSAGES = load_dataset().passages
RATES = RetrieverFaults(
    empty=0.1, replace=0.25, replace_k=2, shuffle=0.5, truncate=0.05, latency=0.3, latency_s=0.0
)


def within_binomial(count: int, n: int, p: float, z: float = 4.5) -> bool:
    """``count`` successes of ``n`` lie within ``z`` standard deviations of ``n * p`` (a false alarm about
    once in 150,000 per check)."""
    return abs(count - n * p) <= z * math.sqrt(n * p * (1 - p)) + 1e-9


def test_fault_rates_are_within_binomial_bounds() -> None:
    hits = make_retriever("bm25", PASSAGES).search(["zorvath founder"], 3)[0]
    n = 4000
    rng = np.random.default_rng(11)
    counts = dict.fromkeys(FAULT_KINDS, 0)
    both = 0
    for _ in range(n):
        _, fired, _ = apply_faults(hits, RATES, rng, PASSAGES)
        for kind in fired:
            counts[kind] += 1
        both += "shuffle" in fired and "latency" in fired
    for kind in FAULT_KINDS:
        assert within_binomial(counts[kind], n, getattr(RATES, kind)), (kind, counts[kind])
    assert within_binomial(both, n, RATES.shuffle * RATES.latency)  # drawn independently


def test_each_fault_does_what_it_says() -> None:
    hits = make_retriever("bm25", PASSAGES).search(["zorvath founder"], 3)[0]
    ids = [h.passage_id for h in hits]
    rng = np.random.default_rng(0)

    def only(kind: str, **options: float) -> list:  # type: ignore[type-arg]
        faults = RetrieverFaults(**{kind: 1.0, **options})  # type: ignore[arg-type]
        out, fired, delay = apply_faults(hits, faults, rng, PASSAGES)
        assert fired == (kind,)
        return out

    assert only("empty") == []
    shuffled = [[h.passage_id for h in only("shuffle")] for _ in range(20)]
    assert all(sorted(s) == sorted(ids) for s in shuffled) and any(s != ids for s in shuffled)
    replaced = only("replace", replace_k=2)
    new = [h.passage_id for h in replaced if h.passage_id not in ids]
    assert len(new) == 2 and len({h.passage_id for h in replaced}) == 3
    assert [h.score for h in replaced] == [h.score for h in hits]  # ranks keep their scores
    for h, cut in zip(hits, only("truncate", truncate_words=4), strict=True):
        assert cut.text.split() == h.text.split()[:4]
        assert cut.contents.split("\n")[0] == h.contents.split("\n")[0]  # the title line is kept
    out, fired, delay = apply_faults(hits, RetrieverFaults(latency=1.0, latency_s=0.25), rng)
    assert out == list(hits) and fired == ("latency",) and delay == 0.25


def test_every_search_draws_the_same_amount() -> None:
    """The j-th search's faults depend on the seed and j only, not on the results or earlier faults."""
    a, b = np.random.default_rng(3), np.random.default_rng(3)
    hits = make_retriever("bm25", PASSAGES).search(["zorvath founder"], 3)[0]
    for j in range(200):
        _, fired_a, _ = apply_faults(hits if j % 2 else [], RATES, a, PASSAGES)
        _, fired_b, _ = apply_faults(hits[:1], RATES, b, ())
        assert fired_a == fired_b


def search_episode_faults(env: gym.Env, episodes: int) -> list[tuple[str, ...]]:  # type: ignore[type-arg]
    """Plays the heuristic agent (one search per episode); the faults of every search, in order."""
    agent = HeuristicAgent(env.unwrapped.tokenizer)  # type: ignore[attr-defined]
    faults = []
    for i in range(episodes):
        run_episode(env, agent, seed=100 + i, options={"question_index": i})
        faults.extend(env.unwrapped.episode.search_faults)  # type: ignore[attr-defined]
    return faults


def test_env_faults_are_reproducible_counted_and_at_their_rates() -> None:
    spec = "empty=0.2,shuffle=0.4,replace=0.3,truncate=0.1,seed=9"
    env = gym.make("SearchQA-v0", split="test", retriever_faults=spec)
    first = search_episode_faults(env, 300)
    again = search_episode_faults(gym.make("SearchQA-v0", split="test", retriever_faults=spec), 300)
    assert first == again  # reproducible from the seeds
    other = search_episode_faults(
        gym.make("SearchQA-v0", split="test", retriever_faults=spec.replace("seed=9", "seed=10")), 300
    )
    assert other != first
    n = len(first)
    faults = parse_faults(spec)
    assert faults is not None and n >= 300
    for kind in ("empty", "shuffle", "replace", "truncate"):
        assert within_binomial(sum(kind in f for f in first), n, getattr(faults, kind)), kind
    info = env.unwrapped.episode.info()  # type: ignore[attr-defined]
    assert set(info["retrieval_faults"]) == set(FAULT_KINDS)
    assert "retrieval_faults" not in gym.make("SearchQA-v0").unwrapped.reset(seed=0)[1]  # type: ignore[attr-defined]


def test_faults_are_independent_of_the_agent_and_of_the_question_draw() -> None:
    spec = "empty=0.5,shuffle=0.5,seed=1"
    # Two agents that search differently: the j-th search of an episode gets the same faults.
    env = SearchQAEnv(split="test", retriever_faults=spec, max_turns=3)
    plans = {
        "a": "<search> zorvath founder </search>",
        "b": "<search> kestrel bay city of the institute </search>",
    }
    seen = {}
    for name, text in plans.items():
        env.reset(seed=5)
        for _ in range(2):
            for t in env.tokenizer.encode(text):
                env.step(t)
        seen[name] = env.episode.search_faults
    assert seen["a"] == seen["b"] and len(seen["a"]) == 2
    # The env's question draws are the same with and without faults.
    plain = SearchQAEnv(split="test")
    for env_ in (env, plain):
        env_.reset(seed=3)
    assert [env.reset()[1]["question_id"] for _ in range(5)] == [
        plain.reset()[1]["question_id"] for _ in range(5)
    ]
    # Drawing from the global or an agent's generator between searches changes nothing.
    env.reset(seed=5)
    for _ in range(2):
        np.random.default_rng(123).random(1000)
        RandomAgent(8192, seed=7).rng.random(10)
        np.random.random(10)
        for t in env.tokenizer.encode(plans["a"]):
            env.step(t)
    assert env.episode.search_faults == seen["a"]


def test_a_vector_sub_env_draws_its_own_faults() -> None:
    spec = "empty=0.5,shuffle=0.5,truncate=0.5,seed=2"
    text_a = "<search> zorvath founder </search>"
    results = []
    for others_search in (True, False):
        envs = SearchQAVectorEnv(num_envs=3, autoreset_mode="Disabled", retriever_faults=spec)
        envs.reset(seed=8)
        seg = envs.tokenizer.encode(text_a)
        for _ in range(2):
            envs.step_segments([seg, seg if others_search else None, seg if others_search else None])
        results.append(envs.episodes[0].search_faults)
        infos = envs.episode_infos()
        assert sum(infos[0]["retrieval_faults"].values()) == sum(
            len(f) for f in envs.episodes[0].search_faults
        )
    assert results[0] == results[1]


def test_latency_of_a_batch_is_waited_once() -> None:
    envs = SearchQAVectorEnv(
        num_envs=4, autoreset_mode="Disabled", retriever_faults="latency=1,latency_s=0.3"
    )
    envs.reset(seed=0)
    seg = envs.tokenizer.encode("<search> zorvath founder </search>")
    start = time.perf_counter()
    envs.step_segments([seg] * 4)
    elapsed = time.perf_counter() - start
    assert 0.3 <= elapsed < 1.2  # one wait of 0.3 s, not four


def test_faulty_retriever_wraps_any_retriever() -> None:
    inner = make_retriever("bm25", PASSAGES)
    wrapped = FaultyRetriever(inner, {"empty": 1.0, "seed": 4})
    assert wrapped.search(["zorvath founder", "kestrel"], 3) == [[], []]
    assert wrapped.counts["empty"] == 2


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("empty=1.5", "in \\[0, 1\\]"),
        ("emptiness=0.1", "write name=value"),
        ("empty", "write name=value"),
        ("empty=x", "not a number"),
        ({"dropout": 0.1}, "unknown retriever fault options"),
        ({"replace_k": 0}, "replace_k must be an integer >= 1"),
        ({"latency_s": -1}, "latency_s"),
        (3, "must be None"),
    ],
)
def test_bad_fault_specs_fail_listing_what_is_valid(spec: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_faults(spec)
    with pytest.raises(ConfigError):
        SearchQAEnv(retriever_faults=spec)


def test_eval_counts_faults_in_its_table_and_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "e.jsonl"
    argv = ["eval", "--agent", "heuristic", "--episodes", "30", "--no-progress", "--out", str(out)]
    assert main([*argv, "--retriever-faults", "empty=1,seed=0", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert metrics["retrieval_faults"] == pytest.approx(np.mean([r["searches"] for r in records]))
    assert all(r["retrieval_faults"]["empty"] == r["searches"] for r in records)
    assert json.loads((tmp_path / "e.jsonl.manifest.json").read_text())["retriever"]["faults"]["empty"] == 1.0
    assert main([*argv, "--retriever-faults", "shuffle=0.5"]) == 0
    assert "retrieval_faults" in capsys.readouterr().out
    assert main(argv) == 0
    assert "retrieval_faults" not in capsys.readouterr().out  # no faults, no column
