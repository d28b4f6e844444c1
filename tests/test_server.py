"""The Search-R1-compatible server: wire format, request validation, load on loopback."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest

from searchgym.data import Passage
from searchgym.errors import ConfigError, MissingDependencyError, RetrieverError
from searchgym.retrieval import BM25Retriever, Hit, Retriever
from searchgym.retrieval.http import HttpRetriever
from searchgym.server import RequestError, ServerLimits, ServerThread, create_app, parse_request

LIMITS = ServerLimits(default_topk=3, topk_max=10, max_queries=16, max_query_chars=200, max_body_bytes=8000)


@pytest.fixture(scope="module")
def server(world: Any, retriever: BM25Retriever) -> Iterator[ServerThread]:
    with ServerThread(create_app(retriever, world.passages, LIMITS)) as running:
        yield running


@pytest.fixture
def client(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


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


MALFORMED: list[tuple[str, Any, int]] = [
    ("queries missing", {"topk": 3}, 422),
    ("queries not a list", {"queries": "who?"}, 422),
    ("query not a string", {"queries": ["ok", 3]}, 422),
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


def test_retriever_failure_is_a_502(world: Any) -> None:
    class Failing(Retriever):
        def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
            raise RetrieverError("upstream down")

    with ServerThread(create_app(Failing(), world.passages)) as srv, httpx.Client(base_url=srv.url) as c:
        r = c.post("/retrieve", json={"queries": ["q"]})
    assert r.status_code == 502 and "upstream down" in r.json()["detail"]


def test_limits_are_validated() -> None:
    with pytest.raises(ConfigError):
        ServerLimits(topk_max=0)
    with pytest.raises(ConfigError):
        ServerLimits(default_topk=5, topk_max=4)


def test_missing_fastapi_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fastapi", None)  # makes `import fastapi` raise ImportError
    with pytest.raises(MissingDependencyError, match=r"searchgym\[server\]"):
        create_app(BM25Retriever([Passage("0", "t", "x")]), [])


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
