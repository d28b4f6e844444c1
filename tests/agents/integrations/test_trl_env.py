"""The TRL tool env takes every EnvSpec field (``SearchQAToolEnv(spec, seed=…, **fields)``), applies those a
tool-calling episode can, and refuses a bad one with the spec's own message."""

from __future__ import annotations

from typing import Any

import pytest

from searchgym.agents.integrations.trl_env import NOT_APPLIED, SearchQAToolEnv, tool_env_dataset
from searchgym.data import load_dataset
from searchgym.envs import EnvSpec
from searchgym.errors import ConfigError, EpisodeFinishedError, InvalidActionError, RetrieverError
from searchgym.retrieval.faults import FaultyRetriever

from ...conftest import NON_DEFAULT_ENV, QUICKSTART, require


def test_every_field_arrives_in_the_spec_and_the_episode() -> None:
    env = SearchQAToolEnv(**NON_DEFAULT_ENV, seed=2)
    assert env.spec == EnvSpec(**NON_DEFAULT_ENV)
    assert SearchQAToolEnv(EnvSpec(**NON_DEFAULT_ENV)).spec == env.spec  # a spec, passed whole
    # data: the test split of the world of seed 1
    assert env._questions == load_dataset(None, world_seed=1).questions("test")
    # retrieval: rank_bm25 behind the injected faults
    assert isinstance(env._retriever, FaultyRetriever) and env._retriever.inner.name == "rank_bm25"
    # episode: 3 turns (2 searches and the answer), top 2, passages of 5 words, F1
    env.reset()
    for _ in range(2):
        text = env.search(env.question.question)
        docs = text.removeprefix("<information>").removesuffix("</information>").splitlines()
        assert len(docs) == 2 and all(len(d.partition(") ")[2].split()) <= 5 for d in docs)
    with pytest.raises(EpisodeFinishedError, match=r"no searches left \(2 allowed\)"):
        env.search("again")
    env.answer("x " + env.question.golden_answers[0])
    assert 0.0 < env.get_reward() < 1.0
    assert set(NOT_APPLIED) < set(EnvSpec.field_names())


def test_a_search_with_an_empty_query_is_refused_and_spends_nothing() -> None:
    """As ``SearchQA-v0`` reads an empty search as an invalid turn: no retrieval, no search spent."""
    env = SearchQAToolEnv(max_turns=2)
    env.reset()
    for query in ("", "  \n"):
        with pytest.raises(InvalidActionError, match="the query is empty"):
            env.search(query)
    assert env.hit_ids == [] and env.view.queries == []
    env.search(env.question.question)  # the one search of the budget is still there
    assert len(env.hit_ids) == 1


def test_a_failed_search_is_observed_or_raised() -> None:
    class Down:
        def search(self, queries: Any, k: int) -> Any:
            raise RetrieverError("the server is down")

    observing = SearchQAToolEnv(on_retrieval_error="observe")
    observing._retriever = Down()  # type: ignore[assignment]
    observing.reset()
    assert observing.search("x") == "<information>Search failed: the server is down</information>"
    assert observing.hit_ids == [[]]
    raising = SearchQAToolEnv()
    raising._retriever = Down()  # type: ignore[assignment]
    raising.reset()
    with pytest.raises(RetrieverError, match="down"):
        raising.search("x")


def test_the_question_mark_follows_the_spec() -> None:
    folder = str(require(QUICKSTART))
    question = load_dataset(folder).questions("test")[0]
    assert not question.question.endswith("?")
    kept = SearchQAToolEnv(dataset=folder, split="test").reset(question_id=question.id)
    bare = SearchQAToolEnv(dataset=folder, split="test", append_question_mark=False).reset(
        question_id=question.id
    )
    assert kept.endswith(question.question.strip() + "?") and bare.endswith(question.question.strip())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"topk": 0}, r"topk must be >= 1 and <= 1024, got 0"),
        ({"max_turns": 0}, r"max_turns must be >= 1"),
        ({"reward": "bleu"}, r"unknown reward 'bleu'"),
        ({"max_searches": 2}, r"unknown environment options \['max_searches'\]; valid: \['dataset'"),
        ({"split": "dev"}, r"no split 'dev'"),
    ],
)
def test_a_bad_field_is_refused_with_the_specs_message(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SearchQAToolEnv(**fields)
    with pytest.raises(ConfigError, match=message):
        SearchQAToolEnv.factory(**fields)  # when the factory is made, not inside TRL


def test_the_tool_dataset_takes_the_same_arguments() -> None:
    pytest.importorskip("datasets")
    rows = tool_env_dataset(EnvSpec(world_seed=1), split="test", limit=3)
    assert rows["question_id"] == [q.id for q in load_dataset(None, world_seed=1).questions("test")[:3]]
    with pytest.raises(ConfigError, match="spec must be an EnvSpec"):
        tool_env_dataset("world")
