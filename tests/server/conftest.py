"""What the server's tests share: a retriever that answers the largest passages and counts its calls, and
raw-socket clients."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence

import httpx

from searchgym.data import Passage
from searchgym.retrieval import Hit, Retriever
from searchgym.server import ServerThread


class Counting(Retriever):
    """Returns the ``k`` largest passages for every query (the worst case for the answer's size); counts calls.

    ``gate``, when given, is waited on inside :meth:`search` (a request held in progress).
    """

    name = "counting"

    def __init__(self, passages: Sequence[Passage], gate: threading.Event | None = None) -> None:
        self.ranked = sorted(passages, key=lambda p: -len(p.text))
        self.calls = 0
        self.gate = gate

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        self.calls += 1
        if self.gate is not None:
            self.gate.wait(30)
        return [[Hit.of(p, 1.0) for p in self.ranked[:k]] for _ in queries]


def sized_passages(sizes: list[int]) -> list[Passage]:
    return [Passage(str(i), f"T{i}", "x" * n) for i, n in enumerate(sizes)]


def slow_socket(srv: ServerThread, head: bytes = b"POST /retrieve HTTP/1.1\r\nHost: x\r\n") -> socket.socket:
    """A connection that has sent part of a request head (and waits to send more)."""
    s = socket.create_connection((srv.host, srv.port), timeout=10)
    s.sendall(head)
    return s


def health_ms(srv: ServerThread, timeout: float = 10) -> float:
    start = time.perf_counter()
    assert httpx.get(srv.url + "/health", timeout=timeout).status_code == 200
    return (time.perf_counter() - start) * 1000
