"""SearchQAMacro-v0: Gymnasium contract, candidate extraction, and equality with the token-level env."""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import searchgym  # noqa: F401 - registers the env ids
from searchgym.envs.macro import (
    CANDIDATE_FEATURES,
    GLOBAL_FEATURES,
    SearchQAMacroEnv,
    passage_candidates,
    question_candidates,
)
from searchgym.errors import InvalidActionError
from searchgym.protocol import Source
from searchgym.retrieval import Hit

MACRO_ONLY_KEYS = {"action_mask", "candidates", "turn_text"}


@pytest.fixture(scope="module")
def env() -> gym.Env[Any, Any]:
    return gym.make("SearchQAMacro-v0", split="test")


def test_gymnasium_check_env_passes_without_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(gym.make("SearchQAMacro-v0").unwrapped, skip_render_check=True)


@pytest.mark.parametrize(
    ("question", "spans"),
    [
        ("In which country was Runil Nouvovand born?", ["Runil Nouvovand"]),
        ("Which appeared first, The Lebraeth Bell or Fydybraer?", ["The Lebraeth Bell", "Fydybraer"]),
        ("Who founded Lonim Institute?", ["Lonim Institute"]),
        ("In which country is Distul?", ["Distul"]),
    ],
)
def test_question_spans_drop_sentence_openers(question: str, spans: list[str]) -> None:
    assert [c.text for c in question_candidates(question)] == spans


@pytest.mark.parametrize(
    ("title", "text", "expected"),
    [
        ("Hidar Bryvoum", "Hidar Bryvoum (born 1964 in Betedround) is an economist. He works for Lyku Works.",
         [("Hidar Bryvoum", "title"), ("Hidar Bryvoum", "name"), ("1964", "number"), ("Betedround", "name"),
          ("economist", "noun"), ("Lyku Works", "name")]),
        ("Saint Druhustund", "Saint Druhustund is a city in the Principality of Tirova. It was founded in 965.",
         [("Saint Druhustund", "title"), ("Saint Druhustund", "name"), ("city", "noun"),
          ("Principality of Tirova", "name"), ("965", "number")]),
    ],
)  # fmt: skip
def test_passage_candidates_in_text_order(title: str, text: str, expected: list[tuple[str, str]]) -> None:
    found = passage_candidates(Hit("p", title, text, 1.0), search=0, rank=0, question_words={"born"})
    assert [(c.text, c.kind) for c in found] == expected
    year = next(c for c in found if c.text == "1964") if title == "Hidar Bryvoum" else None
    if year is not None:
        assert year.cue == pytest.approx(1 / 3)  # of "Hidar Bryvoum (born", only "born" is a question word


def test_spaces_layout_and_mask(env: gym.Env[Any, Any]) -> None:
    base: SearchQAMacroEnv = env.unwrapped  # type: ignore[assignment]
    n = base.n_queries + base.n_answers
    assert env.action_space == gym.spaces.Discrete(n)
    assert env.observation_space.shape == (len(GLOBAL_FEATURES) + n * len(CANDIDATE_FEATURES),)
    obs, info = env.reset(seed=1)
    assert env.observation_space.contains(obs)
    mask = np.asarray(info["action_mask"])
    np.testing.assert_array_equal(mask, env.unwrapped.action_masks())  # type: ignore[attr-defined]
    assert mask[0] and mask.sum() == len(info["candidates"]["queries"]) + len(info["candidates"]["answers"])
    slots = obs[len(GLOBAL_FEATURES) :].reshape(n, len(CANDIDATE_FEATURES))
    np.testing.assert_array_equal(slots[:, CANDIDATE_FEATURES.index("valid")] == 1.0, mask)


def test_search_rebuilds_candidates_and_marks_searched(env: gym.Env[Any, Any]) -> None:
    obs, info = env.reset(options={"question_index": 8})
    obs, reward, terminated, truncated, info = env.step(0)  # search the whole question
    assert info["turn_text"] == f"<search> {info['question']} </search>"
    assert info["searches"] == 1 and not terminated and reward == 0.0
    assert len(info["candidates"]["answers"]) == env.unwrapped.n_answers  # type: ignore[attr-defined]
    searched = obs[len(GLOBAL_FEATURES) + CANDIDATE_FEATURES.index("searched")]
    assert searched == 1.0


def test_empty_slot_is_an_invalid_turn_and_bad_actions_raise(env: gym.Env[Any, Any]) -> None:
    _, info = env.reset(options={"question_index": 0})
    empty = int(np.flatnonzero(~np.asarray(info["action_mask"]))[0])
    _, _, terminated, _, info = env.step(empty)
    assert info["invalid_turns"] == 1 and info["searches"] == 0 and not terminated
    with pytest.raises(InvalidActionError):
        env.step(env.action_space.n)  # type: ignore[attr-defined]


def test_reset_seed_is_reproducible(env: gym.Env[Any, Any]) -> None:
    a, ia = env.reset(seed=7)
    b, ib = env.reset(seed=7)
    np.testing.assert_array_equal(a, b)
    assert ia["question_id"] == ib["question_id"]


def _replay(question_id: str, tokens: np.ndarray) -> tuple[float, dict[str, Any], gym.Env[Any, Any]]:
    token_env = gym.make("SearchQA-v0", split="test")
    token_env.reset(options={"question_id": question_id})
    reward, info, done = 0.0, {}, False
    for i, token in enumerate(tokens):
        assert not done, "the token env ended before the macro transcript did"
        _, r, terminated, truncated, info = token_env.step(int(token))
        reward += float(r)
        done = terminated or truncated
        assert done == (i == len(tokens) - 1) or not done
    assert done
    return reward, info, token_env


@pytest.mark.parametrize("seed", range(6))
def test_macro_episode_replays_identically_in_the_token_env(env: gym.Env[Any, Any], seed: int) -> None:
    rng = np.random.default_rng(seed)
    _, info = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        # Biased towards filled slots so that episodes search, answer and sometimes hit the turn budget.
        mask = np.asarray(info["action_mask"])
        action = int(rng.choice(np.flatnonzero(mask))) if rng.random() < 0.9 else int(rng.integers(len(mask)))
        _, reward, terminated, truncated, info = env.step(action)
        total += float(reward)
        done = terminated or truncated
    episode = env.unwrapped.episode  # type: ignore[attr-defined]
    policy = episode.tokens[: episode.length][episode.sources[: episode.length] == Source.POLICY]
    replay_reward, replay_info, token_env = _replay(info["question_id"], policy)
    assert replay_reward == total
    assert {k: v for k, v in info.items() if k not in MACRO_ONLY_KEYS} == {**replay_info, "turn_end": True}
    other = token_env.unwrapped.episode  # type: ignore[attr-defined]
    np.testing.assert_array_equal(other.tokens, episode.tokens)
    np.testing.assert_array_equal(other.sources, episode.sources)
