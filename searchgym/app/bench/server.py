"""The retrieval server under load: a full Search-R1 step in one request, /health latency and memory.

Run it with ``python -m searchgym.app.bench.server [--corpus FOLDER] [--json]``. It starts the server in this
process (:class:`~searchgym.server.ServerThread`) and measures:

* the wall time of one request of 2,560 queries (512 prompts x 5 responses, Search-R1's default step);
* ``/health`` latency while clients keep large-answer requests in flight (median and maximum);
* the process's resident memory before and at its peak during that load.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["run_server_benchmark"]


def _rss_mb() -> float:
    """Resident memory of this process in MiB (Linux ``/proc``; 0 elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    import os

    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_server_benchmark(
    corpus: str | Path | None = None, load_clients: int = 4, load_seconds: float = 10.0, topk: int = 100
) -> dict[str, Any]:
    """Measures the server; returns the figures as a dict.

    Args:
        corpus: A FlashRAG folder; ``None`` uses the generated world.
        load_clients: Clients sending large-answer requests during the /health measurement.
        load_seconds: How long the load lasts.
        topk: ``topk`` of the load requests (large answers: queries x topk documents).
    """
    import httpx

    from searchgym.data import load_dataset
    from searchgym.retrieval import BM25Retriever
    from searchgym.server import ServerLimits, ServerThread, create_app

    dataset = load_dataset(corpus)
    questions = [q.question for split in sorted(dataset.splits) for q in dataset.questions(split)]
    retriever = BM25Retriever(dataset.passages)
    limits = ServerLimits()
    result: dict[str, Any] = {"corpus": dataset.name, "passages": len(dataset.passages)}
    rss_start = _rss_mb()
    app = create_app(retriever, dataset.passages, limits)
    with ServerThread(app) as server, httpx.Client(timeout=600) as c:
        url = server.url
        step = [questions[i % len(questions)] for i in range(2560)]
        start = time.perf_counter()
        r = c.post(url + "/retrieve", json={"queries": step, "topk": 3, "return_scores": True})
        result["step_2560_queries_s"] = round(time.perf_counter() - start, 3)
        result["step_2560_status"] = r.status_code
        result["step_2560_lists"] = len(r.json()["result"])
        result["step_2560_response_mb"] = round(len(r.content) / 2**20, 2)

        idle = []
        for _ in range(20):
            t_idle = time.perf_counter()
            c.get(url + "/health")
            idle.append(time.perf_counter() - t_idle)

        # The largest request the limits accept: as many queries at this topk as the server's bound on the
        # answer (each query's topk largest passages) admits.
        per_query = app.state.answer_bound(1, topk, False) - app.state.answer_bound(0, topk, False)
        n_load = max(1, min(limits.max_queries, int(limits.max_response_bytes * 0.99 / per_query)))
        body = {"queries": [questions[i % len(questions)] for i in range(n_load)], "topk": topk}
        stop = threading.Event()
        statuses: list[int] = []
        sizes: list[int] = []
        peak = [_rss_mb()]

        def load() -> None:
            with httpx.Client(timeout=600) as lc:
                while not stop.is_set():
                    resp = lc.post(url + "/retrieve", json=body)
                    statuses.append(resp.status_code)
                    sizes.append(len(resp.content))

        def watch() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], _rss_mb())
                time.sleep(0.05)

        threads = [threading.Thread(target=load) for _ in range(load_clients)] + [
            threading.Thread(target=watch)
        ]
        for t in threads:
            t.start()
        busy = []
        end = time.monotonic() + load_seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            c.get(url + "/health")
            busy.append(time.perf_counter() - t0)
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join()
    busy.sort()
    idle.sort()
    result.update(
        {
            "health_idle_median_ms": round(idle[len(idle) // 2] * 1000, 1),
            "health_load_median_ms": round(busy[len(busy) // 2] * 1000, 1),
            "health_load_max_ms": round(busy[-1] * 1000, 1),
            "load_queries_per_request": n_load,
            "load_topk": topk,
            "load_requests": len(statuses),
            "load_statuses": sorted(set(statuses)),
            "load_response_mb": round(max(sizes, default=0) / 2**20, 1),
            "rss_start_mb": round(rss_start, 1),
            "rss_peak_mb": round(peak[0], 1),
        }
    )
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m searchgym.app.bench.server``: the same as ``searchgym bench server``."""
    from searchgym.app.cli import main as cli_main

    return cli_main(["bench", "server", *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    raise SystemExit(main())
