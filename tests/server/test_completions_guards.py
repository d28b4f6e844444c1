"""``serve-policy``'s app against hostile bodies, as ``searchgym serve`` is guarded: the body parsed by the same
bounded parser off the event loop, a prompt's size checked before it is tokenized, a prompt the model
cannot take refused, every bad request one 4xx line (never a 500), and options out of range refused at
start."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from searchgym.errors import ConfigError
from searchgym.server import ServerLimits, ServerThread
from searchgym.server.completions import MAX_CHARS_PER_TOKEN, CompletionLimits, create_completions_app

from ..conftest import SERVER_WAIT
from .test_completions import Scripted

FIXTURE_CHECKPOINT = Path(__file__).parents[1] / "agents" / "training" / "fixtures" / "sft-checkpoint.pt"


class Counting(Scripted):
    """A scripted generator that counts the characters it was asked to encode."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.encoded: list[int] = []

    def encode(self, text: str) -> list[int]:
        self.encoded.append(len(text))
        return super().encode(text)


@pytest.fixture
def guarded() -> Any:
    generator = Counting("<answer> x </answer>")
    limits = CompletionLimits(
        max_tokens_max=8,
        max_prompt_tokens=1000,
        max_waiting=4,
        context_tokens=1024,
        connection=ServerLimits(max_body_bytes=8 * 2**20, max_concurrent=2),
    )
    with ServerThread(create_completions_app(generator, "scripted", limits)) as server:
        yield server, generator


def _post(server: Any, content: bytes | None = None, **body: Any) -> httpx.Response:
    if content is not None:
        return httpx.post(
            server.url + "/v1/completions",
            content=content,
            headers={"content-type": "application/json"},
            timeout=SERVER_WAIT,
        )
    return httpx.post(server.url + "/v1/completions", json=body, timeout=SERVER_WAIT)


def _one_line(response: httpx.Response, status: int, part: str) -> None:
    assert response.status_code == status, response.text
    message = response.json()["error"]["message"]
    assert part in message and "\n" not in message, message


def test_a_huge_prompt_is_refused_before_it_is_tokenized(guarded: Any) -> None:
    server, generator = guarded
    prompt = "word " * (1000 * MAX_CHARS_PER_TOKEN // 5 + 1000)  # 3.9 MiB would do the same, slower to send
    _one_line(_post(server, prompt=prompt), 400, "refused before tokenizing")
    _one_line(
        httpx.post(
            server.url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": prompt}]},
            timeout=SERVER_WAIT,
        ),
        400,
        "refused before tokenizing",
    )
    assert all(n <= 1000 * MAX_CHARS_PER_TOKEN for n in generator.encoded)
    assert not generator.calls  # nothing was generated


@pytest.mark.slow
def test_health_answers_while_bodies_of_a_million_empty_lists_are_parsed(guarded: Any) -> None:
    server, generator = guarded
    body = b'{"prompt": [' + b",".join([b"[]"] * 1_300_000) + b"]}"
    answers: list[httpx.Response] = []

    def send() -> None:
        answers.append(_post(server, body))

    senders = [threading.Thread(target=send) for _ in range(2)]
    for t in senders:
        t.start()
    slowest = 0.0
    with httpx.Client(base_url=server.url, timeout=SERVER_WAIT) as client:
        while any(t.is_alive() for t in senders):
            start = time.monotonic()
            assert client.get("/health").status_code == 200
            slowest = max(slowest, time.monotonic() - start)
            time.sleep(0.02)
    for t in senders:
        t.join()
    for answer in answers:
        _one_line(answer, 413, "more than 2024 JSON values")  # max_prompt_tokens + 1,024
    assert slowest < 1.5, slowest  # json.loads of such a body held the GIL for seconds
    assert not generator.calls


@pytest.mark.parametrize(
    ("content", "status", "part"),
    [
        (b"[" * 100_000 + b"]" * 100_000, 400, "request body must be a JSON object"),
        (b'{"prompt": ' * 100_000, 400, "request body must be a JSON object"),
        (b'{"prompt": "x", "seed": 1180591620717411303424}', 400, "seed must be an integer in"),
        (b'{"prompt": "x", "seed": -9223372036854775809}', 400, "seed must be an integer in"),
        (b'{"prompt": "x", "seed": 1.5}', 400, "seed must be an integer in"),
        (b'{"prompt": "x", "max_tokens": NaN}', 400, "max_tokens must be"),
        (b'{"prompt": "x", "temperature": Infinity}', 400, "temperature must be"),
        (b'{"prompt": "x", "max_tokens": 1e400}', 400, "max_tokens must be"),
        (b'{"prompt": "x", "stop": [1]}', 400, "stop must be"),
        (b'{"prompt": "\\ud800"}', 400, "the prompt is not text: a lone surrogate at character 0"),
        (b"\xff\xfe\x00", 400, "request body must be a JSON object"),
        (b'{"prompt": 1' + b"0" * 5000 + b"}", 400, "request body must be a JSON object"),
    ],
    ids=[
        "nested",
        "open",
        "seed-2**70",
        "seed-below",
        "seed-float",
        "nan",
        "inf",
        "1e400",
        "stop",
        "surrogate",
        "bytes",
        "int-bomb",
    ],
)
def test_bad_bodies_are_one_4xx_line_never_a_500(
    guarded: Any, content: bytes, status: int, part: str
) -> None:
    server, _ = guarded
    _one_line(_post(server, content), status, part)


def test_a_prompt_the_model_cannot_take_is_a_400_that_says_so(guarded: Any) -> None:
    server, generator = guarded
    _one_line(_post(server, prompt=list(range(5)) * 201), 400, "the model's context holds 1024 tokens")
    assert _post(server, prompt=[5] * 1000, max_tokens=8).status_code == 200  # the longest it takes
    assert generator.calls[-1]["ids"] == [5] * 1000


def test_options_out_of_range_are_refused() -> None:
    with pytest.raises(ConfigError, match="leaves the model no room to write: its context holds 1024"):
        CompletionLimits(max_prompt_tokens=99_999_999, context_tokens=1024)
    with pytest.raises(ConfigError, match="give at most 1023"):
        CompletionLimits(max_prompt_tokens=1024, context_tokens=1024)
    CompletionLimits(max_prompt_tokens=1023, context_tokens=1024)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("options", "part"),
    [
        (["--max-body-mb", "-1"], "--max-body-mb must be a positive number of MiB, got -1.0"),
        (["--max-body-mb", "nan"], "--max-body-mb must be a positive number of MiB"),
        (["--max-body-mb", "0"], "--max-body-mb must be a positive number of MiB"),
        (["--read-timeout", "-1"], "read_timeout must be a number of seconds > 0"),
        (["--max-connections", "0"], "max_connections must be an integer >= 1"),
        (["--max-prompt-tokens", "99999999"], "--max-prompt-tokens) 99999999 leaves the model no room"),
    ],
)
def test_serve_policy_refuses_options_out_of_range_at_start(
    options: list[str], part: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from searchgym.app.cli import main

    assert main(["serve-policy", str(FIXTURE_CHECKPOINT), "--port", "0", *options]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and part in err[0], err
