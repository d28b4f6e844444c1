from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import pytest

import searchgym  # noqa: F401
from searchgym.data import load_dataset
from searchgym.envs import SearchQAVectorEnv
from searchgym.errors import ConfigError, EpisodeFinishedError, InvalidActionError
from searchgym.retrieval import Hit, Retriever, make_retriever
from searchgym.tokenization import builtin_tokenizer


class CountingRetriever(Retriever):
    def __init__(self) -> None:
        self.inner = make_retriever("bm25", load_dataset().passages)
        self.calls: list[int] = []

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        self.calls.append(len(queries))
        return self.inner.search(queries, k)


def test_make_vec_uses_the_native_vector_env() -> None:
    envs = gym.make_vec("SearchQA-v0", num_envs=4)
    assert isinstance(envs.unwrapped, SearchQAVectorEnv)


def test_groups_share_their_question() -> None:
    envs = SearchQAVectorEnv(num_envs=12)
    _, infos = envs.reset(seed=3, options={"group_size": 4})
    ids = list(infos["question_id"])
    for g in range(3):
        assert len(set(ids[4 * g : 4 * g + 4])) == 1
    assert len(set(ids)) > 1
    _, infos = envs.reset(options={"question_ids": ["train-1", "train-2", "train-3"]})
    assert list(infos["question_id"]) == ["train-1"] * 4 + ["train-2"] * 4 + ["train-3"] * 4
    with pytest.raises(ConfigError, match="group_size must divide"):
        envs.reset(options={"group_size": 5})


def test_64_searches_in_one_step_make_one_retrieval_call() -> None:
    retriever = CountingRetriever()
    envs = SearchQAVectorEnv(num_envs=64, retriever=retriever)
    envs.reset(seed=0, options={"group_size": 8})
    tok = builtin_tokenizer()
    ids = tok.encode("<search> Lyku Works </search>")
    for t in ids[:-1]:
        envs.step(np.full(64, t))
    assert retriever.calls == []
    _, _, _, _, infos = envs.step(np.full(64, ids[-1]))
    assert retriever.calls == [64]
    assert all(q == ["Lyku Works"] for q in infos["queries"])


def test_step_segments_batches_retrieval_and_reports_consumption() -> None:
    retriever = CountingRetriever()
    envs = SearchQAVectorEnv(num_envs=4, retriever=retriever, autoreset_mode="Disabled")
    envs.reset(seed=0, options={"group_size": 2})
    tok = builtin_tokenizer()
    search = tok.encode("<search> Lyku Works </search>")
    answer = tok.encode("<answer> x </answer>")
    extra = tok.encode(" trailing")
    result = envs.step_segments([search + extra, answer, None, search])
    assert retriever.calls == [2]
    assert result.consumed.tolist() == [len(search), len(answer), 0, len(search)]
    assert result.terminated.tolist() == [False, True, False, False]
    assert result.infos[0]["queries"] == ["Lyku Works"] and result.infos[2] == {}
    with pytest.raises(EpisodeFinishedError):
        envs.step_segments([None, answer, None, None])
    _, infos = envs.reset(options={"reset_mask": np.array([False, True, False, False])})
    assert not envs.episodes[1].done and envs.episodes[0].length > envs.episodes[1].length


def test_next_step_autoreset() -> None:
    envs = SearchQAVectorEnv(num_envs=2, max_turns=1)
    envs.reset(seed=0)
    eos = builtin_tokenizer().eos_token_id
    _, rewards, terminated, _, infos = envs.step(np.array([eos, 5]))
    assert terminated.tolist() == [True, False] and infos["end_reason"][0] == "turn_budget"
    obs, _, terminated, _, infos = envs.step(np.array([5, 5]))  # sub-env 0 resets, its action is ignored
    assert terminated.tolist() == [False, False]
    assert int(obs["length"][0, 0]) == envs.episodes[0].prompt_length


def test_a_bad_batch_changes_nothing() -> None:
    envs = SearchQAVectorEnv(num_envs=2, autoreset_mode="Disabled")
    envs.reset(seed=0)
    before = [ep.length for ep in envs.episodes]
    search = builtin_tokenizer().encode("<search> Lyku Works </search>")
    with pytest.raises(InvalidActionError):
        envs.step_segments([search, [10**9]])
    with pytest.raises(InvalidActionError):
        envs.step_segments([search, [1.5]])
    assert [ep.length for ep in envs.episodes] == before
    result = envs.step_segments([search, None])  # still usable: the first segment now runs normally
    assert result.infos[0]["queries"] == ["Lyku Works"]
