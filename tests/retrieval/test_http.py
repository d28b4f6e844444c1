"""The HTTP retriever: parsing, retries, faults (stopped, restarted, silent servers), the env over HTTP.

Importing searchgym registers the env ids.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import pytest

from searchgym.agents import OracleAgent, run_episode
from searchgym.errors import ConfigError, RetrieverError
from searchgym.retrieval import BM25Retriever, make_retriever
from searchgym.retrieval.http import HttpRetriever
from searchgym.server import ServerThread, create_app


@pytest.fixture(scope="module")
def app(world: Any, retriever: BM25Retriever) -> Any:
    return create_app(retriever, world.passages)


@pytest.fixture(scope="module")
def server(app: Any) -> Iterator[ServerThread]:
    with ServerThread(app) as running:
        yield running


def scripted_app(answers: list[tuple[int, Any]]) -> tuple[Any, list[int]]:
    """A server answering POST /retrieve with the given (status, JSON) pairs in turn; counts the calls."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    calls: list[int] = []
    app = FastAPI()

    async def retrieve(request: Any) -> JSONResponse:
        status, body = answers[min(len(calls), len(answers) - 1)]
        calls.append(status)
        return JSONResponse(body, status_code=status)

    app.add_route("/retrieve", retrieve, methods=["POST"])
    return app, calls


DOC = {"document": {"id": "7", "contents": '"A Title"\nsome text'}, "score": 2.5}


def test_same_hits_as_in_process(server: ServerThread, retriever: BM25Retriever, world: Any) -> None:
    queries = [q.question for q in world.splits["test"][:20]] + ["", "zzz unknown"]
    with HttpRetriever(server.url + "/retrieve") as client:
        assert client.search(queries, 3) == retriever.search(queries, 3)
        assert client.search([], 3) == []


def test_url_without_path_gets_retrieve(server: ServerThread) -> None:
    with HttpRetriever(server.url) as client:
        assert client.url.endswith("/retrieve")
        assert len(client.search(["a"], 2)[0]) == 2


def test_large_batches_are_split(server: ServerThread, retriever: BM25Retriever, world: Any) -> None:
    queries = [q.question for q in world.splits["test"][:25]]
    with HttpRetriever(server.url, max_batch=4) as client:
        assert client.search(queries, 2) == retriever.search(queries, 2)


def test_invalid_configuration() -> None:
    for kwargs in (
        {"url": "ftp://x/retrieve"},
        {"url": "http://"},
        {"url": "http://h", "timeout": 0},
        {"url": "http://h", "retries": -1},
        {"url": "http://h", "max_batch": 0},
        {"url": "http://h", "backoff": -1},
    ):
        with pytest.raises(ConfigError):
            HttpRetriever(**kwargs)


def test_bare_documents_without_scores_are_read() -> None:
    app, _ = scripted_app([(200, {"result": [[DOC["document"]]]})])
    with ServerThread(app) as srv, HttpRetriever(srv.url) as client:
        (hit,) = client.search(["q"], 3)[0]
    assert (hit.passage_id, hit.title, hit.text) == ("7", "A Title", "some text")
    assert hit.score != hit.score  # NaN: the server sent no score


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"result": []}, "answered 0 lists for 1 queries"),
        ({"nope": 1}, "no 'result' list"),
        ({"result": [[DOC] * 4]}, "at most 3 documents"),
        ({"result": [[{"document": {"id": ["1"], "contents": "x"}}]]}, "id that is not a string"),
        ({"result": [["not a document"]]}, "non-object document"),
        ({"result": [[{"document": {"id": "1"}}]]}, "without 'contents'"),
        ({"result": [[{**DOC, "score": "high"}]]}, "non-numeric score"),
    ],
)
def test_malformed_answers_raise(body: Any, message: str) -> None:
    app, _ = scripted_app([(200, body)])
    with (
        ServerThread(app) as srv,
        HttpRetriever(srv.url) as client,
        pytest.raises(RetrieverError, match=message),
    ):
        client.search(["q"], 3)


def test_transient_statuses_are_retried_then_succeed() -> None:
    app, calls = scripted_app([(503, {"detail": "busy"}), (502, {}), (200, {"result": [[DOC]]})])
    with ServerThread(app) as srv, HttpRetriever(srv.url, retries=2, backoff=0.01) as client:
        assert client.search(["q"], 3)[0][0].score == 2.5
    assert calls == [503, 502, 200]


def test_client_errors_are_not_retried() -> None:
    app, calls = scripted_app([(422, {"detail": "'topk' must be in [1, 100], got 500"})])
    with (
        ServerThread(app) as srv,
        HttpRetriever(srv.url, retries=3, backoff=0.01) as client,
        pytest.raises(RetrieverError, match=r"HTTP 422: 'topk' must be in \[1, 100\]"),
    ):
        client.search(["q"], 500)
    assert calls == [422]


def test_exhausted_retries_name_the_last_error() -> None:
    app, calls = scripted_app([(503, {"detail": "overloaded"})])
    with (
        ServerThread(app) as srv,
        HttpRetriever(srv.url, retries=2, backoff=0.01) as client,
        pytest.raises(RetrieverError, match=r"after 3 attempts.*HTTP 503: overloaded"),
    ):
        client.search(["q"], 3)
    assert len(calls) == 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_stopped_server_raises_within_budget() -> None:
    client = HttpRetriever(f"http://127.0.0.1:{free_port()}/retrieve", timeout=1.0, retries=2, backoff=0.05)
    start = time.monotonic()
    with pytest.raises(RetrieverError, match=r"failed after 3 attempts.*ConnectError"):
        client.search(["q"], 3)
    assert time.monotonic() - start <= client.time_budget + 1.0
    client.close()


def test_silent_server_times_out_instead_of_hanging() -> None:
    # Accepts connections (the kernel completes the handshake) but never reads or answers.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/retrieve"
        with HttpRetriever(url, timeout=0.3, retries=1, backoff=0.05) as client:
            start = time.monotonic()
            with pytest.raises(RetrieverError, match="Timeout"):
                client.search(["q"], 3)
            elapsed = time.monotonic() - start
            assert elapsed <= client.time_budget + 1.0, (elapsed, client.time_budget)


def test_restarted_server_is_recovered_by_retrying(app: Any, retriever: BM25Retriever) -> None:
    first = ServerThread(app).start()
    port = first.port
    client = HttpRetriever(first.url, timeout=2.0, retries=6, backoff=0.05)
    expected = retriever.search(["Who founded a guild?"], 3)
    assert client.search(["Who founded a guild?"], 3) == expected  # a kept-alive connection exists now
    first.stop()
    with pytest.raises(RetrieverError):  # down, and no retries: fails fast
        HttpRetriever(first.url, timeout=2.0, retries=0).search(["q"], 3)
    restarted: list[ServerThread] = []
    timer = threading.Timer(0.2, lambda: restarted.append(ServerThread(app, port=port).start()))
    timer.start()
    try:
        # Attempts at 0, 0.05, 0.15, 0.35 s...: the server is back on the same port after 0.2 s.
        assert client.search(["Who founded a guild?"], 3) == expected
    finally:
        timer.join()
        client.close()
        for srv in restarted:
            srv.stop()


def test_patience_waits_for_a_server_that_comes_back(app: Any, retriever: BM25Retriever) -> None:
    """Retries spent, the client waits (one line when it starts, one when the server is back) and the call
    returns the same hits as if nothing had happened."""
    first = ServerThread(app).start()
    port, url = first.port, first.url
    first.stop()
    lines: list[str] = []
    client = HttpRetriever(
        url, timeout=1.0, retries=1, backoff=0.05, max_backoff=0.2, patience=30, log=lines.append
    )
    timer = threading.Timer(1.5, lambda: restarted.append(ServerThread(app, port=port).start()))
    restarted: list[ServerThread] = []
    timer.start()
    try:
        start = time.monotonic()
        assert client.search(["Who founded a guild?"], 3) == retriever.search(["Who founded a guild?"], 3)
        assert time.monotonic() - start >= 1.4  # it did wait for the restart
    finally:
        timer.join()
        client.close()
        for srv in restarted:
            srv.stop()
    assert len(lines) == 2, lines
    assert "is not answering (ConnectError" in lines[0] and "waiting up to 30s" in lines[0]
    assert "is back after" in lines[1] and "continuing" in lines[1]


def test_patience_runs_out_with_the_clear_error() -> None:
    lines: list[str] = []
    url = f"http://127.0.0.1:{free_port()}/retrieve"
    client = HttpRetriever(
        url, timeout=0.5, retries=1, backoff=0.05, max_backoff=0.1, patience=0.6, log=lines.append
    )
    start = time.monotonic()
    with pytest.raises(
        RetrieverError, match=r"failed after 2 attempts .*then waited 0.6s for it; last error: ConnectError"
    ):
        client.search(["q"], 3)
    assert 0.6 <= time.monotonic() - start <= 0.6 + client.time_budget + 1.0
    assert len(lines) == 1 and "waiting up to 0.6s" in lines[0]
    client.close()


def test_patience_zero_keeps_the_immediate_error() -> None:
    lines: list[str] = []
    client = HttpRetriever(
        f"http://127.0.0.1:{free_port()}/retrieve", retries=2, backoff=0.01, log=lines.append
    )
    with pytest.raises(
        RetrieverError, match=r"failed after 3 attempts \(deadline 10s each\); last error: ConnectError"
    ):
        client.search(["q"], 3)
    assert lines == []  # nothing waited for
    client.close()


def test_patience_waits_for_503_but_not_for_a_wrong_answer() -> None:
    """503 (not there yet) is waited for; a 4xx or a malformed body (answered wrong) fails at once."""
    app, calls = scripted_app([(503, {"detail": "starting"})] * 4 + [(200, {"result": [[DOC]]})])
    lines: list[str] = []
    with (
        ServerThread(app) as srv,
        HttpRetriever(
            srv.url, retries=1, backoff=0.01, max_backoff=0.02, patience=30, log=lines.append
        ) as client,
    ):
        assert client.search(["q"], 3)[0][0].score == 2.5
    assert calls == [503] * 4 + [200] and len(lines) == 2
    for answers, message in (
        ([(422, {"detail": "bad topk"})], "HTTP 422: bad topk"),
        ([(200, {"no": "result"})], "no 'result' list"),
    ):
        app, calls = scripted_app(answers)
        with (
            ServerThread(app) as srv,
            HttpRetriever(srv.url, retries=1, backoff=0.01, patience=30, log=lines.append) as client,
        ):
            start = time.monotonic()
            with pytest.raises(RetrieverError, match=message):
                client.search(["q"], 3)
            assert time.monotonic() - start < 5 and len(calls) == 1


def test_patience_is_validated_and_reaches_the_env(server: ServerThread) -> None:
    with pytest.raises(ConfigError, match="patience"):
        HttpRetriever(server.url, patience=-1)
    with pytest.raises(ConfigError, match="retriever_patience"):
        gym.make("SearchQA-v0", retriever=server.url, retriever_patience=float("nan"))
    env = gym.make("SearchQA-v0", retriever=server.url + "/retrieve", retriever_patience=42)
    try:
        assert env.unwrapped.retriever.patience == 42.0
    finally:
        env.close()


def test_env_episodes_over_http_equal_in_process(
    server: ServerThread, retriever: BM25Retriever, world: Any
) -> None:
    """The oracle agent plays the same episodes with the HTTP retriever as with the in-process one."""
    records = {}
    for name, spec in (("local", retriever), ("http", server.url + "/retrieve")):
        env = gym.make("SearchQA-v0", dataset=world, retriever=spec, split="test")
        base: Any = env.unwrapped
        agent = OracleAgent(base.dataset, base.split, base.tokenizer, base.config.max_turns)
        records[name] = [
            run_episode(env, agent, seed=i, options={"question_index": i}) for i in range(0, 60, 10)
        ]
        env.close()
    assert any(r.info["searches"] > 0 for r in records["local"])
    for local, http in zip(records["local"], records["http"], strict=True):
        assert http.transcript == local.transcript
        assert http.info == local.info
        assert http.reward == local.reward


def test_make_retriever_url_is_http(server: ServerThread, world: Any) -> None:
    client = make_retriever(server.url + "/retrieve", world.passages)
    assert isinstance(client, HttpRetriever)
    client.close()
