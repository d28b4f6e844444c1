"""Search-R1 protocol both ways.

A Search-R1-style client (written from the wire format: one POST of every active query, ``result`` read as
lists of ``{"document": {"id", "contents"}, "score"}``) against ``searchgym serve``'s app, and Search-R1-shaped
stub servers (raw sockets, so every byte is under the test's control) against :class:`HttpRetriever` and
the environment.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import httpx
import pytest

from searchgym import server as server_module
from searchgym.cli import main
from searchgym.errors import RetrieverError
from searchgym.retrieval import BM25Retriever, Hit
from searchgym.retrieval.http import HttpRetriever, derived_id
from searchgym.server import ServerLimits, ServerThread, create_app


def searchr1_client(url: str, queries: list[str], topk: int = 3) -> list[list[dict[str, Any]]]:
    """What Search-R1's generation loop does: POST all queries, read ``result`` (no error handling)."""
    payload = {"queries": queries, "topk": topk, "return_scores": True}
    response = httpx.post(url + "/retrieve", json=payload, timeout=120)
    return response.json()["result"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def served(world: Any, retriever: BM25Retriever) -> Iterator[ServerThread]:
    with ServerThread(create_app(retriever, world.passages)) as running:  # the default limits
        yield running


# -- server (items 1-5) ----------------------------------------------------------------------------------


def test_empty_query_list_gets_an_empty_result(served: ServerThread) -> None:
    r = httpx.post(served.url + "/retrieve", json={"queries": [], "topk": 3, "return_scores": True})
    assert r.status_code == 200 and r.json() == {"result": []}
    assert searchr1_client(served.url, []) == []


def test_a_full_default_search_r1_step_in_one_request(
    served: ServerThread, retriever: BM25Retriever, world: Any
) -> None:
    questions = [q.question for q in world.splits["test"]]
    queries = [questions[i % len(questions)] for i in range(512 * 5)]  # 512 prompts x 5 responses
    start = time.perf_counter()
    result = searchr1_client(served.url, queries)
    elapsed = time.perf_counter() - start
    print(f"2,560 queries in one request: {elapsed:.2f} s")
    assert len(result) == 2560 and all(len(hits) == 3 for hits in result)
    expected = retriever.search(queries[:50], 3)
    got = [[(e["document"]["id"], e["score"]) for e in hits] for hits in result[:50]]
    assert got == [[(h.passage_id, h.score) for h in hits] for hits in expected]


def test_a_long_query_is_cut_and_answered(served: ServerThread, retriever: BM25Retriever) -> None:
    words = ("city founded river guild " * 2000).split()  # 8,000 words, ~40,000 characters
    long_query = " ".join(words)
    r = httpx.post(served.url + "/retrieve", json={"queries": ["a city", long_query], "topk": 3}, timeout=60)
    assert r.status_code == 200
    assert r.headers["x-searchgym-truncated-queries"] == "1"
    ids = [d["id"] for d in r.json()["result"][1]]
    limits = ServerLimits()
    assert ids == [h.passage_id for h in retriever.search([" ".join(words[: limits.max_query_tokens])], 3)[0]]
    # Only a malformed request is refused.
    assert httpx.post(served.url + "/retrieve", json={"queries": [3]}).status_code == 422


def test_answer_size_is_bounded_and_health_stays_responsive(world: Any, retriever: BM25Retriever) -> None:
    limits = ServerLimits(max_response_bytes=2 * 2**20)
    with ServerThread(create_app(retriever, world.passages, limits)) as srv:
        # 1,024 queries x top 100 of ~150-byte documents is ~15 MiB: refused before any scoring.
        big = {"queries": ["a city"] * 1024, "topk": 100}
        r = httpx.post(srv.url + "/retrieve", json=big, timeout=60)
        assert r.status_code == 413 and "MiB" in r.json()["detail"]
        # Heavy but allowed requests in flight: /health still answers quickly.
        heavy = {"queries": [q.question for q in world.splits["test"][:400]] * 5, "topk": 1}
        stop = threading.Event()
        statuses: list[int] = []

        def load() -> None:
            with httpx.Client(timeout=120) as c:
                while not stop.is_set():
                    statuses.append(c.post(srv.url + "/retrieve", json=heavy).status_code)

        workers = [threading.Thread(target=load) for _ in range(3)]
        for w in workers:
            w.start()
        time.sleep(0.3)
        latencies = []
        with httpx.Client(timeout=30) as c:
            for _ in range(10):
                start = time.perf_counter()
                assert c.get(srv.url + "/health").status_code == 200
                latencies.append(time.perf_counter() - start)
                time.sleep(0.05)
        stop.set()
        for w in workers:
            w.join()
    print(f"/health under load: max {max(latencies) * 1000:.0f} ms, {len(statuses)} heavy requests")
    assert statuses and set(statuses) == {200}
    assert sorted(latencies)[len(latencies) // 2] < 0.5  # median; CPU-starved CI machines are slow


def write_corpus(folder: Path, contents: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": str(i), "contents": c}) for i, c in enumerate(contents)]
    (folder / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def test_contents_come_back_byte_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    contents = [
        "Bare Title\nunquoted title lines, as 121 of FlashRAG's quick-start records",
        '"Quoted"\nends in white space  ',
        '  "Padded" \nthe title line has spaces',
        'DPR ""doubled"" quotes\nand a second\nline',
        "no newline at all",
    ]
    folder = write_corpus(tmp_path / "c", contents)
    apps: list[Any] = []
    monkeypatch.setattr(server_module, "run_server", lambda app, **kwargs: apps.append(app))
    assert main(["serve", "--corpus", str(folder)]) == 0
    with ServerThread(apps[0]) as srv:
        result = searchr1_client(srv.url, ["unquoted", "white space", "padded", "doubled", "newline"], topk=5)
    served_contents = {e["document"]["id"]: e["document"]["contents"] for hits in result for e in hits}
    assert served_contents == {str(i): c for i, c in enumerate(contents)}


def test_serve_prints_serving_only_after_the_bind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_corpus(tmp_path / "c", ['"T"\nsome text'])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert main(["serve", "--corpus", str(folder), "--port", str(port)]) == 2
    captured = capsys.readouterr()
    assert "serving" not in captured.out
    assert f"cannot listen on 127.0.0.1:{port}" in captured.err


# -- client and environment (items 6-7) --------------------------------------------------------------------


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


def test_hit_contents_default_to_the_flashrag_form() -> None:
    assert Hit("1", "T", "x", 0.0).contents == '"T"\nx'
    assert Hit("1", "T", "x", 0.0, "T\nx").contents == "T\nx"
