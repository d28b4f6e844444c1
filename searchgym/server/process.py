"""Running the retrieval app: uvicorn with the connection guards, in the foreground or in a thread.

:func:`run_server` serves until interrupted (``searchgym serve``); :class:`ServerThread` serves in a
background thread for tests, benchmarks and notebooks; :func:`bind_socket` makes the listening socket
both use. The guards (a read deadline, a connection cap, the abort hook) are :mod:`.connections`'.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from searchgym.errors import ConfigError, MissingDependencyError, RetrieverError

from .app import ABORT_KEY
from .guards import install_repeat_filter
from .wire import ServerLimits


def _uvicorn_server(app: Any, **options: Any) -> Any:
    """A uvicorn server for ``app``, with the connection limits of its :class:`ServerLimits`.

    The limits are those :func:`create_app` (or the OpenEnv app's builder) recorded on the app (the defaults
    for any other app): a deadline for each request's head and a cap on open connections
    (:mod:`searchgym.server.connections`). Repeated log lines are rate-limited
    (:func:`~searchgym.server.guards.install_repeat_filter`).
    """
    try:
        import uvicorn

        from .connections import uvicorn_options
    except ImportError:
        raise MissingDependencyError("uvicorn", "server", "The retrieval server") from None
    limits = getattr(getattr(app, "state", None), "limits", None)
    if not isinstance(limits, ServerLimits):
        limits = ServerLimits()
    guards = uvicorn_options(limits.read_timeout, limits.max_connections, ABORT_KEY)
    server = uvicorn.Server(uvicorn.Config(app, **guards, **options))
    install_repeat_filter()  # after uvicorn configured its loggers: a flood of one failure is logged once
    return server


class _Listener(socket.socket):
    """A listening socket whose accept queue stays at least 2,048 connections long.

    uvicorn's ``backlog`` is also how many connections asyncio accepts per turn of its loop; the server
    keeps that small (:data:`searchgym.server.connections.ACCEPT_BURST`) without shortening the queue.
    """

    def listen(self, backlog: int = 2048, /) -> None:
        super().listen(max(backlog, 2048))


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``SO_REUSEADDR``; port 0 picks a free one).

    Raises:
        ConfigError: the address cannot be bound (in use, not local, no permission).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = _Listener(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen()
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def run_server(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serves ``app`` with uvicorn until interrupted (Ctrl-C).

    The socket is bound first, so ``on_ready`` (called with the base URL) runs only once the address is
    really held; a bind failure raises before it.

    Raises:
        ConfigError: the address cannot be bound.
    """
    server = _uvicorn_server(app, log_level=log_level)
    sock = bind_socket(host, port)
    bound = sock.getsockname()[1]
    if on_ready is not None:
        on_ready(f"http://{f'[{host}]' if ':' in host else host}:{bound}")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


class ServerThread:
    """Runs an app with uvicorn in a background thread: for tests, notebooks, and in-process training.

    The listening socket is bound before the thread starts, so ``port=0`` picks a free port with no race,
    and :attr:`url` is valid as soon as :meth:`start` returns. Use it as a context manager::

        with ServerThread(create_app(retriever, passages)) as server:
            client = HttpRetriever(server.url + "/retrieve")

    Args:
        app: The ASGI application.
        host: Interface to listen on (loopback by default).
        port: Port; 0 picks a free one. Rebinding a port just released works (``SO_REUSEADDR``).
        startup_timeout: Seconds to wait for the server to accept connections (a guard against one that
            never starts: generous, since a machine whose cores are busy can take seconds).
    """

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, startup_timeout: float = 60.0
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.startup_timeout = startup_timeout
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:54321``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> ServerThread:
        """Binds, starts serving, and waits until the server is up.

        Raises:
            RetrieverError: the server did not come up within ``startup_timeout``.
        """
        server = _uvicorn_server(self.app, log_level="warning", access_log=False, lifespan="off")
        sock = bind_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        self._socket = sock
        self._server = server
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [sock]},
            name=f"searchgym-server-{self.port}",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RetrieverError(f"the retrieval server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stops serving (open connections are closed) and waits for the thread to end."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        self._server = None

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
