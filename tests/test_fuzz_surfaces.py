"""Fuzzing what arrives over the wire or in a protocol, beside the files of ``test_fuzz_files.py``: bodies sent
to ``serve-policy``, answers an ``openai:`` agent receives (slow, endless, huge, malformed, NaN — the slow
and endless ones against a real socket in ``tests/server/test_hostile_served_model.py``), and study
protocols. Each case is a valid example mutated (bytes flipped, cut, repeated, or a bomb put in: nesting
100,000 deep, a 5,000-digit integer, NaN, 1e400, a lone surrogate, a long string) and must end in one typed
line or a 4xx, never a raw exception or a 500; what does load must be what the rules allow (a played
episode's record is strict JSON; a study never writes into a folder it did not start).

The default run tries a few reproducible cases per surface; ``pytest -m fuzz`` runs 400 random ones each.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchgym.errors import SearchGymError

COUNTS = [pytest.param(12, id="quick"), pytest.param(400, id="long", marks=pytest.mark.fuzz)]

BOMBS = [
    b"[" * 100_000,
    b"{" * 50_000,
    b"1" + b"0" * 5000,
    b"NaN",
    b"-Infinity",
    b"1e400",
    b'"\\ud800"',
    b'"' + b"x" * 300_000 + b'"',
    b"\xff\xfe",
    b"null",
    b"[]",
    b'{"a": 1}',
]


class Body(bytes):
    """A mutated document, shown cut short (a failing case may hold a 300 KB string)."""

    def __repr__(self) -> str:
        text = bytes(self)
        return repr(text if len(text) <= 300 else text[:150] + b"..." + text[-150:]) + f" ({len(text)} bytes)"


@st.composite
def mutated(draw: Any, seed: bytes) -> Body:
    """``seed`` with one to three mutations."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "cut", "repeat", "bomb", "replace-value"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            data = data[:at]
        elif kind == "repeat":
            end = draw(st.integers(at, len(data)))
            data[at:at] = data[at:end] * draw(st.integers(1, 50))
        elif kind == "bomb":
            data[at:at] = draw(st.sampled_from(BOMBS))
        else:  # a value after a colon replaced by a bomb, keeping the document's shape around it
            colons = [i for i, c in enumerate(data) if c == ord(":")]
            if colons:
                colon = draw(st.sampled_from(colons))
                end = next((i for i in range(colon + 1, len(data)) if data[i] in b",}]"), len(data))
                data[colon + 1 : end] = b" " + draw(st.sampled_from(BOMBS))
    return Body(data)


def _fuzz(name: str, count: int, strategy: Any, check: Callable[[Any], str]) -> None:
    """Runs ``check`` on ``count`` cases of ``strategy`` (reproducible in the quick run) and prints how the
    cases ended (``check`` returns the outcome; ``pytest -m fuzz -s`` shows the counts)."""
    outcomes: Counter[str] = Counter()

    @settings(
        max_examples=count,
        deadline=None,
        derandomize=count < 100,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def run(case: Any) -> None:
        outcomes[check(case)] += 1

    run()
    print(
        f"{name}: {sum(outcomes.values())} cases, "
        + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
    )


# -- serve-policy bodies -----------------------------------------------------------------------------------

COMPLETION = json.dumps(
    {
        "model": "scripted",
        "prompt": "Q: where?",
        "max_tokens": 4,
        "temperature": 0,
        "stop": ["</search>"],
        "seed": 3,
        "top_p": 0.9,
        "n": 1,
    }
).encode()
CHAT = json.dumps(
    {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": " A"}]}
).encode()
STREAMED = json.dumps(
    {
        "messages": [{"role": "user", "content": "Q"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
).encode()


@pytest.fixture(scope="module")
def policy_server() -> Iterator[Any]:
    from searchgym.server import ServerLimits, ServerThread
    from searchgym.server.completions import CompletionLimits, create_completions_app

    from .server.test_completions import Scripted

    limits = CompletionLimits(
        max_tokens_max=8,
        max_prompt_tokens=500,
        context_tokens=512,
        connection=ServerLimits(max_body_bytes=2**20),
    )
    with ServerThread(create_completions_app(Scripted("<answer> x </answer>"), "scripted", limits)) as server:
        yield server


@pytest.mark.parametrize("count", COUNTS)
def test_serve_policy_bodies_are_answered_or_refused_with_one_4xx_line(
    policy_server: Any, count: int
) -> None:
    import httpx

    from .conftest import SERVER_WAIT

    with httpx.Client(base_url=policy_server.url, timeout=SERVER_WAIT) as client:

        def check(case: tuple[str, bytes]) -> str:
            route, body = case
            response = client.post(route, content=body, headers={"content-type": "application/json"})
            assert response.status_code < 500, response.text[:300]
            if (
                response.status_code >= 400
            ):  # the app's {"error": {"message"}}, or the body guard's {"detail"}
                answer = response.json()
                message = answer["error"]["message"] if "error" in answer else answer["detail"]
                assert message and "\n" not in message and "Traceback" not in message
            return f"HTTP {response.status_code}"

        strategy = st.one_of(
            st.tuples(st.just("/v1/completions"), mutated(COMPLETION)),
            st.tuples(st.just("/v1/chat/completions"), mutated(CHAT)),
            st.tuples(st.just("/v1/chat/completions"), mutated(STREAMED)),
        )
        _fuzz("serve-policy bodies", count, strategy, check)
        assert client.get("/health").status_code == 200


# -- openai: answers ---------------------------------------------------------------------------------------

ANSWER = json.dumps(
    {
        "id": "c",
        "choices": [
            {
                "index": 0,
                "text": " <search> where ",
                "finish_reason": "stop",
                "stop_reason": "</search>",
                "token_ids": [5, 6],
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2},
    }
).encode()


@pytest.mark.parametrize("count", COUNTS)
def test_openai_answers_play_or_stop_with_one_line_and_records_stay_strict_json(count: int) -> None:
    import gymnasium as gym
    import httpx

    import searchgym  # noqa: F401 - registers the env ids
    from searchgym.agents import evaluate
    from searchgym.agents.served import ServedAgent, ServedOptions
    from searchgym.errors import ServedModelError

    env = gym.make("SearchQA-v0", max_turns=2, max_turn_tokens=12)
    tokenizer = env.unwrapped.tokenizer

    def check(case: tuple[int, bytes, bool]) -> str:
        status, body, token_ids = case
        transport = httpx.MockTransport(lambda request: httpx.Response(status, content=body))
        options = ServedOptions("m", "http://127.0.0.1:9/v1", retries=0, token_ids=token_ids)
        agent = ServedAgent(options, tokenizer, 12, transport=transport)
        try:
            record = evaluate(env, agent, 1).records[0]
        except ServedModelError as e:
            assert "\n" not in str(e) and "http://127.0.0.1:9/v1" in str(e)
            return "one line"
        finally:
            agent.close()
        json.dumps(record.to_json(), allow_nan=False)  # strict JSON, whatever the server sent
        return "played"

    strategy = st.tuples(st.sampled_from([200, 200, 200, 400, 429, 500]), mutated(ANSWER), st.booleans())
    _fuzz("openai: answers", count, strategy, check)
    env.close()


# -- study protocols ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", COUNTS)
def test_study_protocols_load_or_are_one_line_and_never_reach_a_folder_they_did_not_start(
    tmp_path: Path, count: int
) -> None:
    import hashlib

    from searchgym.app.study.protocol import load_protocol
    from searchgym.app.study.runner import check_run_folders, run_states
    from searchgym.errors import ConfigError

    from .app.study.conftest import TINY_PROTOCOL

    warm = tmp_path / "warm" / "checkpoint.pt"
    warm.parent.mkdir()
    warm.write_bytes(b"stand-in")
    foreign = tmp_path / "other" / "grpo" / "s0"
    foreign.mkdir(parents=True)
    (foreign / "metrics.jsonl").write_text('{"step": 1}\n')
    text = TINY_PROTOCOL.format(sha256=hashlib.sha256(b"stand-in").hexdigest(), extra_arms="")
    seeds = [text.encode(), text.replace('runs = "runs"', 'runs = "other"').encode()]
    path = tmp_path / "p.toml"

    def check(body: bytes) -> str:
        path.write_bytes(body)
        try:
            protocol = load_protocol(path)
            check_run_folders(protocol, run_states(protocol, exact=False), protocol.runs_dir)
        except ConfigError as e:
            assert "\n" not in str(e)
            return "refused: the foreign folder" if str(foreign.parent) in str(e) else "one line"
        # Loaded and allowed: the foreign folder is not among its run folders, or the check refused it above.
        assert not any(
            (protocol.runs_dir / arm / f"s{seed}").resolve() == foreign.resolve()
            for arm, seed in protocol.runs()
        )
        return "loaded"

    _fuzz("study protocols", count, st.one_of(mutated(seeds[0]), mutated(seeds[1])), check)
    assert (foreign / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_typed_errors_are_searchgym_errors() -> None:
    """The typed lines above are the package's own errors (what the CLI prints as one line, exit 2)."""
    from searchgym.errors import ConfigError, ServedModelError

    assert issubclass(ConfigError, SearchGymError) and issubclass(ServedModelError, SearchGymError)
