"""The HTTP retriever: parsing, retries, faults (stopped, restarted, silent servers), the env over HTTP.

Importing searchgym registers the env ids.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import pytest

from searchgym.agents import OracleAgent, run_episode
from searchgym.errors import ConfigError, RetrieverError
from searchgym.retrieval import BM25Retriever, make_retriever
from searchgym.retrieval.http import HttpRetriever, derived_id
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
    lines: list[str] = []
    client = HttpRetriever(
        url, timeout=1.0, retries=1, backoff=0.05, max_backoff=0.2, patience=30, log=lines.append
    )
    client.search(["Who founded a guild?"], 3)  # the server was up: patience is for one that went away
    first.stop()
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


def test_patience_runs_out_with_the_clear_error(app: Any) -> None:
    lines: list[str] = []
    server = ServerThread(app).start()
    client = HttpRetriever(
        server.url, timeout=0.5, retries=1, backoff=0.05, max_backoff=0.1, patience=0.6, log=lines.append
    )
    client.search(["q"], 3)
    server.stop()
    start = time.monotonic()
    with pytest.raises(
        RetrieverError, match=r"failed after 2 attempts .*then waited 0.6s for it; last error: ConnectError"
    ):
        client.search(["q"], 3)
    assert 0.6 <= time.monotonic() - start <= 0.6 + client.time_budget + 1.0
    assert len(lines) == 1 and "waiting up to 0.6s" in lines[0]
    client.close()


def test_a_server_that_never_answered_fails_in_seconds_whatever_the_patience() -> None:
    """Patience is for a server that was up and went away: an address where none ever answered (a typo, a
    server not started) fails once the retries are spent, saying so."""
    lines: list[str] = []
    client = HttpRetriever(
        f"http://127.0.0.1:{free_port()}/retrieve", retries=2, backoff=0.01, patience=300, log=lines.append
    )
    start = time.monotonic()
    with pytest.raises(
        RetrieverError, match=r"last error: ConnectError.*it never answered: is a server running"
    ):
        client.search(["q"], 3)
    assert time.monotonic() - start < client.time_budget + 1.0 and lines == []
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
        agent = OracleAgent(base.dataset, base.split, base.tokenizer, base.env_spec.max_turns)
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


# -- Search-R1-shaped servers on raw sockets: every byte under the test's control ------------------------------


class StubServer:
    """A Search-R1-shaped server on a raw socket: ``respond(conn)`` writes whatever bytes the test wants."""

    def __init__(self, respond: Callable[[socket.socket], None]) -> None:
        self.respond = respond
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/retrieve"
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                read_request(conn)
                self.respond(conn)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()


def read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += conn.recv(65536)
    return body


def http_answer(body: bytes, status: str = "200 OK") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode() + body


def json_server(answer: Any) -> StubServer:
    body = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
    return StubServer(lambda conn: conn.sendall(http_answer(body)))


def test_documents_without_an_id_are_accepted_with_a_stable_id() -> None:
    docs = [{"contents": '"Paris"\ncapital of France'}, {"contents": '"Lyon"\na city'}]
    stub = json_server({"result": [[{"document": d, "score": 1.0} for d in docs]]})
    try:
        with HttpRetriever(stub.url, retries=0) as client:
            first = client.search(["q"], 3)[0]
            second = client.search(["q"], 3)[0]
    finally:
        stub.close()
    assert [h.passage_id for h in first] == [derived_id(d["contents"]) for d in docs]
    assert [h.passage_id for h in first] == [h.passage_id for h in second]
    assert first[0].passage_id.startswith("sha1-") and first[0].passage_id != first[1].passage_id
    assert (first[0].title, first[0].text, first[0].contents) == (
        "Paris",
        "capital of France",
        docs[0]["contents"],
    )


@pytest.mark.parametrize("where", ["body", "headers"])
def test_a_slow_drip_server_cannot_outlast_the_deadline(where: str) -> None:
    body = json.dumps({"result": [[]]}).encode() + b" " * 400  # 40 s of dripping in all
    answer = http_answer(body)
    split = answer.index(b"\r\n\r\n") + 4 if where == "body" else 10
    stop = threading.Event()

    def drip(conn: socket.socket) -> None:
        conn.sendall(answer[:split])
        for byte in answer[split:]:
            if stop.wait(0.1):  # one byte every 0.1 s: each read is well within the timeout
                return
            conn.sendall(bytes([byte]))

    stub = StubServer(drip)
    client = HttpRetriever(stub.url, timeout=0.5, retries=1, backoff=0.05)
    start = time.monotonic()
    try:
        with pytest.raises(RetrieverError, match="Timeout"):
            client.search(["q"], 3)
        elapsed = time.monotonic() - start
    finally:
        stop.set()
        client.close()
        stub.close()
    # Slack for a loaded machine; the drip alone would take over 40 s.
    assert elapsed <= client.time_budget + 3.0, (elapsed, client.time_budget)


BAD_ANSWERS: list[tuple[str, Callable[[socket.socket], None]]] = [
    ("not json", lambda c: c.sendall(http_answer(b"<html>oops</html>"))),
    ("invalid utf-8", lambda c: c.sendall(http_answer(b'{"result": [["\xff"]]}'))),
    ("deep nesting", lambda c: c.sendall(http_answer(b"[" * 100_000))),
    ("a list body", lambda c: c.sendall(http_answer(b"[]"))),
    ("result not a list", lambda c: c.sendall(http_answer(b'{"result": 3}'))),
    ("wrong number of lists", lambda c: c.sendall(http_answer(b'{"result": [[], []]}'))),
    ("entries not a list", lambda c: c.sendall(http_answer(b'{"result": [{"a": 1}]}'))),
    ("document not an object", lambda c: c.sendall(http_answer(b'{"result": [[3]]}'))),
    ("no contents", lambda c: c.sendall(http_answer(b'{"result": [[{"document": {"id": "1"}}]]}'))),
    ("contents not a string", lambda c: c.sendall(http_answer(b'{"result": [[{"contents": 5}]]}'))),
    (
        "score a string",
        lambda c: c.sendall(http_answer(b'{"result": [[{"document": {"contents": "x"}, "score": "1"}]]}')),
    ),
    ("id an object", lambda c: c.sendall(http_answer(b'{"result": [[{"id": {}, "contents": "x"}]]}'))),
    (
        "too many documents",
        lambda c: c.sendall(http_answer(json.dumps({"result": [[{"contents": "x"}] * 9]}).encode())),
    ),
    ("status 404", lambda c: c.sendall(http_answer(b'{"detail": "Not Found"}', "404 Not Found"))),
    ("status 500", lambda c: c.sendall(http_answer(b"Internal Server Error", "500 Internal Server Error"))),
    ("redirect", lambda c: c.sendall(http_answer(b"", "307 Temporary Redirect"))),
    ("garbage status line", lambda c: c.sendall(b"NOT HTTP AT ALL\r\n\r\n")),
    ("closed without answer", lambda c: None),
    ("truncated body", lambda c: c.sendall(http_answer(b'{"result": [[]]}')[:-5])),
]


@pytest.mark.parametrize("respond", [b[1] for b in BAD_ANSWERS], ids=[b[0] for b in BAD_ANSWERS])
def test_every_bad_answer_follows_on_retrieval_error(
    respond: Callable[[socket.socket], None], world: Any
) -> None:
    stub = StubServer(respond)
    client = HttpRetriever(stub.url, timeout=2.0, retries=0)
    try:
        with pytest.raises(RetrieverError):
            client.search(["q"], 3)
        for mode in ("raise", "observe"):
            env = gym.make(
                "SearchQA-v0", dataset=world, split="test", retriever=client, on_retrieval_error=mode
            )
            base: Any = env.unwrapped
            env.reset(options={"question_index": 0})
            tokens = base.tokenizer.encode("<search> q </search>")
            for t in tokens[:-1]:
                env.step(t)
            if mode == "raise":
                with pytest.raises(RetrieverError):
                    env.step(tokens[-1])
            else:
                _, _, terminated, truncated, info = env.step(tokens[-1])
                text = base.tokenizer.decode(base.episode.tokens[: base.episode.length])
                assert "<information>Search failed: " in text and not (terminated or truncated)
                assert info["retrieved_ids"] == [[]]
            env.close()
    finally:
        client.close()
        stub.close()


def test_vector_env_observes_bad_answers_too(world: Any) -> None:
    stub = json_server({"result": "broken"})
    client = HttpRetriever(stub.url, timeout=2.0, retries=0)
    try:
        envs = gym.make_vec(
            "SearchQA-v0",
            num_envs=2,
            dataset=world,
            split="test",
            retriever=client,
            on_retrieval_error="observe",
        )
        base: Any = envs.unwrapped
        envs.reset(seed=0)
        result = base.step_segments([base.tokenizer.encode("<search> q </search>")] * 2)
        assert all("Search failed" in base.tokenizer.decode(ep.tokens[: ep.length]) for ep in base.episodes)
        assert not result.terminated.any()
        envs.close()
    finally:
        client.close()
        stub.close()


def test_env_over_a_search_r1_server_without_ids_runs(world: Any) -> None:
    hits = [{"document": {"contents": '"Distul"\nDistul is a city.'}, "score": 3.0}]
    stub = json_server({"result": [hits]})
    try:
        env = gym.make("SearchQA-v0", dataset=world, split="test", retriever=stub.url)
        base: Any = env.unwrapped
        env.reset(options={"question_index": 0})
        for t in base.tokenizer.encode("<search> Distul </search>"):
            _, _, _, _, info = env.step(t)
        assert info["retrieved_ids"] == [[derived_id('"Distul"\nDistul is a city.')]]
        assert base.tokenizer.decode(base.episode.tokens[: base.episode.length]).endswith(
            '<information>Doc 1(Title: "Distul") Distul is a city.</information>\n\n'
        )
        env.close()
    finally:
        stub.close()
