"""Property tests: the env keeps exactly the tokens it is fed and detects exactly the events a reference
finds by decoding the text and scanning it with a regular expression."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import gymnasium as gym
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import searchgym  # noqa: F401
from searchgym.envs import SearchQAEnv
from searchgym.protocol import Source
from searchgym.tokenization import builtin_tokenizer

MAX_TURNS = 4
MAX_TURN_TOKENS = 40
TAG_RE = re.compile(r"</search>|</answer>")
ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)


@lru_cache(maxsize=1)
def make_env() -> SearchQAEnv:
    env = gym.make(
        "SearchQA-v0", max_turns=MAX_TURNS, max_turn_tokens=MAX_TURN_TOKENS, max_context_tokens=8192
    ).unwrapped
    assert isinstance(env, SearchQAEnv)
    return env


def reference_events(tokens: list[int]) -> tuple[list[tuple[str, str]], int]:
    """Splits the stream into turns by decoding prefixes and scanning them with regular expressions.

    Returns the events (kind, content) and how many tokens an episode consumes.
    """
    tok = builtin_tokenizer()
    events: list[tuple[str, str]] = []
    start = 0
    for i in range(len(tokens)):
        turn_text = tok.decode(tokens[start : i + 1])
        tag = TAG_RE.search(turn_text)
        if not (tag or tokens[i] == tok.eos_token_id or i + 1 - start >= MAX_TURN_TOKENS):
            continue
        text = turn_text[: tag.end()] if tag else turn_text
        match = ACTION_RE.search(text)
        if match is None or (match.group(1) == "search" and not match.group(2).strip()):
            events.append(("invalid", ""))
        else:
            events.append((match.group(1), match.group(2).strip()))
        start = i + 1
        if events[-1][0] == "answer" or len(events) == MAX_TURNS:
            return events, i + 1
    return events, len(tokens)


def run_env(tokens: list[int]) -> tuple[list[tuple[str, str]], int, dict[str, Any], dict[str, np.ndarray]]:
    env = make_env()
    obs, info = env.reset(seed=0, options={"question_index": 0})
    fed = 0
    for t in tokens:
        obs, _, terminated, truncated, info = env.step(t)
        fed += 1
        if terminated or truncated:
            break
    events = [(turn.kind, turn.content) for turn in env.episode.turns]
    return events, fed, info, obs


def check_stream(tokens: list[int]) -> None:
    events, fed, _, obs = run_env(tokens)
    ref_events, ref_fed = reference_events(tokens)
    assert fed == ref_fed
    assert events == ref_events
    n = int(obs["length"][0])
    sources = obs["sources"][:n]
    policy = obs["tokens"][:n][sources == Source.POLICY]
    assert policy.tolist() == tokens[:fed]  # the transcript holds exactly the fed tokens
    assert set(sources.tolist()) <= {Source.PROMPT, Source.POLICY, Source.TOOL}
    prompt = make_env().episode.prompt_length
    assert (sources[:prompt] == Source.PROMPT).all()
    assert (sources[prompt:] != Source.PROMPT).all()  # after the prompt, only policy and tool tokens


@lru_cache(maxsize=1)
def tag_piece_ids() -> list[int]:
    tok = builtin_tokenizer()
    pieces = [
        "<search>",
        "</search>",
        "<answer>",
        "</answer>",
        " </",
        "search>",
        "answer>",
        "<",
        "</",
        ">",
        "search",
        "answer",
        "/",
        " Paris",
        "\n",
    ]
    ids = sorted({i for p in pieces for i in tok.encode(p)})
    return [*ids, int(tok.eos_token_id or 0)]


token_ids = st.one_of(st.integers(0, 8191), st.sampled_from(tag_piece_ids()))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(token_ids, min_size=1, max_size=200))
def test_random_token_streams(tokens: list[int]) -> None:
    check_stream(tokens)


fragments = st.sampled_from(
    [
        "<search>",
        "</search>",
        "<answer>",
        "</answer>",
        "<search> Lyku Works </search>",
        "<answer> 1902 </answer>",
        "<think>",
        "</think>",
        "Paris",
        " ",
        "\n",
        "é",
        "🙂",
        "</",
        "search>",
        ">.",
        "<|endoftext|>",
        "</search>And",
    ]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(fragments, st.text(max_size=12)), min_size=1, max_size=20))
def test_streams_encoded_from_text(parts: list[str]) -> None:
    tok = builtin_tokenizer()
    check_stream(tok.encode("".join(parts)))


def test_tag_spanning_tokens_and_sharing_a_token_with_following_text() -> None:
    tok = builtin_tokenizer()
    text = "<search> q </search>.And then"  # ">." is one token with the built-in tokenizer
    ids = tok.encode(text)
    assert any(tok.token_bytes[i].startswith(b">") and len(tok.token_bytes[i]) > 1 for i in ids)
    events, fed, info, obs = run_env(ids)
    stop_at = next(i for i in range(len(ids)) if "</search>" in tok.decode(ids[: i + 1]))
    assert events[0] == ("search", "q")
    assert make_env().episode.turns[0].end == make_env().episode.prompt_length + stop_at + 1
    check_stream(ids)


def test_every_single_token_id_is_accepted() -> None:
    env = make_env()
    env.reset(seed=0)
    for t in range(env.tokenizer.vocab_size):
        _, _, terminated, truncated, _ = env.step(t)
        if terminated or truncated:
            env.reset(seed=t)
