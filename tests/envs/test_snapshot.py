"""Snapshots and restores of SearchQA episodes, and forks of the vector env's sub-envs."""

from __future__ import annotations

import gc
from functools import cache
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import searchgym  # noqa: F401 - registers the env ids
from searchgym.data import Dataset
from searchgym.envs import EpisodeSnapshot, SearchQAEnv, SearchQAVectorEnv
from searchgym.errors import ConfigError, SearchGymError
from searchgym.retrieval import Retriever
from searchgym.tokenization import Tokenizer

# Small sizes so that random streams reach every ending: answers, turn caps, the turn budget, the context.
SIZES: dict[str, Any] = {"max_context_tokens": 400, "max_turn_tokens": 40, "max_turns": 4}
FAULTS = "empty=0.2,replace=0.3,shuffle=0.3,truncate=0.3,seed=5"
PIECES = [
    "<search> Zorvath founder </search>",
    "<search> city of the Velmora Institute </search>",
    "<search>  </search>",
    "<answer> Kestrel Bay </answer>",
    " thinking about the founder and the city,",
    "</sear",
    "ch> and <ans",
]


@cache
def make_env(faults: str | None = None) -> SearchQAEnv:
    return SearchQAEnv(split="train", retriever_faults=faults, **SIZES)


def stream(data: st.DataObject, tokenizer: Tokenizer) -> list[int]:
    """A random mix of tag pieces, plain text, and random token ids (EOS among them)."""
    parts = data.draw(
        st.lists(
            st.one_of(
                st.sampled_from(PIECES).map(tokenizer.encode),
                st.lists(st.integers(0, tokenizer.vocab_size - 1), min_size=1, max_size=6),
            ),
            min_size=1,
            max_size=40,
        )
    )
    return [t for part in parts for t in part]


def play(env: SearchQAEnv, tokens: list[int]) -> list[tuple[Any, ...]]:
    """Steps ``tokens`` until the episode ends; every step's (obs arrays, reward, flags, info)."""
    out = []
    for token in tokens:
        obs, reward, terminated, truncated, info = env.step(token)
        out.append((obs["tokens"], obs["sources"], obs["length"], reward, terminated, truncated, info))
        if terminated or truncated:
            break
    return out


def assert_same(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for u, v in zip(x[:3], y[:3], strict=True):
            np.testing.assert_array_equal(u, v)
        assert x[3:] == y[3:]


@pytest.mark.parametrize("faults", [None, FAULTS], ids=["plain", "faults"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_restore_then_the_same_tokens_give_identical_steps(faults: str | None, data: st.DataObject) -> None:
    env = make_env(faults)
    seed = data.draw(st.integers(0, 10_000))
    tokens = stream(data, env.tokenizer)
    env.reset(seed=seed)
    at = data.draw(st.integers(0, len(tokens)))
    before = play(env, tokens[:at])
    if before and (before[-1][4] or before[-1][5]):
        at = len(before)  # the episode ended inside the prefix: snapshot the finished episode
    snap = env.snapshot()
    original = play(env, tokens[at:]) if not env.episode.done else []
    next_question = env.reset()[1]["question_id"]  # drawn from np_random, which the snapshot holds

    env.reset(seed=seed + 1)  # elsewhere entirely, then back
    play(env, tokens[::-1])
    env.restore(snap)
    assert_same(play(env, tokens[at:]) if not env.episode.done else [], original)
    assert env.reset()[1]["question_id"] == next_question

    other = SearchQAEnv(
        split="train", retriever_faults=faults, **SIZES
    )  # a fresh env with the same arguments
    other.restore(snap)
    assert_same(play(other, tokens[at:]) if not other.episode.done else [], original)
    other.close()


def test_a_snapshot_is_immutable_and_holds_only_the_episode() -> None:
    env = make_env(FAULTS)
    env.reset(seed=1)
    for t in env.tokenizer.encode("<search> Zorvath founder </search> so"):
        env.step(t)
    snap = env.snapshot()
    assert isinstance(snap, EpisodeSnapshot) and snap.length == env.episode.length
    with pytest.raises(ValueError, match="read-only"):
        snap.tokens[0] = 1
    with pytest.raises(AttributeError):
        snap.length = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        snap.turns[0].kind = "answer"  # type: ignore[misc]
    assert isinstance(snap.turns, tuple) and isinstance(snap.search_hits[0], tuple)
    assert snap.fault_rng is not None and snap.rng is not None
    # Never the corpus, the retriever or the tokenizer: the snapshot references none of them.
    heavy = (Dataset, Retriever, Tokenizer)
    seen = [snap, *snap]
    while seen:
        item = seen.pop()
        assert not isinstance(item, heavy), type(item)
        if isinstance(item, tuple | list | dict):
            seen.extend(gc.get_referents(item))
    assert snap.tokens.nbytes == 8 * env.episode.length  # the transcript so far, not the buffer
    env.restore(snap)
    assert env.retriever is make_env(FAULTS).retriever


def test_restore_refuses_what_does_not_fit() -> None:
    env = make_env(None)
    with pytest.raises(SearchGymError, match="reset"):
        SearchQAEnv(split="train", **SIZES).snapshot()
    env.reset(seed=0)
    snap = env.snapshot()
    with pytest.raises(ConfigError, match="EpisodeSnapshot"):
        env.restore({"tokens": []})  # type: ignore[arg-type]
    other = SearchQAEnv(split="train", max_context_tokens=512)
    with pytest.raises(ConfigError, match="other episode settings"):
        other.restore(snap)
    with pytest.raises(ConfigError, match="retriever faults"):
        make_env(FAULTS).restore(snap)


def test_restore_into_a_longer_transcript_clears_its_tail() -> None:
    env = make_env(None)
    env.reset(seed=2)
    snap = env.snapshot()
    for t in env.tokenizer.encode("<search> Zorvath founder </search> more words here"):
        env.step(t)
    env.restore(snap)
    obs = env.episode.observation()
    assert obs["length"][0] == snap.length
    assert not obs["tokens"][snap.length :].any() and not obs["sources"][snap.length :].any()


# -- the vector env ---------------------------------------------------------------------------------------

VSIZES: dict[str, Any] = {**SIZES, "max_context_tokens": 1024}  # room for two searches


def first_search_turn(envs: SearchQAVectorEnv, i: int) -> None:
    """Feeds sub-env ``i`` an oracle-like first search turn (the episode then waits for its next turn)."""
    segment = envs.tokenizer.encode("<search> Zorvath founder </search>")
    result = envs.step_segments([segment if j == i else None for j in range(envs.num_envs)])
    assert result.infos[i]["searches"] == 1


@pytest.mark.parametrize("faults", [None, FAULTS], ids=["plain", "faults"])
def test_fork_branches_at_the_first_search_and_branches_stay_identical(faults: str | None) -> None:
    envs = SearchQAVectorEnv(num_envs=6, autoreset_mode="Disabled", retriever_faults=faults, **VSIZES)
    envs.reset(seed=4, options={"group_size": 3})
    untouched = envs.snapshot(3)
    first_search_turn(envs, 0)
    assert envs.fork(0, 3) == [0, 1, 2]
    obs = envs._observations()
    for i in (1, 2):
        np.testing.assert_array_equal(obs["tokens"][i], obs["tokens"][0])
        np.testing.assert_array_equal(obs["sources"][i], obs["sources"][0])
    assert envs.episodes[3].length == untouched.length  # the other group is untouched
    # Identical continuations stay identical (their searches, and faults, included) ...
    second = envs.tokenizer.encode("<search> city of the Velmora Institute </search>")
    result = envs.step_segments([second, second, second, None, None, None])
    assert result.infos[0] == result.infos[1] == result.infos[2]
    np.testing.assert_array_equal(result.observations["tokens"][0], result.observations["tokens"][2])
    # ... and different ones diverge from the shared prefix.
    answer = envs.tokenizer.encode("<answer> Kestrel Bay </answer>")
    result = envs.step_segments([answer, second, None, None, None, None])
    assert result.terminated[0] and not result.terminated[1]
    prefix = envs.episodes[2].length
    np.testing.assert_array_equal(
        result.observations["tokens"][0][:prefix], result.observations["tokens"][1][:prefix]
    )


def test_fork_to_chosen_sub_envs_and_single_env_snapshots_interchange() -> None:
    envs = SearchQAVectorEnv(num_envs=4, autoreset_mode="Disabled", **VSIZES)
    envs.reset(seed=0)
    first_search_turn(envs, 2)
    assert envs.fork(2, [0, 3]) == [0, 3]
    assert envs.episodes[0].length == envs.episodes[3].length == envs.episodes[2].length
    assert envs.episodes[1].length < envs.episodes[2].length
    # A sub-env's snapshot restores into a single env made with the same arguments, and back.
    single = SearchQAEnv(split="train", **VSIZES)
    snap = envs.snapshot(2)
    assert snap.rng is None  # the vector env's generator is shared, not part of one episode
    single.restore(snap)
    tokens = single.tokenizer.encode("<answer> Kestrel Bay </answer>")
    steps = play(single, tokens)
    result = envs.step_segments([None, None, tokens, None])
    np.testing.assert_array_equal(steps[-1][0], result.observations["tokens"][2])
    assert steps[-1][3] == result.rewards[2] and result.terminated[2]
    envs.restore(1, single.snapshot())
    np.testing.assert_array_equal(envs._observations()["tokens"][1], steps[-1][0])


def test_a_finished_branch_autoresets_like_one_that_just_ended() -> None:
    envs = SearchQAVectorEnv(num_envs=2, **VSIZES)
    envs.reset(seed=0)
    for t in envs.tokenizer.encode("<answer> x </answer>"):
        _, _, terminated, _, _ = envs.step(np.array([t, t]))
    assert terminated.all()
    envs.fork(0, 2)
    _, _, _, _, infos = envs.step(np.array([0, 0]))  # the NextStep autoreset of both
    assert not envs.episodes[0].done and not envs.episodes[1].done


@pytest.mark.parametrize(
    ("source", "targets", "match"),
    [
        (4, 1, "source sub-env"),
        (-1, 1, "source sub-env"),
        (2, 3, "1 <= n <= 2"),
        (0, 0, "1 <= n"),
        (0, [5], "target"),
    ],
)
def test_fork_refuses_bad_indices(source: int, targets: Any, match: str) -> None:
    envs = SearchQAVectorEnv(num_envs=4, **VSIZES)
    envs.reset(seed=0)
    with pytest.raises(ConfigError, match=match):
        envs.fork(source, targets)
