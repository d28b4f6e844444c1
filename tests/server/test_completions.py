"""The OpenAI-compatible completions app over a scripted generator, and the ``openai:`` agent against it: the
requests it sends, the tokens it plays, and one clear line when the server is down or answers garbage."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import gymnasium as gym
import httpx
import pytest

import searchgym  # noqa: F401 - registers the env ids
from searchgym.agents import evaluate
from searchgym.agents.served import ServedAgent, ServedOptions
from searchgym.errors import ConfigError, ServedModelError
from searchgym.server import ServerThread
from searchgym.server.completions import Completion, CompletionLimits, create_completions_app
from searchgym.tokenization import load_tokenizer

from ..conftest import SERVER_WAIT


class Scripted:
    """A generator that writes a fixed text (cut at the first stop string), and records its calls."""

    def __init__(self, text: str) -> None:
        self.tokenizer = load_tokenizer(None)
        self.vocab_size = self.tokenizer.vocab_size
        self.text = text
        self.calls: list[dict[str, Any]] = []

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def complete(
        self,
        ids: list[int],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        seed: Any,
        stops: list[str],
    ) -> Completion:
        self.calls.append({"ids": ids, "max_tokens": max_tokens, "temperature": temperature, "seed": seed})
        found = [(self.text.find(s), s) for s in stops if s in self.text]
        if found:
            at, stop = min(found)
            return Completion(self.encode(self.text[: at + len(stop)]), self.text[:at], "stop", stop)
        return Completion(self.encode(self.text), self.text, "length", None)


@pytest.fixture
def served() -> Any:
    generator = Scripted("<search> where </search> then more")
    limits = CompletionLimits(max_tokens_max=64, max_prompt_tokens=4000, max_waiting=4)
    with ServerThread(create_completions_app(generator, "scripted", limits)) as server:
        yield server, generator


def test_the_app_answers_completions_and_chats_as_openai_does(served: Any) -> None:
    server, generator = served
    with httpx.Client(base_url=server.url, timeout=SERVER_WAIT) as client:
        answer = client.post(
            "/v1/completions",
            json={"model": "scripted", "prompt": "Q:", "max_tokens": 9, "stop": ["</search>"]},
        ).json()
        choice = answer["choices"][0]
        assert choice["text"] == "<search> where " and choice["finish_reason"] == "stop"
        assert choice["stop_reason"] == "</search>"
        assert answer["usage"]["prompt_tokens"] == len(generator.encode("Q:"))
        assert answer["usage"]["completion_tokens"] == len(choice["token_ids"])
        assert generator.calls[-1]["max_tokens"] == 9 and generator.calls[-1]["temperature"] == 1.0
        chat = client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Q:"}, {"role": "assistant", "content": " A"}]},
        ).json()
        assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["role"] == "assistant"
        assert generator.calls[-1]["ids"] == generator.encode("Q: A")  # the contents joined in order
        assert generator.calls[-1]["max_tokens"] == 64  # the server's cap when the request gives none
        ids = client.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 1}).json()
        assert ids["usage"]["prompt_tokens"] == 3 and generator.calls[-1]["ids"] == [5, 6, 7]
        assert client.get("/v1/models").json()["data"][0]["id"] == "scripted"


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"model": "other", "prompt": "x"}, 404, "model 'other' is not served here"),
        ({"prompt": "x", "stream": "yes"}, 400, "stream must be true or false, got 'yes'"),
        ({"prompt": "x", "stream": True, "stream_options": []}, 400, "stream_options must be an object"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "only allowed with stream=true"),
        ({"prompt": "x", "n": 2}, 400, "n must be 1"),
        ({"prompt": "x", "max_tokens": 65}, 400, "max_tokens must be an integer in 1..64"),
        ({"prompt": "x", "temperature": -1}, 400, "temperature must be"),
        ({"prompt": [10**9]}, 400, "prompt token ids must lie in"),
        ({"prompt": 5}, 400, "prompt must be a string or a non-empty list of token ids"),
        ({"prompt": "x" * 5000}, 400, "more than this server's 4000"),
        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "at most 4"),
        ([1, 2], 400, "a JSON object"),
    ],
)
def test_bad_requests_get_one_clear_message(served: Any, body: Any, status: int, message: str) -> None:
    server, _ = served
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=SERVER_WAIT)
    assert response.status_code == status
    assert message in response.json()["error"]["message"]


def _sse(response: httpx.Response) -> list[Any]:
    """The ``data:`` payloads of a server-sent-event answer, ``[DONE]`` kept as the string."""
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [e for e in response.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), events
    return [e[6:] if e == "data: [DONE]" else json.loads(e[6:]) for e in events]


def test_streamed_answers_are_openai_chunks_ending_in_done(served: Any) -> None:
    """Raw SSE, both routes: the chunks join to the unstreamed text, the last choice has the finish reason,
    the usage chunk comes only when asked, then ``[DONE]``."""
    server, generator = served
    body = {"model": "scripted", "prompt": "Q:", "max_tokens": 9, "stop": ["</search>"]}
    with httpx.Client(base_url=server.url, timeout=SERVER_WAIT) as client:
        whole = client.post("/v1/completions", json=body).json()
        events = _sse(client.post("/v1/completions", json={**body, "stream": True}))
        assert events[-1] == "[DONE]" and all(e["object"] == "text_completion" for e in events[:-1])
        assert "".join(e["choices"][0]["text"] for e in events[:-1]) == whole["choices"][0]["text"]
        assert events[-2]["choices"][0]["finish_reason"] == "stop"
        assert events[-2]["choices"][0]["stop_reason"] == "</search>"
        assert all("usage" not in e for e in events[:-1])  # not asked
        messages = [{"role": "user", "content": "Q:"}]
        asked = {"messages": messages, "stream": True, "stream_options": {"include_usage": True}}
        events = _sse(client.post("/v1/chat/completions", json=asked))
    chunks, usage = events[:-2], events[-2]
    assert events[-1] == "[DONE]" and all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == generator.text  # no stop asked: the whole text
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["usage"] is None for c in chunks) and usage["choices"] == []
    assert usage["usage"]["prompt_tokens"] == len(generator.encode("Q:"))
    assert usage["usage"]["completion_tokens"] == len(chunks[-1]["choices"][0]["token_ids"])
    assert len({e["id"] for e in events[:-1]}) == 1


def test_the_openai_clients_streaming_api_reads_the_chunks(served: Any) -> None:
    """The ``openai`` package's own streaming readers (chat and completions), as verifiers' harness uses
    them: the streamed text, finish reason and usage are those of the unstreamed answer."""
    openai = pytest.importorskip("openai", reason="the openai client is not installed")
    server, generator = served
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=SERVER_WAIT, max_retries=0)
    messages = [{"role": "user", "content": "Q:"}]
    whole = client.chat.completions.create(model="scripted", messages=messages, stop=["</search>"])
    with client.chat.completions.stream(
        model="scripted", messages=messages, stop=["</search>"], stream_options={"include_usage": True}
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].message.content == whole.choices[0].message.content == "<search> where "
    assert final.choices[0].finish_reason == "stop" and final.usage is not None
    assert final.usage.completion_tokens == whole.usage.completion_tokens
    pieces = client.completions.create(model="scripted", prompt="Q:", stream=True, max_tokens=5)
    assert "".join(p.choices[0].text for p in pieces) == generator.text
    client.close()


def _env() -> Any:
    return gym.make("SearchQA-v0", max_turns=2, max_turn_tokens=12)


def test_the_agent_plays_the_servers_turns_with_the_stop_put_back(served: Any) -> None:
    server, generator = served
    env = _env()
    agent = ServedAgent(ServedOptions("scripted", server.url + "/v1"), env.unwrapped.tokenizer, 12)
    summary = evaluate(env, agent, 2)
    record = summary.records[0]
    assert record.info["queries"][:1] == ["where"]  # "</search>", cut by the server, was put back
    requests = record.info["requests"]
    assert len(requests) == 2 and requests[0]["finish_reason"] == "stop"
    assert requests[0]["request"]["stop"] == ["</search>", "</answer>"]
    assert requests[0]["request"]["max_tokens"] == 12 and requests[0]["request"]["temperature"] == 0.0
    assert requests[1]["request"]["prompt"].endswith("</information>\n\n")  # the env's own tool text
    assert requests[0]["usage"]["completion_tokens"] > 0
    assert generator.calls[0]["seed"] == (0 * 1009) % 2**31 and generator.calls[2]["seed"] == 1009
    agent.close()


def test_chat_requests_continue_the_assistants_message(served: Any) -> None:
    server, _ = served
    env = _env()
    agent = ServedAgent(
        ServedOptions("scripted", server.url + "/v1", api="chat"), env.unwrapped.tokenizer, 12
    )
    record = evaluate(env, agent, 1).records[0]
    first, second = (r["request"] for r in record.info["requests"])
    assert [m["role"] for m in first["messages"]] == ["user"] and first["add_generation_prompt"] is True
    assert [m["role"] for m in second["messages"]] == ["user", "assistant"]
    assert second["continue_final_message"] is True
    assert second["messages"][1]["content"].startswith("<search> where </search>")
    agent.close()


def test_the_key_comes_from_the_environment_and_stays_out_of_the_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"choices": [{"text": " <answer> x", "finish_reason": "stop"}]})

    monkeypatch.setenv("MY_TEST_KEY", "sk-secret-123")
    env = _env()
    options = ServedOptions("m", "http://127.0.0.1:9/v1", api_key_env="MY_TEST_KEY")
    agent = ServedAgent(options, env.unwrapped.tokenizer, 12, transport=httpx.MockTransport(answer))
    record = evaluate(env, agent, 1).records[0]
    assert seen == ["Bearer sk-secret-123"]
    assert "sk-secret" not in json.dumps(record.to_json())
    assert record.info["end_reason"] == "answered"  # the stop was inferred from the tag the text opened


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (None, "cannot connect"),
        (httpx.Response(200, text="<html>hello</html>"), "answered something that is not JSON"),
        (httpx.Response(200, json={"result": 1}), "is not a completions response"),
        (httpx.Response(503, text="overloaded"), "HTTP 503: overloaded (2 tries)"),
        (httpx.Response(401, json={"error": "bad key"}), "refused the request: HTTP 401"),
    ],
)
def test_a_down_or_garbage_server_is_one_clear_line(reply: Any, message: str) -> None:
    env = _env()
    transport = None if reply is None else httpx.MockTransport(lambda request: reply)
    url = f"http://127.0.0.1:{_free_port()}/v1"
    agent = ServedAgent(ServedOptions("m", url, retries=1), env.unwrapped.tokenizer, 12, transport=transport)
    with pytest.raises(ServedModelError, match=re.escape(message)) as caught:
        evaluate(env, agent, 1)
    assert "\n" not in str(caught.value) and url in str(caught.value)


def test_bad_options_are_refused() -> None:
    with pytest.raises(ConfigError, match="--base-url must be"):
        ServedOptions("m", "localhost:8000")
    with pytest.raises(ConfigError, match="--token-ids needs --api completions"):
        ServedOptions("m", "http://h/v1", api="chat", token_ids=True)
    with pytest.raises(ConfigError, match="needs a model name"):
        ServedOptions("", "http://h/v1")


def test_concurrent_players_keep_n_requests_in_flight_and_play_the_same_episodes() -> None:
    import threading
    import time

    lock = threading.Lock()
    flight = {"now": 0, "most": 0}

    def answer(request: httpx.Request) -> httpx.Response:
        with lock:
            flight["now"] += 1
            flight["most"] = max(flight["most"], flight["now"])
        time.sleep(0.02)  # long enough for the other players' requests to arrive meanwhile
        # The answer depends on the prompt only: one agent or several, every episode is the same.
        prompt = json.loads(request.content)["prompt"]
        word = re.findall(r"Question: (\w+)", prompt)[0]
        with lock:
            flight["now"] -= 1
        return httpx.Response(200, json={"choices": [{"text": f" <answer> {word}", "finish_reason": "stop"}]})

    def players(n: int) -> list[tuple[Any, ServedAgent]]:
        out = []
        for _ in range(n):
            env = _env()
            options = ServedOptions("m", "http://127.0.0.1:9/v1")
            out.append(
                (
                    env,
                    ServedAgent(options, env.unwrapped.tokenizer, 12, transport=httpx.MockTransport(answer)),
                )
            )
        return out

    alone = players(1)
    one = evaluate(*alone[0], 12, seed=5)
    assert flight["most"] == 1
    three = players(3)
    seen: list[str] = []
    together = evaluate(
        *three[0], 12, seed=5, players=three[1:], on_episode=lambda r: seen.append(r.info["question_id"])
    )
    assert flight["most"] == 3
    fields = ("question_id", "answer", "em", "end_reason")
    assert [{k: r.info[k] for k in fields} for r in together.records] == [
        {k: r.info[k] for k in fields} for r in one.records
    ]
    assert [r.transcript for r in together.records] == [r.transcript for r in one.records]
    assert seen == [r.info["question_id"] for r in one.records]  # the callbacks come in episode order
    assert [r.info["requests"][0]["request"] for r in together.records] == [
        r.info["requests"][0]["request"] for r in one.records
    ]


def test_eval_concurrency_against_a_local_server_writes_what_one_at_a_time_does(
    served: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from searchgym.app.cli import main

    server, generator = served
    files = []
    for n in ("1", "3"):
        out = tmp_path / f"c{n}.jsonl"
        argv = ["eval", "--agent", "openai:scripted", "--base-url", server.url + "/v1", "--concurrency", n,
                "--max-turns", "2", "--max-turn-tokens", "12", "--episodes", "6", "--no-progress", "--out", str(out)]  # fmt: skip
        assert main(argv) == 0
        files.append([json.loads(line) for line in out.read_text().splitlines()])
    strip = ("requests",)  # each request's time differs
    assert [{k: v for k, v in r.items() if k not in strip} for r in files[0]] == [
        {k: v for k, v in r.items() if k not in strip} for r in files[1]
    ]
    assert len(generator.calls) == 2 * 6 * 2  # two turns per episode, both runs
    with pytest.raises(SystemExit):
        main(["eval", "--agent", "openai:scripted", "--base-url", server.url + "/v1", "--concurrency", "0"])
    assert "--concurrency: must be >= 1" in capsys.readouterr().err
