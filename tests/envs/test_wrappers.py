from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import searchgym  # noqa: F401
from searchgym.envs import TurnLevelWrapper
from searchgym.errors import InvalidActionError
from searchgym.tokenization import builtin_tokenizer

KW: dict[str, Any] = {"max_turns": 4, "max_turn_tokens": 30, "max_context_tokens": 1500}


def pieces() -> list[int]:
    tok = builtin_tokenizer()
    ids = {
        i
        for p in ("<search>", " Lyku Works", "</search>", "<answer>", "</answer>", ">.")
        for i in tok.encode(p)
    }
    return sorted(ids | {int(tok.eos_token_id or 0)})


tokens = st.one_of(st.integers(0, 8191), st.sampled_from(pieces()))


def one_by_one(stream: list[int], question: int) -> tuple[list[Any], dict[str, np.ndarray], int]:
    env = gym.make("SearchQA-v0", **KW)
    obs, info = env.reset(seed=0, options={"question_index": question})
    log = []
    fed = 0
    for t in stream:
        obs, r, term, trunc, info = env.step(t)
        fed += 1
        if info.get("turn_end"):
            log.append((r, term, trunc, info))
        if term or trunc:
            break
    return log, obs, fed


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(tokens, min_size=1, max_size=160),
    st.lists(st.integers(1, 25), min_size=1, max_size=40),
    st.integers(0, 50),
)
def test_segments_and_single_tokens_give_identical_episodes(
    stream: list[int], cuts: list[int], question: int
) -> None:
    ref_log, ref_obs, ref_fed = one_by_one(stream, question)
    env = TurnLevelWrapper(gym.make("SearchQA-v0", **KW))
    obs, info = env.reset(seed=0, options={"question_index": question})
    pos, log, fed, i = 0, [], 0, 0
    while pos < len(stream):
        size = cuts[i % len(cuts)]
        i += 1
        segment = stream[pos : pos + size]
        obs, r, term, trunc, info = env.step(segment)
        consumed = info["consumed_tokens"]
        assert info["discarded_tokens"] == segment[consumed:]
        assert consumed == len(segment) or info.get("turn_end") or term or trunc
        fed += consumed
        if info.get("turn_end"):
            log.append(
                (
                    r,
                    term,
                    trunc,
                    {k: v for k, v in info.items() if k not in ("consumed_tokens", "discarded_tokens")},
                )
            )
        if term or trunc:
            break
        pos += consumed
    assert fed == ref_fed
    assert log == ref_log
    for key in ("tokens", "sources", "length"):
        assert np.array_equal(obs[key], ref_obs[key])


def test_stops_at_the_turn_end_and_reports_discarded_tokens() -> None:
    env = TurnLevelWrapper(gym.make("SearchQA-v0"))
    env.reset(seed=0)
    tok = builtin_tokenizer()
    head, tail = tok.encode("<search> Lyku Works </search>"), tok.encode(" and more text")
    obs, reward, term, trunc, info = env.step(head + tail)
    assert info["turn_end"] and info["queries"] == ["Lyku Works"]
    assert info["consumed_tokens"] == len(head) and info["discarded_tokens"] == tail
    with pytest.raises(InvalidActionError):
        env.step([])


def test_bad_segments_are_rejected_before_anything_is_fed() -> None:
    env = TurnLevelWrapper(gym.make("SearchQA-v0"))
    obs, _ = env.reset(seed=0)
    length = int(obs["length"][0])
    for bad in ([5.7, 6.2], [5, 10**9], 7, [[1, 2]]):
        with pytest.raises(InvalidActionError):
            env.step(bad)  # type: ignore[arg-type]
    assert env.unwrapped.episode.length == length
