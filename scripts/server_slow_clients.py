"""The retrieval server under slow clients: four measurements against ``searchgym serve``.

Usage::

    python scripts/server_slow_clients.py --corpus FOLDER [--only NAME ...] [-- SERVE OPTIONS]

Each measurement starts its own ``searchgym serve --corpus FOLDER`` in a child process (extra options after
``--`` go to it) and prints one JSON line:

* ``slowloris``: the server limited to 256 file descriptors (``RLIMIT_NOFILE``); 300 connections each send
  a partial request and one more header line every 2 s; ``/health`` is asked once a second meanwhile.
  Reports the health answers and when the server closed the slow connections.
* ``bodies``: ``/health`` latency (every 20 ms) while 2 clients keep sending 16 MiB bodies (``--shape``:
  ``strings``, a list of one-letter strings; ``lists``, a list of empty lists).
* ``readers``: the server's resident memory while 16 clients ask 280 queries x top 100 (a ~20 MiB answer
  each) and read nothing.
* ``oversized``: the time to the 413 of 1,000 queries x top 100 (an answer over the 64 MiB default).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


@contextmanager
def serve(corpus: str, extra: list[str], nofile: int | None = None) -> Iterator[tuple[str, int]]:
    """Runs ``searchgym serve`` in a child process; yields its base URL and process id."""

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    with tempfile.TemporaryFile("w+") as out:
        cmd = [sys.executable, "-m", "searchgym.app.cli", "serve", "--corpus", corpus, "--port", "0"]
        proc = subprocess.Popen(
            [*cmd, "--log-level", "error", *extra], stdout=out, stderr=subprocess.STDOUT, preexec_fn=limit
        )
        try:
            deadline = time.monotonic() + 120
            while True:
                out.seek(0)
                text = out.read()
                if " on http://" in text:
                    url = text.split(" on ", 1)[1].split("/retrieve", 1)[0]
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the server did not start:\n{text}")
                time.sleep(0.1)
            yield url, proc.pid
        finally:
            proc.terminate()
            proc.wait(30)


def health(url: str, timeout: float) -> float | None:
    """Seconds ``GET /health`` took, or None when it failed or timed out."""
    parts = urlsplit(url)
    start = time.perf_counter()
    try:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
        conn.request("GET", "/health")
        ok = conn.getresponse().status == 200
        conn.close()
    except OSError:
        return None
    return time.perf_counter() - start if ok else None


def post(url: str, body: bytes, timeout: float = 600) -> tuple[int, bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    conn.request("POST", "/retrieve", body=body, headers={"content-type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data


def rss_mb(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def questions(corpus: str, n: int) -> list[str]:
    folder = Path(corpus)
    found: list[str] = []
    for split in sorted(folder.glob("*.jsonl")):
        if split.name != "corpus.jsonl":
            found += [json.loads(line)["question"] for line in split.read_text().splitlines() if line]
    return [found[i % len(found)] for i in range(n)]


def slowloris(url: str, n: int = 300, seconds: float = 40.0) -> dict[str, Any]:
    parts = urlsplit(url)
    socks: dict[socket.socket, float] = {}
    start = time.monotonic()
    for _ in range(n):
        s = socket.create_connection((parts.hostname, parts.port), timeout=5)
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\n")
        s.setblocking(False)
        socks[s] = start
    closed: list[float] = []
    probes: list[float | None] = []

    def probe() -> None:
        while time.monotonic() - start < seconds:
            probes.append(health(url, timeout=5))
            time.sleep(1)

    prober = threading.Thread(target=probe)
    prober.start()
    next_line = start + 2
    while time.monotonic() - start < seconds and socks:
        readable, _, _ = select.select(list(socks), [], [], 0.2)
        for s in readable:
            try:
                gone = s.recv(65536) == b""
            except OSError:
                gone = True
            if gone:
                closed.append(time.monotonic() - start)
                del socks[s]
                s.close()
        if time.monotonic() >= next_line:
            next_line += 2
            for s in list(socks):
                try:
                    s.send(b"X-Slow: 1\r\n")
                except OSError:
                    closed.append(time.monotonic() - start)
                    del socks[s]
                    s.close()
    prober.join()
    for s in socks:
        s.close()
    answered = [p for p in probes if p is not None]
    return {
        "slow_connections": n,
        "observed_s": seconds,
        "closed_by_server": len(closed),
        "closed_first_s": round(min(closed), 1) if closed else None,
        "closed_last_s": round(max(closed), 1) if closed else None,
        "still_open": len(socks),
        "health_answered": f"{len(answered)}/{len(probes)}",
        "health_max_ms": round(max(answered) * 1000) if answered else None,
    }


def bodies(url: str, shape: str, seconds: float = 10.0) -> dict[str, Any]:
    unit = {"strings": b'"q",', "lists": b"[],"}[shape]
    size = 16 * 2**20 - 1024
    body = b'{"queries": [' + unit * ((size - 20) // len(unit)) + b'"q"]}'
    stop = threading.Event()
    statuses: list[int] = []

    def send() -> None:
        while not stop.is_set():
            statuses.append(post(url, body)[0])

    senders = [threading.Thread(target=send) for _ in range(2)]
    for t in senders:
        t.start()
    latencies: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        latency = health(url, timeout=30)
        latencies.append(latency if latency is not None else 30.0)
        time.sleep(0.02)
    stop.set()
    for t in senders:
        t.join()
    latencies.sort()
    return {
        "shape": shape,
        "body_mib": round(len(body) / 2**20, 2),
        "bodies_sent": len(statuses),
        "statuses": sorted(set(statuses)),
        "health_probes": len(latencies),
        "health_p50_ms": round(statistics.median(latencies) * 1000, 1),
        "health_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 1),
        "health_max_ms": round(latencies[-1] * 1000, 1),
    }


def readers(url: str, pid: int, corpus: str, n: int = 16, seconds: float = 20.0) -> dict[str, Any]:
    parts = urlsplit(url)
    body = json.dumps({"queries": questions(corpus, 280), "topk": 100, "return_scores": True}).encode()
    status, answer = post(url, body)  # one full answer first: its size, and the server warmed up
    rss_before = rss_mb(pid)
    request = (
        f"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    slow = []
    for _ in range(n):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # reads nothing; a small window
        s.connect((parts.hostname, parts.port))
        s.sendall(request)
        slow.append(s)
    peak = rss_before
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        peak = max(peak, rss_mb(pid))
        time.sleep(0.1)
    for s in slow:
        s.close()
    return {
        "slow_readers": n,
        "answer_status": status,
        "answer_mib": round(len(answer) / 2**20, 1),
        "observed_s": seconds,
        "rss_before_mb": round(rss_before),
        "rss_peak_mb": round(peak),
    }


def oversized(url: str, corpus: str) -> dict[str, Any]:
    body = json.dumps({"queries": questions(corpus, 1000), "topk": 100, "return_scores": True}).encode()
    start = time.perf_counter()
    status, answer = post(url, body)
    return {
        "queries": 1000,
        "topk": 100,
        "status": status,
        "seconds": round(time.perf_counter() - start, 3),
        "detail": json.loads(answer).get("detail"),
    }


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    split = args_list.index("--") if "--" in args_list else len(args_list)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", required=True, help="FlashRAG folder (corpus.jsonl and a split)")
    parser.add_argument("--only", nargs="*", default=["slowloris", "bodies", "readers", "oversized"])
    parser.add_argument("--shape", nargs="*", default=["strings", "lists"], help="bodies' shapes")
    parser.add_argument("--seconds", type=float, default=40.0, help="how long slowloris is observed")
    args = parser.parse_args(args_list[:split])
    extra = args_list[split + 1 :]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this side holds 300 sockets
    for name in args.only:
        if name == "slowloris":
            with serve(args.corpus, extra, nofile=256) as (url, _):
                print(json.dumps({"slowloris": slowloris(url, seconds=args.seconds)}), flush=True)
        elif name == "bodies":
            for shape in args.shape:
                with serve(args.corpus, extra) as (url, _):
                    print(json.dumps({"bodies": bodies(url, shape)}), flush=True)
        elif name == "readers":
            with serve(args.corpus, extra) as (url, pid):
                print(json.dumps({"readers": readers(url, pid, args.corpus)}), flush=True)
        elif name == "oversized":
            with serve(args.corpus, extra) as (url, _):
                print(json.dumps({"oversized": oversized(url, args.corpus)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
