"""The guards both servers share (``searchgym/server/guards.py``): repeated log lines are rate-limited."""

from __future__ import annotations

import logging

import pytest

from searchgym.server.guards import RepeatFilter


def test_a_repeated_log_line_is_let_through_once_per_window_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """300 slow connections at ``ulimit -n 256`` once grew a server's log by 248 MB in 45 s of one message."""
    import searchgym.server.guards as guards

    now = [1000.0]
    monkeypatch.setattr(guards.time, "monotonic", lambda: now[0])
    logger = logging.getLogger("searchgym-test-flood")
    logger.propagate = False
    kept: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(record.getMessage())

    logger.addHandler(Keep())
    logger.addFilter(RepeatFilter(window=10.0))
    for fd in range(5000):  # asyncio's accept error: the first line repeats, the socket's details differ
        logger.error("socket.accept() out of system resource\nsocket: <socket fd=%d>", fd)
    logger.error("another failure")
    assert len(kept) == 2 and kept[0].startswith("socket.accept() out of system resource")
    now[0] += 11
    logger.error("socket.accept() out of system resource\nsocket: <socket fd=%d>", 7)
    assert len(kept) == 3 and "4999 more like this in the last 10 s were not logged" in kept[2]
