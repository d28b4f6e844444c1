import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import searchgym
from searchgym.agents import OracleAgent, run_episode
from searchgym.envs import SearchQAEnv
from searchgym.errors import (
    ConfigError,
    EpisodeFinishedError,
    InvalidActionError,
    RetrieverError,
    UnknownQuestionError,
)
from searchgym.protocol import INVALID_TURN_MESSAGE, Source
from searchgym.retrieval import Hit, Retriever


def feed_text(env: gym.Env[Any, Any], text: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
    """Feeds the tokens of ``text`` one by one; stops early when the episode ends."""
    tok = env.unwrapped.tokenizer  # type: ignore[attr-defined]
    result = None
    for t in tok.encode(text):
        result = env.step(t)
        if result[2] or result[3]:
            break
    assert result is not None
    return result


def assert_check_env_clean(env: gym.Env[Any, Any]) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=False)
    assert [str(w.message) for w in caught] == []


def test_check_env_default_world() -> None:
    assert_check_env_clean(gym.make("SearchQA-v0").unwrapped)


def test_check_env_real_data(hotpot_dir: Path) -> None:
    assert_check_env_clean(gym.make("SearchQA-v0", dataset=str(hotpot_dir), split="test").unwrapped)


def test_make_with_module_prefix_in_a_fresh_process() -> None:
    code = (
        "import sys, gymnasium as gym\n"
        "env = gym.make('searchgym:SearchQA-v0')\n"
        "obs, info = env.reset(seed=0)\n"
        "heavy = [m for m in ('torch', 'transformers', 'fastapi', 'uvicorn') if m in sys.modules]\n"
        "print(obs['length'][0], heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    length, heavy = out.stdout.split(" ", 1)
    assert int(length) > 0
    assert heavy.strip() == "[]"  # creating the env imports no torch, model or server


def test_make_vec_resets_and_steps() -> None:
    envs = gym.make_vec("SearchQA-v0", num_envs=4)
    obs, _ = envs.reset(seed=0)
    assert obs["tokens"].shape == (4, 2048)
    obs, rewards, terminated, truncated, _ = envs.step(np.zeros(4, dtype=np.int64))
    assert obs["length"].shape == (4, 1) and rewards.shape == (4,)
    envs.close()


def test_episode_with_search_and_answer_marks_sources() -> None:
    env = gym.make("SearchQA-v0", split="test")
    base = env.unwrapped
    obs, info = env.reset(seed=0, options={"question_index": 3})
    prompt_len = int(obs["length"][0])
    assert set(obs["sources"][:prompt_len]) == {Source.PROMPT}
    title = base.dataset.passage_index[base.episode.question.supporting_ids[0]].title
    obs, reward, terminated, truncated, info = feed_text(env, f"<search> {title} </search>")
    assert not terminated and info["searches"] == 1 and info["queries"] == [title]
    assert info["retrieved_ids"][0][0] == base.episode.question.supporting_ids[0]
    assert info["gold_retrieved"] is True
    n = int(obs["length"][0])
    text = base.tokenizer.decode(obs["tokens"][:n])
    assert '<information>Doc 1(Title: "' in text and text.endswith("</information>\n\n")
    answer = info["golden_answers"][0]
    obs, reward, terminated, truncated, info = feed_text(env, f"<think>ok</think><answer> {answer} </answer>")
    assert terminated and not truncated and reward == 1.0
    assert info["answer"] == answer and info["end_reason"] == "answered" and info["em"] == 1.0


def test_prompt_example_answer_is_never_scored() -> None:
    env = gym.make("SearchQA-v0", split="test")
    env.reset(seed=0)
    env.unwrapped.episode.question = env.unwrapped.episode.question.__class__(  # type: ignore[attr-defined]
        id="x", question="capital?", golden_answers=("Beijing",)
    )
    # Answering nothing well-formed: the prompt's "<answer> Beijing </answer>" must not count.
    obs, reward, terminated, truncated, info = feed_text(env, "I do not know." + "<|endoftext|>" * 0)
    assert reward == 0.0


def test_invalid_turn_gets_corrective_message_and_budget_ends_episode() -> None:
    env = gym.make("SearchQA-v0", max_turns=2)
    env.reset(seed=1)
    base = env.unwrapped
    eos = base.tokenizer.eos_token_id
    for t in base.tokenizer.encode("hello"):
        env.step(t)
    obs, reward, terminated, truncated, info = env.step(eos)
    assert not terminated and info["invalid_turns"] == 1 and info["turn_end"]
    n = int(obs["length"][0])
    tail = base.tokenizer.decode(obs["tokens"][:n])
    assert tail.endswith(INVALID_TURN_MESSAGE)
    # The last turn must answer: a search there ends the episode without retrieval.
    obs, reward, terminated, truncated, info = feed_text(env, "<search> anything </search>")
    assert terminated and reward == 0.0 and info["end_reason"] == "turn_budget" and info["searches"] == 0


def test_turn_token_cap_and_context_limit() -> None:
    env = gym.make("SearchQA-v0", max_turn_tokens=5, max_context_tokens=160, max_turns=10)
    obs, _ = env.reset(seed=0)
    start = int(obs["length"][0])
    steps = 0
    while True:
        obs, reward, terminated, truncated, info = env.step(100)
        steps += 1
        if terminated or truncated:
            break
    assert truncated and not terminated and info["end_reason"] == "context_limit"
    assert int(obs["length"][0]) <= 160
    assert steps <= 160 - start
    with pytest.raises(EpisodeFinishedError, match="call reset"):
        env.step(100)


@pytest.mark.parametrize("action", [-1, 8192, 10**9, 2.5, "a", None])
def test_out_of_vocabulary_action(action: Any) -> None:
    env = gym.make("SearchQA-v0").unwrapped
    env.reset(seed=0)
    with pytest.raises(InvalidActionError, match=r"not a token id in \[0, 8192\)"):
        env.step(action)
    env.step(np.int64(5))  # numpy integers are fine, and nothing was lost


def test_unknown_question_id_and_options() -> None:
    env = gym.make("SearchQA-v0", split="test")
    with pytest.raises(UnknownQuestionError, match="no question with id 'nope'"):
        env.reset(options={"question_id": "nope"})
    with pytest.raises(UnknownQuestionError):
        env.reset(options={"question_index": 10**6})
    with pytest.raises(ConfigError, match="unknown reset options"):
        env.reset(options={"group": 2})
    _, info = env.reset(options={"question_id": "test-7"})
    assert info["question_id"] == "test-7"


def test_bad_arguments_fail_early() -> None:
    with pytest.raises(ConfigError, match="choose one of"):
        gym.make("SearchQA-v0", reward="bleu")
    with pytest.raises(ConfigError, match="no split"):
        gym.make("SearchQA-v0", split="dev")
    with pytest.raises(ConfigError, match="chat template"):
        gym.make("SearchQA-v0", prompt_style="chat").reset(seed=0)


class _FailingRetriever(Retriever):
    def search(self, queries: Any, k: int) -> list[list[Hit]]:
        raise RetrieverError("server unreachable")


def test_retrieval_failure_raise_or_observe() -> None:
    env = gym.make("SearchQA-v0", retriever=_FailingRetriever())
    env.reset(seed=0)
    with pytest.raises(RetrieverError, match="unreachable"):
        feed_text(env, "<search> x </search>")
    env = gym.make("SearchQA-v0", retriever=_FailingRetriever(), on_retrieval_error="observe")
    env.reset(seed=0)
    obs, _, terminated, _, info = feed_text(env, "<search> x </search>")
    assert not terminated and info["searches"] == 1
    base = env.unwrapped
    n = int(obs["length"][0])
    tool = obs["sources"][:n] == Source.TOOL
    assert "Search failed: server unreachable" in base.tokenizer.decode(obs["tokens"][:n][tool])


def test_unsupported_render_mode_warns_and_renders_nothing() -> None:
    with pytest.warns(UserWarning, match="render_mode 'rgb_array' is not supported"):
        env = gym.make("SearchQA-v0", render_mode="rgb_array", disable_env_checker=True)
    assert env.unwrapped.render_mode is None


def test_render_modes(capsys: pytest.CaptureFixture[str]) -> None:
    env = gym.make("SearchQA-v0", render_mode="ansi")
    env.reset(seed=0)
    feed_text(env, "<search> q </search>")
    text = env.render()
    assert isinstance(text, str)
    assert text.startswith("[prompt]") and "[policy]<search> q </search>[/policy][tool]" in text
    env = gym.make("SearchQA-v0", render_mode="human")
    env.reset(seed=0)
    assert env.render() is None
    assert "[prompt]Answer the given question" in capsys.readouterr().out


_EPISODE_SCRIPT = """
import json, numpy as np, gymnasium as gym, searchgym
env = gym.make("SearchQA-v0")
obs, info = env.reset(seed=123)
rng = np.random.default_rng(0)
tok = env.unwrapped.tokenizer
for t in tok.encode("<search> " + info["question"] + " </search>") + list(rng.integers(0, 8192, 40)):
    obs, r, term, trunc, info = env.step(int(t))
    if term or trunc:
        break
print(json.dumps({"tokens": obs["tokens"][: int(obs["length"][0])].tolist(), "info": info}))
"""


def test_same_seed_same_episode_across_processes() -> None:
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", _EPISODE_SCRIPT],
                capture_output=True,
                text=True,
                check=True,
                cwd="/",
                env={"PYTHONHASHSEED": str(i), "PATH": "/usr/bin:/bin"},
            ).stdout
        )
        for i in range(2)
    ]
    assert runs[0] == runs[1]
    assert runs[0]["info"]["searches"] == 1


def test_seeded_resets_pick_the_same_questions() -> None:
    a, b = gym.make("SearchQA-v0"), gym.make("SearchQA-v0")
    ids_a = [a.reset(seed=s)[1]["question_id"] for s in range(5)]
    ids_b = [b.reset(seed=s)[1]["question_id"] for s in range(5)]
    assert ids_a == ids_b and len(set(ids_a)) > 1


def test_oracle_transcript_policy_tokens_are_exactly_the_agents() -> None:
    env = gym.make("SearchQA-v0", split="test")
    base = env.unwrapped
    oracle = OracleAgent(base.dataset, "test", base.tokenizer)
    record = run_episode(env, oracle, seed=0, options={"question_index": 0})
    assert record.info["em"] == 1.0
    assert isinstance(base, SearchQAEnv) and searchgym.__version__


def test_tool_output_that_fills_the_context_exactly_ends_the_episode() -> None:
    probe = gym.make("SearchQA-v0")
    probe.reset(seed=0)
    prompt = probe.unwrapped.episode.length
    eos = probe.unwrapped.tokenizer.eos_token_id
    corrective = len(probe.unwrapped.tokenizer.encode(INVALID_TURN_MESSAGE))
    for extra in range(0, 6):  # the corrective message ends exactly at, just before, or after the limit
        size = prompt + 3 + corrective + extra - 2
        env = gym.make("SearchQA-v0", max_context_tokens=size, max_turns=10)
        env.reset(seed=0)
        for t in [100, 100, eos]:
            obs, _, terminated, truncated, info = env.step(t)
        while not (terminated or truncated):
            obs, _, terminated, truncated, info = env.step(100)
        assert int(obs["length"][0]) <= size


class _FlakyRetriever(Retriever):
    def __init__(self) -> None:
        self.calls = 0

    def search(self, queries: Any, k: int) -> list[list[Hit]]:
        self.calls += 1
        if self.calls == 1:
            raise RetrieverError("temporarily down")
        return [[Hit("p1", "T", "text", 1.0)] for _ in queries]


def test_failed_search_stays_pending_until_retried() -> None:
    retriever = _FlakyRetriever()
    env = gym.make("SearchQA-v0", retriever=retriever)
    env.reset(seed=0)
    with pytest.raises(RetrieverError):
        feed_text(env, "<search> who </search>")
    with pytest.raises(searchgym.SearchGymError, match="pending"):
        env.step(5)
    env.unwrapped.run_search()  # retry
    obs, _, terminated, _, info = feed_text(env, " ok <answer> x </answer>")
    assert terminated and info["queries"] == ["who"] and info["retrieved_ids"] == [["p1"]]
    assert [t.kind for t in env.unwrapped.episode.turns] == ["search", "answer"]


def test_retrieved_ids_align_with_queries_when_a_search_fails() -> None:
    env = gym.make("SearchQA-v0", retriever=_FlakyRetriever(), on_retrieval_error="observe")
    env.reset(seed=0)
    feed_text(env, "<search> a </search>")
    _, _, _, _, info = feed_text(env, "<search> b </search>")
    assert info["queries"] == ["a", "b"] and info["retrieved_ids"] == [[], ["p1"]]


@pytest.mark.parametrize("action", [True, 5.0, np.float32(3)])
def test_bools_and_floats_are_not_token_ids(action: Any) -> None:
    env = gym.make("SearchQA-v0").unwrapped
    env.reset(seed=0)
    with pytest.raises(InvalidActionError):
        env.step(action)


@pytest.mark.parametrize("value", ["abc", float("nan"), None, [1], "3", 2.7, True, np.float64(1.0)], ids=repr)
@pytest.mark.parametrize("env_id", ["SearchQA-v0", "SearchQAMacro-v0"])
def test_a_question_index_that_is_not_an_integer_is_a_config_error(env_id: str, value: object) -> None:
    env = gym.make(env_id, split="test")
    with pytest.raises(ConfigError, match=r"question_index must be an integer"):
        env.reset(options={"question_index": value})
    _, info = env.reset(options={"question_index": np.int64(3)})  # NumPy integers are integers
    assert info["question_id"] == env.unwrapped.questions[3].id  # type: ignore[attr-defined]
    env.close()


@pytest.mark.parametrize("env_id", ["SearchQA-v0", "SearchQAMacro-v0"])
def test_stepping_before_reset_through_gym_make_is_episode_finished_error(env_id: str) -> None:
    env = gym.make(env_id, split="test")
    with pytest.raises(EpisodeFinishedError, match="before reset"):
        env.step(0)
    env.close()


def test_length_is_a_one_element_array_and_the_docs_say_how_to_slice() -> None:
    """``obs["length"]`` is ``(1,)`` (the space is part of the env's version); the documented slice works, the
    obvious one raises, and the env's docstring and docs/environment.md both say so."""
    env = gym.make("SearchQA-v0", split="test")
    obs, info = env.reset(seed=0)
    assert obs["length"].shape == (1,) and obs["length"][0] == info["length"]
    n = int(obs["length"][0])
    assert (obs["sources"][:n] != Source.PAD).all() and (obs["sources"][n:] == Source.PAD).all()
    with pytest.raises(TypeError):
        obs["tokens"][: obs["length"]]
    documented = 'obs["tokens"][:int(obs["length"][0])]'
    assert documented in " ".join((SearchQAEnv.__doc__ or "").split())
    page = (Path(__file__).resolve().parents[2] / "docs" / "environment.md").read_text(encoding="utf-8")
    assert 'int(obs["length"][0])' in page and "raises `TypeError`" in page
