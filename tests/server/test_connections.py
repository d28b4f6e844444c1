"""``searchgym/server/connections.py``: slow and hostile clients — a deadline for request heads, a connection
cap below the descriptor limit that closes the connection waiting longest, 503 only when every connection is
busy."""

from __future__ import annotations

import select
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import pytest

from searchgym.retrieval import BM25Retriever
from searchgym.server import ServerLimits, ServerThread, create_app

from ..conftest import SERVER_WAIT
from .conftest import Counting, health_ms, sized_passages, slow_socket


def closed_by_server(s: socket.socket, timeout: float) -> bool:
    """True when the server closes ``s`` (FIN or reset) within ``timeout`` seconds; reads what it sends."""
    s.settimeout(timeout)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:  # reset: the server aborted the connection
        return True
    return True


def test_slow_request_heads_are_cut_at_the_read_timeout(retriever: BM25Retriever, world: Any) -> None:
    """Slowloris: partial heads, one more line every 0.3 s; closed after read_timeout, /health meanwhile."""
    limits = ServerLimits(read_timeout=1.0)
    with ServerThread(create_app(retriever, world.passages, limits)) as srv:
        start = time.monotonic()
        slow = [slow_socket(srv) for _ in range(20)]
        # A kept-alive connection that trickles its second request is cut too.
        kept = socket.create_connection((srv.host, srv.port), timeout=10)
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        kept.sendall(b"GET /health HTTP/1.1\r\n")
        slow.append(kept)
        for _ in range(2):
            time.sleep(0.3)
            for s in slow:
                s.sendall(b"X-Slow: 1\r\n")
        assert health_ms(srv) < 5000
        assert all(closed_by_server(s, timeout=10) for s in slow)
        elapsed = time.monotonic() - start
        assert 0.9 <= elapsed < 8, elapsed
        assert health_ms(srv) < 5000
        for s in slow:
            s.close()


def test_over_max_connections_the_longest_waiting_is_closed(retriever: BM25Retriever, world: Any) -> None:
    limits = ServerLimits(read_timeout=60, max_connections=10)
    with ServerThread(create_app(retriever, world.passages, limits)) as srv:
        slow = []
        for _ in range(30):
            slow.append(slow_socket(srv))
            time.sleep(0.005)  # an order the server sees
        assert health_ms(srv) < 5000  # /health gets in: it closes the connection waiting longest
        assert all(closed_by_server(s, timeout=5) for s in slow[:20])
        assert not select.select(slow[-8:], [], [], 0.3)[0]  # the newest are open (nothing to read)
        for s in slow:
            s.close()


def test_with_every_connection_busy_a_new_one_gets_503() -> None:
    passages = sized_passages([10] * 5)
    gate = threading.Event()
    stub = Counting(passages, gate)
    limits = ServerLimits(max_connections=2, max_concurrent=2)
    with ServerThread(create_app(stub, passages, limits)) as srv:
        busy = [
            threading.Thread(
                target=httpx.post,
                args=(srv.url + "/retrieve",),
                kwargs={"json": {"queries": ["q"]}, "timeout": SERVER_WAIT},
            )
            for _ in range(2)
        ]
        for t in busy:
            t.start()
        while stub.calls < 2:
            time.sleep(0.01)
        s = slow_socket(srv, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(10)
        assert s.recv(65536).startswith(b"HTTP/1.1 503")
        gate.set()
        for t in busy:
            t.join()
        assert health_ms(srv) < 5000
        s.close()


SLOW_SERVERS = {
    "retrieval": (
        "from searchgym.data import Passage\n"
        "from searchgym.retrieval import BM25Retriever\n"
        "from searchgym.server import ServerLimits, create_app, run_server\n"
        "passages = [Passage(str(i), f'T{i}', 'some text') for i in range(3)]\n"
        "app = create_app(BM25Retriever(passages), passages, ServerLimits(read_timeout=60))\n"
        "run_server(app, port=0, log_level='critical', on_ready=lambda url: print(url, flush=True))\n"
    ),
    "openenv": (
        "from searchgym.app.openenv.server import OPENENV_LIMITS, create_searchqa_app, serve\n"
        "from dataclasses import replace\n"
        "app = create_searchqa_app(limits=replace(OPENENV_LIMITS, read_timeout=60))\n"
        "serve(app, port=0, log_level='critical', on_ready=lambda url: print(url, flush=True))\n"
    ),
}
"""Both servers, as ``searchgym serve`` and ``searchgym openenv serve`` run them."""


@pytest.mark.parametrize("kind", sorted(SLOW_SERVERS))
def test_health_answers_under_300_slow_connections_with_256_descriptors(tmp_path: Any, kind: str) -> None:
    """`ulimit -n 256` and 300 slowloris connections: /health answers, and no accept fails for lack of descriptors.

    The read deadline is a minute here: what keeps /health answering is the connection cap (below the
    descriptor limit, closing the connections waiting longest), and the small accept burst, without which
    asyncio runs out of descriptors anyway ("Too many open files") and stops accepting for a second. The
    OpenEnv server is guarded by the same code.
    """
    if kind == "openenv":
        pytest.importorskip("openenv")
    script = tmp_path / "serve.py"
    script.write_text(
        "import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))\n" + SLOW_SERVERS[kind]
    )
    log = tmp_path / "stderr.txt"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=err, text=True)
    slow: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline().strip()
        assert ready, f"the server did not start:\n{log.read_text()}"
        host, port = ready.rsplit("/", 1)[1].rsplit(":", 1)
        for _ in range(300):
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\n")
            slow.append(s)
        for _ in range(3):
            r = httpx.get(f"http://{host}:{port}/health", timeout=SERVER_WAIT)
            assert r.status_code == 200
    finally:
        for s in slow:
            s.close()
        proc.terminate()
        proc.wait(30)
    logged = log.read_text()
    assert "Too many open files" not in logged and len(logged) < 100_000  # no flood of one failure
