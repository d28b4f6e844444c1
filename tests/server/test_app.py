"""``searchgym/server/app.py``: Search-R1's wire format (also as Search-R1's generation loop posts it), request
validation, failures, answers bounded in size and in flight, bodies parsed off the event loop, load on loopback."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest

from searchgym.data import Passage
from searchgym.errors import MissingDependencyError, RetrieverError, install_command
from searchgym.retrieval import BM25Retriever, Hit, Retriever
from searchgym.retrieval.http import HttpRetriever
from searchgym.server import RequestError, ServerLimits, ServerThread, create_app, parse_request

from ..conftest import searchr1_client, server_client
from .conftest import Counting, health_ms, sized_passages, slow_socket

LIMITS = ServerLimits(default_topk=3, topk_max=10, max_queries=16, max_query_chars=200, max_body_bytes=8000)


@pytest.fixture(scope="module")
def server(world: Any, retriever: BM25Retriever) -> Iterator[ServerThread]:
    with ServerThread(create_app(retriever, world.passages, LIMITS)) as running:
        yield running


@pytest.fixture
def client(server: ServerThread) -> Iterator[httpx.Client]:
    with server_client(server.url) as c:
        yield c


@pytest.fixture(scope="module")
def default_server(world: Any, retriever: BM25Retriever) -> Iterator[ServerThread]:
    with ServerThread(create_app(retriever, world.passages)) as running:  # the default limits
        yield running


# -- the wire format -------------------------------------------------------------------------------------------


def test_health(client: httpx.Client, world: Any) -> None:
    r = client.get("/health")
    assert r.status_code == 200
    assert r.json() == {
        "status": "ok",
        "retriever": "bm25",
        "passages": len(world.passages),
        "default_topk": 3,
        "topk_max": 10,
        "max_queries": 16,
    }


def test_wire_format_matches_search_r1(client: httpx.Client, retriever: BM25Retriever, world: Any) -> None:
    queries = [q.question for q in world.splits["test"][:3]]
    expected = retriever.search(queries, 4)
    by_id = world.passage_index
    r = client.post("/retrieve", json={"queries": queries, "topk": 4, "return_scores": True})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    result = r.json()["result"]
    assert [[(e["document"]["id"], e["score"]) for e in hits] for hits in result] == [
        [(h.passage_id, h.score) for h in hits] for hits in expected
    ]
    first = result[0][0]["document"]
    assert set(first) == {"id", "contents"}
    assert first["contents"] == f'"{by_id[first["id"]].title}"\n{by_id[first["id"]].text}'
    # Without scores (Search-R1's default): the bare documents.
    r = client.post("/retrieve", json={"queries": queries, "topk": 4})
    assert r.json()["result"] == [[e["document"] for e in hits] for hits in result]


def test_topk_defaults_when_missing_or_null(client: httpx.Client) -> None:
    for body in ({"queries": ["a city"]}, {"queries": ["a city"], "topk": None}):
        assert len(client.post("/retrieve", json=body).json()["result"][0]) == LIMITS.default_topk


def test_a_single_query_is_answered_as_a_one_query_batch(client: httpx.Client) -> None:
    """SkyRL-Gym's and verl's search tools post ``{"query": "<one string>", ...}``."""
    for extra in ({}, {"topk": 2, "return_scores": True}):
        single = client.post("/retrieve", json={"query": "a city", **extra})
        batched = client.post("/retrieve", json={"queries": ["a city"], **extra})
        assert single.status_code == 200 and single.json() == batched.json()
        assert len(single.json()["result"]) == 1
    for body, field in (({"topk": 3}, "'query' (one string)"), ({"query": "q", "queries": []}, "not both")):
        r = client.post("/retrieve", json=body)
        assert r.status_code == 422 and field in r.json()["detail"]


def test_empty_query_list_gets_an_empty_result(default_server: ServerThread) -> None:
    with server_client(default_server.url) as http:
        r = http.post("/retrieve", json={"queries": [], "topk": 3, "return_scores": True})
    assert r.status_code == 200 and r.json() == {"result": []}
    assert searchr1_client(default_server.url, []) == []


def test_a_full_default_search_r1_step_in_one_request(
    default_server: ServerThread, retriever: BM25Retriever, world: Any
) -> None:
    questions = [q.question for q in world.splits["test"]]
    queries = [questions[i % len(questions)] for i in range(512 * 5)]  # 512 prompts x 5 responses
    start = time.perf_counter()
    result = searchr1_client(default_server.url, queries)
    elapsed = time.perf_counter() - start
    print(f"2,560 queries in one request: {elapsed:.2f} s")
    assert len(result) == 2560 and all(len(hits) == 3 for hits in result)
    expected = retriever.search(queries[:50], 3)
    got = [[(e["document"]["id"], e["score"]) for e in hits] for hits in result[:50]]
    assert got == [[(h.passage_id, h.score) for h in hits] for hits in expected]


def test_a_long_query_is_cut_and_answered(default_server: ServerThread, retriever: BM25Retriever) -> None:
    words = ("city founded river guild " * 2000).split()  # 8,000 words, ~40,000 characters
    long_query = " ".join(words)
    r = httpx.post(
        default_server.url + "/retrieve", json={"queries": ["a city", long_query], "topk": 3}, timeout=60
    )
    assert r.status_code == 200
    assert r.headers["x-searchgym-truncated-queries"] == "1"
    ids = [d["id"] for d in r.json()["result"][1]]
    limits = ServerLimits()
    assert ids == [h.passage_id for h in retriever.search([" ".join(words[: limits.max_query_tokens])], 3)[0]]
    # Only a malformed request is refused.
    with server_client(default_server.url) as http:
        assert http.post("/retrieve", json={"queries": [3]}).status_code == 422


# -- bad requests and failures ---------------------------------------------------------------------------------

MALFORMED: list[tuple[str, Any, int]] = [
    ("queries missing", {"topk": 3}, 422),
    ("both query and queries", {"queries": ["q"], "query": "q"}, 422),
    ("query not a string", {"query": ["q"]}, 422),
    ("queries not a list", {"queries": "who?"}, 422),
    ("a query in queries not a string", {"queries": ["ok", 3]}, 422),
    ("too many queries", {"queries": ["q"] * 17}, 413),
    ("topk zero", {"queries": ["q"], "topk": 0}, 422),
    ("topk over the maximum", {"queries": ["q"], "topk": 11}, 422),
    ("topk negative", {"queries": ["q"], "topk": -2}, 422),
    ("topk a string", {"queries": ["q"], "topk": "3"}, 422),
    ("topk a float", {"queries": ["q"], "topk": 2.5}, 422),
    ("topk a bool", {"queries": ["q"], "topk": True}, 422),
    ("return_scores not a bool", {"queries": ["q"], "return_scores": "yes"}, 422),
    ("body a JSON list", ["q"], 400),
    ("oversized body", {"queries": ["y" * 150] * 60}, 413),
]


@pytest.mark.parametrize(("body", "status"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_requests_get_their_4xx(client: httpx.Client, body: Any, status: int) -> None:
    r = client.post("/retrieve", json=body)
    assert r.status_code == status, r.text
    assert isinstance(r.json()["detail"], str) and r.json()["detail"]
    with pytest.raises(RequestError) as info:  # the same rule, as a pure function
        parse_request(json.dumps(body).encode(), LIMITS)
    assert info.value.status == status


@pytest.mark.parametrize(
    ("content", "status"),
    [(b"{not json", 400), (b"\xff\xfe", 400), (b"", 400), (b"[" * 100_000, 413), (b"[" * 5000, 400)],
    ids=["bad json", "bad utf-8", "empty body", "huge nesting over size", "deep nesting"],
)
def test_unparseable_bodies(client: httpx.Client, content: bytes, status: int) -> None:
    r = client.post("/retrieve", content=content, headers={"content-type": "application/json"})
    assert r.status_code == status
    assert r.json()["detail"]


def test_chunked_oversized_body_is_refused(client: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:  # a generator body is sent chunked, with no Content-Length
        yield b'{"queries": ["'
        for _ in range(100):
            yield b"z" * 1000
        yield b'"]}'

    r = client.post("/retrieve", content=chunks())
    assert r.status_code == 413


def test_wrong_method_and_path(client: httpx.Client) -> None:
    assert client.get("/retrieve").status_code == 405
    assert client.post("/search", json={"queries": ["q"]}).status_code == 404


def test_a_stalled_body_gets_408(retriever: BM25Retriever, world: Any) -> None:
    limits = ServerLimits(read_timeout=1.0)
    with ServerThread(create_app(retriever, world.passages, limits)) as srv:
        s = slow_socket(srv, b'POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"queries')
        start = time.monotonic()
        s.settimeout(10)
        answer = b""
        while chunk := s.recv(65536):  # the server answers, then closes
            answer += chunk
        assert 0.9 <= time.monotonic() - start < 8
        head, _, detail = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head.lower()
        assert "did not arrive within 1 s" in json.loads(detail)["detail"]
        s.close()


def test_retriever_failure_is_a_502(world: Any) -> None:
    class Failing(Retriever):
        def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
            raise RetrieverError("upstream down")

    with ServerThread(create_app(Failing(), world.passages)) as srv, server_client(srv.url) as c:
        r = c.post("/retrieve", json={"queries": ["q"]})
    assert r.status_code == 502 and "upstream down" in r.json()["detail"]


def test_missing_fastapi_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fastapi", None)  # makes `import fastapi` raise ImportError
    with pytest.raises(MissingDependencyError, match=re.escape(install_command("server"))):
        create_app(BM25Retriever([Passage("0", "t", "x")]), [])


# -- work bounded: parsing, answers in flight, answer size -----------------------------------------------------


def test_health_answers_while_16_mib_bodies_are_parsed(retriever: BM25Retriever, world: Any) -> None:
    """Two clients send 16 MiB bodies of empty lists; /health stays fast (json.loads would hold the GIL ~5 s per
    body)."""
    body = b'{"queries": [' + b"[]," * (16 * 2**20 // 3 - 10) + b"[]]}"
    assert len(body) <= ServerLimits().max_body_bytes
    stop = threading.Event()
    statuses: list[int] = []
    with ServerThread(create_app(retriever, world.passages)) as srv:

        def send() -> None:
            with httpx.Client(timeout=60) as c:
                while not stop.is_set():
                    statuses.append(c.post(srv.url + "/retrieve", content=body).status_code)

        senders = [threading.Thread(target=send) for _ in range(2)]
        for t in senders:
            t.start()
        latencies = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline or len(statuses) < 4:
            latencies.append(health_ms(srv))
            time.sleep(0.05)
        stop.set()
        for t in senders:
            t.join()
    print(f"/health while parsing: max {max(latencies):.0f} ms over {len(latencies)}, {len(statuses)} bodies")
    assert set(statuses) == {413}
    assert max(latencies) < 1500  # with json.loads: ~5,000 ms per body


def big_answer_server(write_timeout: float) -> tuple[ServerThread, Counting, dict[str, Any]]:
    """One answer slot; each query's answer is 10 passages of 100 kB, so 10 queries make ~10 MB."""
    passages = sized_passages([100_000] * 10)
    stub = Counting(passages)
    limits = ServerLimits(max_concurrent=1, write_timeout=write_timeout, topk_max=10)
    srv = ServerThread(create_app(stub, passages, limits)).start()
    return srv, stub, {"queries": ["q"] * 10, "topk": 10}


def stalled_reader(srv: ServerThread, request: dict[str, Any]) -> socket.socket:
    """Sends ``request`` and reads nothing (a small receive window), so the answer waits at the server."""
    body = json.dumps(request).encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((srv.host, srv.port))
    s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    return s


def read_answer(s: socket.socket) -> tuple[bytes, bytes]:
    """One HTTP answer with a Content-Length: its head and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, start = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    body = bytearray(start)
    while len(body) < length:
        chunk = s.recv(1 << 20)
        assert chunk, "the connection closed mid-answer"
        body += chunk
    return head, bytes(body)


def test_an_answer_holds_its_slot_until_it_is_sent() -> None:
    """The slot is held until the answer is sent, so readers that take nothing cannot pile answers up in memory."""
    srv, stub, request = big_answer_server(write_timeout=30)
    try:
        reader = stalled_reader(srv, request)
        while stub.calls < 1:
            time.sleep(0.01)
        other: list[int] = []
        waiting = threading.Thread(
            target=lambda: other.append(
                httpx.post(srv.url + "/retrieve", json=request, timeout=60).status_code
            )
        )
        waiting.start()
        time.sleep(1.0)
        assert stub.calls == 1 and not other  # the second request waits for the slot, unscored
        assert health_ms(srv) < 5000
        reader.settimeout(30)  # now the reader reads: its whole answer, intact
        head, body = read_answer(reader)
        assert head.startswith(b"HTTP/1.1 200")
        result = json.loads(body)["result"]
        assert len(result) == 10 and all(len(hits) == 10 for hits in result)
        waiting.join(60)
        assert other == [200] and stub.calls == 2
        reader.close()
    finally:
        srv.stop()


def test_a_reader_stalled_past_the_write_timeout_is_dropped() -> None:
    srv, stub, request = big_answer_server(write_timeout=1.5)
    try:
        reader = stalled_reader(srv, request)
        while stub.calls < 1:
            time.sleep(0.01)
        start = time.monotonic()
        r = httpx.post(srv.url + "/retrieve", json=request, timeout=60)  # waits for the slot
        assert r.status_code == 200 and len(r.json()["result"]) == 10
        assert 0.5 < time.monotonic() - start < 20
        # The stalled reader's connection was aborted: what it can still read is cut short.
        reader.settimeout(10)
        received = 0
        with contextlib.suppress(OSError):
            while chunk := reader.recv(1 << 20):
                received += len(chunk)
        assert received < 10 * 10 * 100_000
        reader.close()
    finally:
        srv.stop()


def test_an_answer_that_could_exceed_the_limit_is_refused_before_scoring() -> None:
    """1,000 queries x top 100 is refused (413) before the retriever is called."""
    # 100 passages of ~800 bytes and 900 of ~400: the mean (440) times 100,000 fits 64 MiB, the answer not.
    passages = sized_passages([800] * 100 + [400] * 900)
    stub = Counting(passages)
    with ServerThread(create_app(stub, passages)) as srv:
        request = {"queries": [f"q{i}" for i in range(1000)], "topk": 100, "return_scores": True}
        r = httpx.post(srv.url + "/retrieve", json=request, timeout=60)
        assert r.status_code == 413, r.text
        assert stub.calls == 0  # refused before any scoring
        detail = r.json()["detail"]
        assert "could make an answer of up to" in detail and "--max-response-mb" in detail
        request["queries"] = request["queries"][:300]  # 300 x 100 x ~880 bytes: within the bound
        r = httpx.post(srv.url + "/retrieve", json=request, timeout=60)
        assert r.status_code == 200 and stub.calls == 1
        assert len(r.content) <= srv.app.state.answer_bound(300, 100, True)


@pytest.mark.parametrize("return_scores", [False, True])
def test_the_answer_bound_covers_the_worst_answer(return_scores: bool) -> None:
    passages = sized_passages([5, 900, 30, 7000, 12, 64])
    app = create_app(Counting(passages), passages, ServerLimits(topk_max=10))
    worst = len(
        json.dumps(
            {
                "result": [
                    [
                        {"document": {"id": p.id, "contents": p.contents}, "score": -2.2250738585072014e-308}
                        if return_scores
                        else {"id": p.id, "contents": p.contents}
                        for p in sorted(passages, key=lambda p: -len(p.text))[:k]
                    ]
                    for k in (3, 3, 3)
                ]
            }
        )
    )
    bound = app.state.answer_bound(3, 3, return_scores)
    assert worst <= bound <= worst + 3 * 6  # slack: a separator per hit and 2 bytes per list


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


# -- load ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_load_2000_requests_from_8_clients(
    server: ServerThread, retriever: BM25Retriever, world: Any
) -> None:
    questions = [q.question for q in world.splits["test"][:50]]
    # Expected answers computed in-process; request i asks question i % 50 with topk 1 + i % 5.
    expected = {k: retriever.search(questions, k) for k in range(1, 6)}
    n_requests, n_clients = 2000, 8
    answers: dict[int, list[Hit]] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(offset: int) -> None:
        client = HttpRetriever(server.url + "/retrieve", timeout=30, retries=0)
        try:
            for i in range(offset, n_requests, n_clients):
                hits = client.search([questions[i % 50]], 1 + i % 5)[0]
                with lock:
                    answers[i] = hits
        except BaseException as e:  # surfaced in the main thread below
            errors.append(e)
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(c,)) for c in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:3]
    assert sorted(answers) == list(range(n_requests)), "requests were lost"
    wrong = [i for i, hits in answers.items() if hits != expected[1 + i % 5][i % 50]]
    assert not wrong, f"{len(wrong)} wrong answers, e.g. request {wrong[0]}"
