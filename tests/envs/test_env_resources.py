"""Argument checks and resource release of the environments."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from searchgym.data import generate_world
from searchgym.envs import SearchQAEnv
from searchgym.errors import ConfigError, EpisodeFinishedError


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("topk", 2.5),
        ("topk", "3"),
        ("topk", True),
        ("topk", 0),
        ("max_turns", 1.0),
        ("max_turn_tokens", None),
        ("max_context_tokens", 100.5),
        ("max_passage_words", 2.5),
        ("max_obs_tokens", 0),
        ("max_obs_tokens", 7.0),
    ],
)
def test_non_integer_sizes_are_refused_naming_the_argument(world: Any, name: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=name):
        SearchQAEnv(dataset=world, **{name: value})


def test_numpy_integers_are_accepted(world: Any) -> None:
    env = SearchQAEnv(dataset=world, topk=np.int64(2), max_turns=np.int32(3))
    assert env.env_spec.topk == 2 and type(env.env_spec.topk) is int
    env.close()


def test_step_before_reset_is_a_typed_error(world: Any) -> None:
    env = SearchQAEnv(dataset=world)
    with pytest.raises(EpisodeFinishedError, match=r"before reset\(\)"):
        env.step(0)
    env.close()


def test_closing_envs_releases_their_retriever() -> None:
    datasets = [generate_world(seed=s) for s in range(1, 5)]
    refs = []
    for data in datasets:
        env = SearchQAEnv(dataset=data)
        other = SearchQAEnv(dataset=data)  # shares the retriever
        assert other.retriever is env.retriever
        refs.append(weakref.ref(env.retriever))
        env.close()
        assert data.retrievers, "still held by the second env"
        other.close()
        other.close()  # idempotent
        assert not data.retrievers
        del env, other
    gc.collect()
    assert all(ref() is None for ref in refs), "a closed env's retriever is still alive"


def test_a_dropped_env_releases_its_retriever_too() -> None:
    data = generate_world(seed=9)
    env = SearchQAEnv(dataset=data)
    assert data.retrievers
    del env
    gc.collect()
    assert not data.retrievers


def test_vector_and_macro_envs_release_on_close() -> None:
    data = generate_world(seed=11)
    envs = gym.make_vec("SearchQA-v0", num_envs=2, dataset=data)
    macro = gym.make("SearchQAMacro-v0", dataset=data)
    assert len(data.retrievers) == 1
    envs.close()
    assert data.retrievers
    macro.close()
    assert not data.retrievers


def test_a_retriever_object_stays_the_callers(world: Any, retriever: Any) -> None:
    closed = []
    retriever_close = retriever.close
    try:
        retriever.close = lambda: closed.append(True)  # type: ignore[method-assign]
        env = SearchQAEnv(dataset=world, retriever=retriever)
        env.close()
    finally:
        retriever.close = retriever_close  # type: ignore[method-assign]
    assert not closed
