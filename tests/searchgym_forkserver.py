"""A ``searchgym`` command for tests that run many of them: each run is a process forked from a server that
has already imported torch, transformers and the CLI.

Importing those is most of the CPU a tiny training command spends (about 5 of its 8 s on a two-core
machine), and the experiment scripts' smoke tests run dozens of such commands. Through this server each
command still runs in a process of its own, in the caller's folder, with the caller's environment, argv,
standard streams and exit code, and is stopped by the signals the caller gets; only the imports are done
once. The module imports nothing heavy at its top: the client (the ``searchgym`` on the tests' ``PATH``)
starts in a few tens of milliseconds.

Use :func:`forkserver` (a context manager) to start a server and get the folder holding its ``searchgym``
command (its socket, ``socket``, is beside that folder). Where the server is gone, the command runs the real
``searchgym`` instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

#: Modules the server imports before it forks: what a training, evaluation or export command loads.
PRELOAD = (
    "torch",
    "transformers",
    "transformers.models.qwen2.modeling_qwen2",
    "searchgym.app.cli",
    "searchgym.agents.grpo.trainer",
    "searchgym.agents.sft",
    "searchgym.agents.evaluate",
    "searchgym.agents.llm.model",
    "searchgym.agents.llm.policy",
    "searchgym.envs.search_qa",
    "searchgym.retrieval.bm25",
)

CLIENT = """#!{python}
import sys
sys.path.insert(0, {tests!r})
from searchgym_forkserver import client
client({socket!r}, {real!r})
"""


def _receive_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def client(path: str, real: str) -> None:
    """Runs ``searchgym ARGV`` in a process forked from the server at ``path`` and exits with its code;
    without a server, runs the real command ``real``."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        os.execv(real, [real, *sys.argv[1:]])
    request = json.dumps({"argv": [real, *sys.argv[1:]], "cwd": os.getcwd(), "env": dict(os.environ)})
    socket.send_fds(conn, [struct.pack("!I", len(request.encode()))], [0, 1, 2])
    conn.sendall(request.encode())
    (pid,) = struct.unpack("!i", _receive_exactly(conn, 4))
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, lambda received, _frame: os.kill(pid, received))
    try:
        (code,) = struct.unpack("!i", _receive_exactly(conn, 4))
    except EOFError:  # the command's process ended without a code: killed by a signal
        code = 1
    sys.exit(code)


def _run_command(conn: socket.socket) -> None:
    """In the forked child: takes over the caller's streams, folder and environment, runs the command."""
    message, fds, _flags, _address = socket.recv_fds(conn, 4, 3)
    (size,) = struct.unpack("!I", message)
    request = json.loads(_receive_exactly(conn, size))
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = request["argv"]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    conn.sendall(struct.pack("!i", os.getpid()))
    code = 1
    try:
        from searchgym.app.cli import main

        code = main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        with contextlib.suppress(OSError):
            conn.sendall(struct.pack("!i", int(code)))
        os._exit(int(code))


def serve(path: str) -> None:
    """Imports :data:`PRELOAD`, listens on the Unix socket ``path`` and forks one child per connection."""
    import importlib

    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)

    def reap(_number: int, _frame: object) -> None:  # so their CPU counts in the server's children's
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass

    signal.signal(signal.SIGCHLD, reap)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _run_command(conn)
        conn.close()


@contextlib.contextmanager
def forkserver(real: Path) -> Iterator[Path]:
    """Starts a server; yields a folder whose ``searchgym`` runs commands through it (``real`` without it)."""
    with tempfile.TemporaryDirectory(prefix="sg-fork-") as folder:
        path = str(Path(folder) / "socket")
        server = subprocess.Popen(
            [sys.executable, __file__, path], stdout=subprocess.PIPE, text=True, cwd=folder
        )
        try:
            ready = server.stdout.readline() if server.stdout else ""
            assert ready.strip() == "ready", f"the searchgym fork server did not start (exit {server.poll()})"
            command = Path(folder) / "bin" / "searchgym"
            command.parent.mkdir()
            text = CLIENT.format(
                python=sys.executable, tests=str(Path(__file__).parent), socket=path, real=str(real)
            )
            command.write_text(text, encoding="utf-8")
            command.chmod(0o755)
            yield command.parent
        finally:
            server.terminate()
            server.wait(timeout=60)


if __name__ == "__main__":
    sys.path.pop(0)  # as the console script: the tests' folder is not on the path
    serve(sys.argv[1])
