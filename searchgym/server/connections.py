"""The retrieval server's connections under slow clients: a read deadline, a connection cap, an abort hook.

uvicorn (0.55, h11) times out idle keep-alive connections but gives a client no deadline for a request's
head: a connection that sends its headers a byte at a time is held, with its file descriptor, for as long
as the client likes, and enough of them exhaust the descriptors so that ``/health`` cannot connect.
:func:`protocol_class` returns uvicorn's h11 protocol with three additions:

* **A read deadline.** A connection with no request in progress (just opened, or its last answer handed
  over) must deliver a complete request head within ``read_timeout`` seconds, however it trickles;
  otherwise it is aborted. (A request's body is timed by the app, which answers 408.)
* **A connection cap.** At most ``max_connections`` connections are open, fewer when the file-descriptor
  limit leaves less room. A connection over the cap closes the one that has waited longest with no request
  in progress; only when every connection has a request in progress is the newcomer refused (503). So idle
  or slow connections cannot lock out ``/health``, whereas uvicorn's ``limit_concurrency`` answers 503 to
  everyone once they fill it.
* **WebSocket sessions leave the count** when a connection upgrades: a session is guarded by the app's idle
  timeout (:class:`~searchgym.server.guards.SessionIdleTimeout`), not by the read deadline.
* **An abort hook** in every request's ``scope["state"]`` (under the key the server passes in,
  :data:`searchgym.server.ABORT_KEY`): the app drops a connection that does not take its answer within the
  write deadline.

Imported only when a server starts (it imports uvicorn and h11).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any, ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["ACCEPT_BURST", "descriptor_budget", "protocol_class", "uvicorn_options"]

logger = logging.getLogger("uvicorn.error")

# Connections asyncio accepts per turn of the event loop (uvicorn's ``backlog``; the kernel's accept queue
# keeps bind_socket's 2,048). Accepted sockets hold descriptors a turn or two before the protocol counts
# them and closes the connections they displace, so the burst must fit in the reserve below; otherwise a
# flood runs the process out of descriptors, and asyncio stops accepting for a second at a time.
ACCEPT_BURST = 16
# Descriptors kept free for what the process opens besides counted connections: files, pipes, accept bursts.
_FD_RESERVE = 64
_REFUSAL = b'{"detail": "the server has too many connections with requests in progress; retry later"}'


def descriptor_budget(reserve: int = _FD_RESERVE) -> int | None:
    """File descriptors this process may still open, less ``reserve``; None when there is no known limit."""
    try:
        import resource
    except ImportError:  # not a Unix
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            used = len(os.listdir(folder))
            break
        except OSError:
            continue
    else:
        used = 64  # a generous guess for a Python process with a server's imports
    return soft - used - reserve


class _Connections:
    """The open connections of one server, and those waiting for a request, oldest first."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open: set[_GuardedH11Protocol] = set()
        self.waiting: dict[_GuardedH11Protocol, None] = {}  # insertion order: the longest waiting first
        self.last_warning = 0.0

    def admit(self, new: _GuardedH11Protocol) -> bool:
        """Counts ``new`` in, closing the longest-waiting connections over the cap; False: refuse ``new``."""
        self.open.add(new)
        while len(self.open) > self.cap:
            victim = next(iter(self.waiting), None)
            if victim is None:
                self.open.discard(new)
                return False
            if time.monotonic() - self.last_warning > 10:
                self.last_warning = time.monotonic()
                logger.warning(
                    "%d connections open (the limit): closing those waiting longest for a request", self.cap
                )
            victim.abort()
        return True


class _GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a read deadline, a connection cap and an abort hook (see the module)."""

    registry: ClassVar[_Connections]
    read_timeout: ClassVar[float]
    abort_key: ClassVar[str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.app_state = {**self.app_state, self.abort_key: self.abort}  # copied into each request's scope
        self._deadline: asyncio.TimerHandle | None = None
        # Counted as soon as asyncio has accepted the socket: connection_made comes a loop turn later.
        self._admitted = self.registry.admit(self)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self._admitted:
            self._await_request()
        else:
            head = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            transport.write(head + b"content-length: %d\r\nconnection: close\r\n\r\n" % len(_REFUSAL))
            transport.write(_REFUSAL)
            transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._deadline is not None and self._busy():
            self._stop_waiting()

    def handle_websocket_upgrade(self, event: Any) -> None:
        # The connection becomes a WebSocket session, served by another protocol object: this one stops
        # timing and counting it (the session's own guard is the app's idle timeout).
        self._forget()
        super().handle_websocket_upgrade(event)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request
        if not self.transport.is_closing() and not self._busy():
            self._await_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()
        super().connection_lost(exc)

    def abort(self) -> None:
        """Drops the connection at once (its descriptor is freed without waiting for unsent data)."""
        self._forget()
        self.transport.abort()

    def _busy(self) -> bool:
        """A request is in progress: its head has arrived and its answer is not complete."""
        return self.cycle is not None and not self.cycle.response_complete

    def _await_request(self) -> None:
        self._stop_waiting()
        self._deadline = self.loop.call_later(self.read_timeout, self._expire)
        self.registry.waiting[self] = None

    def _stop_waiting(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self.registry.waiting.pop(self, None)

    def _expire(self) -> None:
        self._deadline = None
        if not self._busy():
            self.abort()

    def _forget(self) -> None:
        self._stop_waiting()
        self.registry.open.discard(self)


def uvicorn_options(read_timeout: float, max_connections: int, abort_key: str) -> dict[str, Any]:
    """uvicorn ``Config`` options for a guarded server: :func:`protocol_class` and the accept burst.

    Serve on a socket from :func:`searchgym.server.bind_socket`, whose accept queue the small ``backlog``
    does not shrink.
    """
    return {"http": protocol_class(read_timeout, max_connections, abort_key), "backlog": ACCEPT_BURST}


def protocol_class(read_timeout: float, max_connections: int, abort_key: str) -> type[H11Protocol]:
    """uvicorn's ``http`` protocol for one server (its own connection count); see the module docstring.

    The cap is ``max_connections``, or fewer when the file-descriptor limit (``ulimit -n``) leaves less
    room, so that a flood of connections evicts idle ones instead of failing ``accept`` ("Too many open
    files"), which would stop the server from accepting anyone.
    """
    budget = descriptor_budget()
    cap = max_connections if budget is None else max(1, min(max_connections, budget))
    if cap < max_connections:
        logger.warning(
            "max_connections %d lowered to %d: the file-descriptor limit (ulimit -n) leaves no more",
            max_connections,
            cap,
        )
    connections = _Connections(cap)

    class GuardedH11Protocol(_GuardedH11Protocol):
        pass

    GuardedH11Protocol.registry = connections
    GuardedH11Protocol.abort_key = abort_key
    GuardedH11Protocol.read_timeout = read_timeout
    return GuardedH11Protocol
