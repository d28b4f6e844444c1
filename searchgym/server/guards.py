"""The request and session guards both of searchgym's servers share (``searchgym serve`` and ``searchgym
openenv serve``), as ASGI middleware and a logging filter; the connection guards are
:mod:`searchgym.server.connections`'.

* :class:`BodyLimit` reads a request's body before the app sees it: more than ``max_body_bytes`` (declared or
  streamed) is a 413, a body that does not arrive within ``read_timeout`` a 408 that closes the connection.
  Each is one JSON line, ``{"detail": "..."}``; nothing past the limit is buffered.
* :class:`SessionIdleTimeout` closes a WebSocket session whose client has sent nothing for ``timeout``
  seconds (code 1001), so idle sessions cannot hold every slot of a server for good.
* :class:`RepeatFilter` lets a log line through once per ``window`` seconds and counts the repeats it held
  back: a flood of one failure ("Too many open files", a client's bad requests) cannot fill a disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from typing import Any

__all__ = ["BodyLimit", "RepeatFilter", "SessionIdleTimeout", "error_response", "install_repeat_filter"]

#: The loggers a server's repeated failures come through: uvicorn's, and asyncio's (accept errors).
GUARDED_LOGGERS = ("uvicorn.error", "asyncio")


async def error_response(send: Any, status: int, message: str, close: bool = False) -> None:
    """Sends ``{"detail": message}`` with ``status`` (and ``connection: close`` when asked)."""
    body = json.dumps({"detail": message}).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class BodyLimit:
    """ASGI middleware: the body of every HTTP request, bounded in size and time, read before the app runs.

    Args:
        app: The ASGI app.
        max_body_bytes: Largest body; a larger one (declared by ``content-length`` or streamed) gets 413.
        read_timeout: Seconds the whole body has to arrive; a later one gets 408 and the connection closes
            (its unread rest could not carry another request).
    """

    def __init__(self, app: Any, max_body_bytes: int, read_timeout: float) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.read_timeout = read_timeout

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read(scope, receive)
        except _Refused as e:
            await error_response(send, e.status, e.message, close=e.status == 408)
            return
        delivered = False

        async def replay() -> Any:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # what follows the body: a disconnect

        await self.app(scope, replay, send)

    async def _read(self, scope: Any, receive: Any) -> bytes:
        over = _Refused(413, f"request body over {self.max_body_bytes} bytes")
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
                raise over
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.read_timeout):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":  # the client left: nothing more will come
                        break
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_body_bytes:  # chunked uploads declare no length
                        raise over
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise _Refused(408, f"the request body did not arrive within {self.read_timeout:g} s") from None
        return b"".join(chunks)


class SessionIdleTimeout:
    """ASGI middleware: a WebSocket session whose client sends nothing for ``timeout`` seconds is closed
    (code 1001, "idle"), and the app sees the client leave, so it frees the session.

    Args:
        app: The ASGI app.
        timeout: Seconds a session may stay silent; ``None``: forever.
    """

    def __init__(self, app: Any, timeout: float | None) -> None:
        self.app = app
        self.timeout = timeout

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket" or self.timeout is None:
            await self.app(scope, receive, send)
            return
        idle = False

        async def watched_receive() -> Any:
            nonlocal idle
            if idle:
                return {"type": "websocket.disconnect", "code": 1001}
            try:
                return await asyncio.wait_for(receive(), self.timeout)
            except TimeoutError:
                idle = True
                with contextlib.suppress(Exception):  # the connection may be gone already: the session ends
                    await send(
                        {"type": "websocket.close", "code": 1001, "reason": f"idle for {self.timeout:g} s"}
                    )
                return {"type": "websocket.disconnect", "code": 1001}

        await self.app(scope, watched_receive, send)


class RepeatFilter(logging.Filter):
    """Lets each distinct log message (its logger, level and first line) through once per ``window`` seconds;
    the next one let through says how many were held back.

    Args:
        window: Seconds between two copies of one message.
    """

    def __init__(self, window: float = 10.0) -> None:
        super().__init__()
        self.window = window
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        # The first line: asyncio's messages go on with the socket's details, which differ every time.
        key = (record.name, record.levelno, str(record.msg).split("\n", 1)[0])
        now = time.monotonic()
        with self._lock:
            last, held = self._seen.get(key, (-float("inf"), 0))
            if now - last < self.window:
                self._seen[key] = (last, held + 1)
                return False
            self._seen[key] = (now, 0)
            if len(self._seen) > 4096:  # distinct messages are few; forget the oldest rather than grow
                self._seen.pop(next(iter(self._seen)))
        if held:
            record.msg = f"{record.msg} ({held} more like this in the last {self.window:g} s were not logged)"
        return True


_INSTALLED: dict[str, RepeatFilter] = {}


def install_repeat_filter(window: float = 10.0) -> None:
    """Puts one :class:`RepeatFilter` on each of :data:`GUARDED_LOGGERS` (once per process)."""
    for name in GUARDED_LOGGERS:
        if name not in _INSTALLED:
            _INSTALLED[name] = RepeatFilter(window)
            logging.getLogger(name).addFilter(_INSTALLED[name])
