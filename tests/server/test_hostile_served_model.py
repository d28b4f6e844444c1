"""The ``openai:`` agent against hostile servers on 127.0.0.1: a server that trickles its answer (the head or
the body), sends an endless or a huge body, a 100 MB error page, a completion far longer than asked, JSON
nested 100,000 deep, or NaN in ``usage``. Each is one ``ServedModelError`` line within the request's deadline
and the size limit (lowered here, so the attacks are cheap), and ``eval --out`` leaves nothing behind; NaN in
``usage`` is recorded as ``null``, so the output stays strict JSON."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import searchgym  # noqa: F401 - registers the env ids
from searchgym.agents import evaluate
from searchgym.agents.served import ServedAgent, ServedOptions
from searchgym.errors import ConfigError, ServedModelError

Behaviour = Callable[[socket.socket], None]

GOOD = {"choices": [{"text": " <answer> x", "finish_reason": "stop"}], "usage": {"completion_tokens": 3}}


def _read_request(conn: socket.socket) -> None:
    """Reads one request (its head and a ``content-length`` body) so the client is not refused mid-send."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk


@contextlib.contextmanager
def hostile(behaviour: Behaviour) -> Iterator[str]:
    """A server on 127.0.0.1 answering every connection with ``behaviour``; yields its ``/v1`` base URL."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve_one(conn: socket.socket) -> None:
        with conn:
            try:
                _read_request(conn)
                behaviour(conn)
            except OSError:  # the client hung up: what these attacks end in
                pass

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def _trickle(data: bytes, every: float, stop_after: float = 30.0) -> Behaviour:
    def behaviour(conn: socket.socket) -> None:
        end = time.monotonic() + stop_after
        for i in range(len(data)):
            if time.monotonic() > end:
                return
            conn.sendall(data[i : i + 1])
            time.sleep(every)

    return behaviour


def _answer(body: bytes, status: str = "200 OK") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode()
        + body
    )


def _env() -> Any:
    return gym.make("SearchQA-v0", max_turns=2, max_turn_tokens=12)


def _play(url: str, measured: dict[str, float] | None = None, **options: Any) -> None:
    """Plays one episode against ``url``, putting the seconds it took and the peak of Python's allocations
    (bytes) in ``measured``, raise or not.

    Raises:
        ServedModelError: as the agent raises it.
    """
    env = _env()
    agent = ServedAgent(ServedOptions("m", url, **options), env.unwrapped.tokenizer, 12)
    tracemalloc.start()
    start = time.monotonic()
    try:
        evaluate(env, agent, 1)
    finally:
        if measured is not None:
            measured["seconds"] = time.monotonic() - start
            measured["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        agent.close()


def _one_line(caught: pytest.ExceptionInfo[ServedModelError], *parts: str) -> None:
    message = str(caught.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, message


@pytest.mark.slow
@pytest.mark.parametrize("where", ["head", "body"])
def test_a_trickling_server_is_cut_at_the_requests_deadline(where: str) -> None:
    """One byte every 0.1 s keeps every read alive: the deadline is the whole try's (1 s here, no retry)."""
    body = json.dumps(GOOD).encode()
    answer = _answer(body + b" " * 200)
    if where == "head":
        behaviour = _trickle(answer, 0.1)
    else:
        head, _, rest = answer.partition(b"\r\n\r\n")

        def behaviour(conn: socket.socket) -> None:
            conn.sendall(head + b"\r\n\r\n")
            _trickle(rest, 0.1)(conn)

    measured: dict[str, float] = {}
    with hostile(behaviour) as url, pytest.raises(ServedModelError) as caught:
        _play(url, measured, timeout=1.0, retries=0)
    _one_line(caught, url, "no complete answer within 1 s (1 try)")
    assert measured["seconds"] < 1.0 + 2.0  # the answer would take 20 s; slack for a busy machine


@pytest.mark.slow
def test_the_deadline_counts_from_the_start_of_each_try() -> None:
    started = time.monotonic()
    with (
        hostile(_trickle(_answer(b"{}" + b" " * 100), 0.1)) as url,
        pytest.raises(ServedModelError) as caught,
    ):
        _play(url, timeout=0.8, retries=1)
    elapsed = time.monotonic() - started
    _one_line(caught, "no complete answer within 0.8 s (2 tries)")
    assert elapsed < 2 * 0.8 + 0.5 + 2.0  # two tries, the pause between, slack for a busy machine


@pytest.mark.slow
def test_an_endless_body_stops_at_the_size_limit_with_bounded_memory() -> None:
    def endless(conn: socket.socket) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        chunk = b"[" * 65536
        while True:
            conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))

    measured: dict[str, float] = {}
    with hostile(endless) as url, pytest.raises(ServedModelError) as caught:
        _play(url, measured, max_response_bytes=2**20, timeout=30.0)
    _one_line(caught, "with a body over 1048576 bytes: refused (--max-response-mb raises the limit)")
    assert (
        measured["peak"] < 8 * 2**20
    )  # the limit and the reads in flight, not the body the server would send


@pytest.mark.slow
def test_a_huge_error_page_is_refused_from_its_declared_length() -> None:
    def huge_500(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 100000000\r\n\r\n")
        conn.sendall(b"x" * 65536)  # the rest never comes: its declared length is refused before it is read
        time.sleep(5)

    measured: dict[str, float] = {}
    with hostile(huge_500) as url, pytest.raises(ServedModelError) as caught:
        _play(url, measured, max_response_bytes=2**20, timeout=30.0)
    _one_line(caught, "answered HTTP 500 with a body over 1048576 bytes")
    assert measured["seconds"] < 4.0 and measured["peak"] < 8 * 2**20  # not read: the server waits 5 s


@pytest.mark.slow
def test_a_completion_far_longer_than_asked_is_refused_before_encoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = " <answer> " + "y" * 200_000
    body = json.dumps({"choices": [{"text": text, "finish_reason": "length"}]}).encode()
    env = _env()
    tokenizer = env.unwrapped.tokenizer
    encoded: list[int] = []
    real = tokenizer.encode
    monkeypatch.setattr(tokenizer, "encode", lambda s, *a, **k: encoded.append(len(s)) or real(s, *a, **k))
    with hostile(lambda conn: conn.sendall(_answer(body))) as url:
        agent = ServedAgent(ServedOptions("m", url, retries=0), tokenizer, 12)
        with pytest.raises(ServedModelError) as caught:
            evaluate(env, agent, 1)
        agent.close()
    _one_line(
        caught, f"a completion of {len(text)} characters for at most 12 tokens", "refused before encoding"
    )
    assert all(n < 100_000 for n in encoded)  # the env's prompt was encoded; the completion never was


@pytest.mark.slow
@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000 + b"]" * 100_000, b'{"choices": ' * 100_000, b'{"choices": [{"text": "x"', b"NaN"],
    ids=["nested-100000", "open-100000", "truncated", "nan"],
)
def test_malformed_answers_are_one_line(body: bytes) -> None:
    with hostile(lambda conn: conn.sendall(_answer(body))) as url, pytest.raises(ServedModelError) as caught:
        _play(url, retries=0)
    _one_line(caught, url)


@pytest.mark.slow
def test_nan_in_usage_is_recorded_as_null_and_the_output_stays_strict_json(tmp_path: Path) -> None:
    from searchgym.app.cli import main

    body = (
        b'{"choices": [{"text": " <answer> x", "finish_reason": "stop"}], '
        b'"usage": {"prompt_tokens": NaN, "completion_tokens": Infinity, "total_tokens": -Infinity, "n": 3}}'
    )
    out = tmp_path / "out.jsonl"
    with hostile(lambda conn: conn.sendall(_answer(body))) as url:
        argv = ["eval", "--agent", "openai:m", "--base-url", url, "--concurrency", "1", "--max-turns", "2",
                "--max-turn-tokens", "12", "--episodes", "2", "--no-progress", "--out", str(out)]  # fmt: skip
        assert main(argv) == 0

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the output")

    records = [json.loads(line, parse_constant=refuse) for line in out.read_text().splitlines()]
    usage = records[0]["requests"][0]["usage"]
    assert usage == {"prompt_tokens": None, "completion_tokens": None, "total_tokens": None, "n": 3}


@pytest.mark.slow
def test_eval_against_a_trickling_server_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from searchgym.app.cli import main

    out = tmp_path / "out.jsonl"
    with hostile(_trickle(_answer(json.dumps(GOOD).encode()), 0.2)) as url:
        argv = ["eval", "--agent", "openai:m", "--base-url", url, "--request-timeout", "1", "--retries", "0",
                "--concurrency", "1", "--episodes", "1", "--no-progress", "--out", str(out)]  # fmt: skip
        assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no complete answer within 1 s" in err[0], err
    assert not out.exists()


def test_the_response_size_option_is_checked() -> None:
    with pytest.raises(ConfigError, match="--max-response-mb must give 1 KiB to 2 GiB"):
        ServedOptions("m", "http://127.0.0.1:9/v1", max_response_bytes=0)
    from searchgym.agents.served import _mebibytes

    for bad in (-1.0, 0.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="--max-response-mb must be a positive number"):
            _mebibytes(bad)
