"""EnvSpec: every field that defines an episode, declared and checked once, and taken whole by the
environments (``SearchQAEnv``, the vector env, the macro env)."""

from __future__ import annotations

import dataclasses
import json

import gymnasium as gym
import pytest

import searchgym  # noqa: F401 - registers the env ids
from searchgym.envs import EnvSpec, SearchQAEnv, SearchQAVectorEnv
from searchgym.envs.spec import make_spec
from searchgym.errors import ConfigError


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"topk": 0}, r"topk must be >= 1 and <= 1024, got 0"),
        ({"max_turns": 2.5}, r"max_turns must be an integer in \[1, 1024\], got 2.5"),
        ({"max_context_tokens": 8}, r"max_context_tokens must be >= 16"),
        ({"max_obs_tokens": 0}, r"max_obs_tokens must be >= 1 and <= \d+ or None"),
        ({"reward": "bleu"}, r"unknown reward 'bleu'; choose one of \['em', 'subem', 'f1'\]"),
        ({"prompt_style": "fancy"}, r"unknown prompt_style"),
        ({"on_retrieval_error": "ignore"}, r"unknown on_retrieval_error"),
        ({"retriever_patience": -1.0}, r"retriever_patience must be >= 0.0"),
        ({"retriever_patience": float("inf")}, r"retriever_patience"),
        ({"append_question_mark": "yes"}, r"append_question_mark must be True or False"),
        ({"retriever_faults": "empty=2"}, r"retriever fault probability empty"),
    ],
)
def test_a_bad_field_fails_once_with_its_range(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EnvSpec(**fields)  # type: ignore[arg-type]


def test_unknown_fields_are_named_with_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown environment options \['top_k'\]; valid: \['dataset'"):
        make_spec(None, {"top_k": 3})
    with pytest.raises(ConfigError, match="unknown environment options"):
        gym.make("SearchQA-v0", top_k=3)


def test_the_spec_is_frozen_and_replace_checks_again() -> None:
    spec = EnvSpec(topk=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.topk = 5  # type: ignore[misc]
    assert spec.replace(max_turns=6).max_turns == 6 and spec.max_turns == 4
    with pytest.raises(ConfigError, match="topk"):
        spec.replace(topk=0)


def test_numpy_numbers_become_plain_ones_and_faults_parse_once() -> None:
    import numpy as np

    spec = EnvSpec(topk=np.int64(2), retriever_faults="empty=0.5,seed=3")  # type: ignore[arg-type]
    assert type(spec.topk) is int
    stored = spec.to_dict()
    assert stored["retriever_faults"]["empty"] == 0.5 and stored["retriever_faults"]["seed"] == 3
    assert EnvSpec(**stored) == spec  # what a manifest or checkpoint stores builds the same spec


def test_gym_make_fields_and_a_spec_give_the_same_env() -> None:
    env = gym.make("SearchQA-v0", topk=5, max_turns=2).unwrapped
    assert isinstance(env, SearchQAEnv)
    assert env.env_spec == EnvSpec(topk=5, max_turns=2)
    again = SearchQAEnv(EnvSpec(topk=5), max_turns=2)
    assert again.env_spec == env.env_spec
    env.close()
    again.close()


def test_the_vector_env_and_its_episodes_take_the_spec_whole() -> None:
    spec = EnvSpec(topk=2, max_turns=3, max_context_tokens=512)
    envs = SearchQAVectorEnv(2, spec, autoreset_mode="Disabled")
    assert envs.env_spec is spec and all(ep.spec is spec for ep in envs.episodes)
    assert envs.single_observation_space["tokens"].shape == (512,)
    envs.close()


def test_the_front_ends_table_changes_every_field() -> None:
    from ..conftest import NON_DEFAULT_ENV

    assert tuple(NON_DEFAULT_ENV) == EnvSpec.field_names()
    default = EnvSpec()
    assert all(getattr(default, k) != getattr(EnvSpec(**NON_DEFAULT_ENV), k) for k in NON_DEFAULT_ENV)


def test_a_record_round_trips_and_a_missing_field_takes_the_specs_default() -> None:
    spec = EnvSpec(
        dataset="world", world_seed=3, split="dev", topk=2, retriever_faults="empty=0.5,seed=1", reward="f1"
    )
    record = spec.to_record()
    assert json.loads(json.dumps(record)) == record  # plain data
    assert EnvSpec.from_record(json.loads(json.dumps(record))) == spec
    # A record an earlier version wrote: fewer fields, and keys that are not fields (the tokenizer).
    old = {"dataset": None, "world_seed": 0, "topk": 5, "tokenizer": "gpt2", "render_mode": None}
    loaded = EnvSpec.from_record(old)
    assert loaded == EnvSpec(topk=5)
    assert loaded.split == EnvSpec().split == "train" and loaded.max_turns == EnvSpec().max_turns
    assert EnvSpec.from_record(None) == EnvSpec() == EnvSpec.from_record({})


def test_a_bad_record_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="topk must be"):
        EnvSpec.from_record({"topk": 0})
    with pytest.raises(ConfigError, match="must be a mapping"):
        EnvSpec.from_record(["topk", 3])  # type: ignore[arg-type]
