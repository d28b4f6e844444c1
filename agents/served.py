"""A model behind an OpenAI-compatible endpoint (vLLM, SGLang, a hosted API, ``searchgym serve-policy``) as a
SearchQA agent: ``--agent openai:MODEL --base-url URL``.

Each turn is one request. The context so far — the env's prompt, the model's earlier turns and the
``<information>`` blocks the env appended, exactly as the env wrote them — goes out as a completion prompt
(``api="completions"``) or as a chat whose user message is the env's prompt and whose assistant message is
the rest, continued (``api="chat"``; ``continue_final_message`` as vLLM and SGLang name it). Generation
stops at ``</search>`` or ``</answer>``; the server leaves the stop string out of its text, so it is put
back (the one the server names in ``stop_reason``, else the tag the text last opened), and the text is
encoded with the env's tokenizer and fed token by token. A server that returns the generated ids
(``token_ids``, as ``serve-policy`` does) can be played token-exact with ``token_ids=True``: the prompt is
then sent as ids too, which needs the server's model to share the env's tokenizer.

The API key comes from the environment variable ``api_key_env`` names (never from the command line); it
is sent as a bearer token and never written to a record or a log. Each request's body (the prompt, the
settings), its text, finish reason, usage and time are kept in the episode record under ``requests``.

The server is not trusted. ``timeout`` bounds each try of a request whole — connecting, the answer's head
and its body — however slowly the bytes come (a watchdog shuts the socket at the deadline); the answer is
read as a stream and refused past ``max_response_bytes`` (an error page too); it is parsed with the
bounded parser of ``searchgym serve`` (:func:`~searchgym.server.wire.loads_bounded`: no nesting deeper
than 64 levels, no more values than the size allows); a completion longer than
:data:`MAX_CHARS_PER_TOKEN` characters per token asked is refused before it is encoded; and a number in
``usage`` that is not finite is recorded as ``null``, so the eval output stays strict JSON.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import numpy as np

from searchgym.errors import ConfigError, MissingDependencyError, ServedModelError
from searchgym.protocol import Source
from searchgym.server.completions import MAX_CHARS_PER_TOKEN

from .base import Agent, Observation

__all__ = ["MAX_CHARS_PER_TOKEN", "STOPS", "ServedAgent", "ServedOptions"]

STOPS = ("</search>", "</answer>")
"""The stop strings of every request: a turn ends with a search or an answer."""

_OPENS = {"<search>": "</search>", "<answer>": "</answer>"}


class _Deadline(Exception):
    """A try ran past its total deadline."""


class _TooLarge(Exception):
    """An answer's body is over the size limit."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


@dataclass(frozen=True)
class ServedOptions:
    """How to reach a served model, validated once.

    Attributes:
        model: The model name the server knows.
        base_url: The server's OpenAI base URL, e.g. ``http://127.0.0.1:8001/v1``.
        api: ``completions`` (``POST /completions``) or ``chat`` (``POST /chat/completions``).
        api_key_env: The environment variable holding the API key (unset: no key is sent).
        timeout: Seconds one try of a request may take, whole (connecting, the head and the body).
        retries: Further tries after a failed request (a connection error, a timeout, 429 or 5xx), with
            exponential pauses.
        top_p: Nucleus sampling threshold sent with every request.
        token_ids: Send the prompt as token ids and play the ids the server returns (completions only).
        max_response_bytes: The largest answer body read (an error page too); a larger one is refused.
    """

    model: str
    base_url: str
    api: Literal["completions", "chat"] = "completions"
    api_key_env: str = "OPENAI_API_KEY"
    timeout: float = 60.0
    retries: int = 2
    top_p: float = 1.0
    token_ids: bool = False
    max_response_bytes: int = 16 * 2**20

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"--base-url must be http(s)://host[:port][/v1], got {self.base_url!r}")
        if not self.model:
            raise ConfigError("--agent openai:MODEL needs a model name after 'openai:'")
        if self.api not in ("completions", "chat"):
            raise ConfigError(f"--api must be completions or chat, got {self.api!r}")
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise ConfigError(f"--request-timeout must be a positive number of seconds, got {self.timeout!r}")
        if self.retries < 0:
            raise ConfigError(f"--retries must be >= 0, got {self.retries}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.token_ids and self.api != "completions":
            raise ConfigError("--token-ids needs --api completions (a chat request carries text only)")
        size = self.max_response_bytes
        if isinstance(size, bool) or not isinstance(size, int) or not 1024 <= size <= 2**31:
            raise ConfigError(f"--max-response-mb must give 1 KiB to 2 GiB, got {size!r} bytes")

    @classmethod
    def from_args(cls, args: Any) -> ServedOptions:
        """The options of an ``eval`` or ``benchmark`` command line whose ``--agent`` is ``openai:MODEL``.

        Raises:
            ConfigError: no ``--base-url``, or an invalid option.
        """
        if getattr(args, "base_url", None) is None:
            raise ConfigError(
                f"--agent {args.agent} needs --base-url URL (the server's OpenAI base, e.g. "
                "http://127.0.0.1:8001/v1); the API key, if any, goes in the environment variable --api-key-env "
                "names"
            )
        return cls(
            model=args.agent[len("openai:") :],
            base_url=args.base_url,
            api=args.api,
            api_key_env=args.api_key_env,
            timeout=args.request_timeout,
            retries=args.retries,
            top_p=args.top_p,
            token_ids=args.token_ids,
            max_response_bytes=_mebibytes(getattr(args, "max_response_mb", 16.0)),
        )

    def identity(self) -> dict[str, Any]:
        """What decides the episodes beyond the sampling settings (the key and the patience do not)."""
        return {
            "model": self.model,
            "base_url": self.base_url.rstrip("/"),
            "api": self.api,
            "top_p": self.top_p,
            "token_ids": self.token_ids,
        }


def _mebibytes(value: float) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(f"--max-response-mb must be a positive number of MiB, got {value!r}")
    return int(value * 2**20)


def _finite(value: Any) -> Any:
    """``value`` with every number that is not finite (NaN, infinity) replaced by ``None``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _cut(stream: Any) -> None:
    """Shuts the socket under an httpcore network stream, so that a read blocked on it returns at once."""
    sock = stream.get_extra_info("socket") if stream is not None else None
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class ServedAgent(Agent):
    """A served model playing SearchQA one turn per request (see the module docstring).

    Args:
        options: The server and request settings.
        tokenizer: The env's tokenizer (the text the server returns is encoded with it).
        max_turn_tokens: The env's per-turn cap: each request asks at most the turn's remaining tokens.
        temperature: 0 for greedy decoding; above, the sampling temperature (set by ``--temperature``).
        transport: An ``httpx`` transport (tests); default: the network.

    Raises:
        MissingDependencyError: ``httpx`` is not installed (the ``server`` extra).
    """

    name = "openai"

    def __init__(
        self,
        options: ServedOptions,
        tokenizer: Any,
        max_turn_tokens: int,
        *,
        temperature: float = 0.0,
        transport: Any = None,
    ) -> None:
        try:
            import httpx
        except ImportError:
            raise MissingDependencyError("httpx", "server", "A served model") from None
        self.options = options
        self.tokenizer = tokenizer
        self.max_turn_tokens = max_turn_tokens
        self.temperature = temperature
        self.requests: list[dict[str, Any]] = []
        self._httpx = httpx
        key = os.environ.get(options.api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(
            base_url=options.base_url.rstrip("/") + "/",
            headers=headers,
            timeout=httpx.Timeout(options.timeout),
            transport=transport,
        )
        self._pending: list[int] = []
        self._seed: int | None = None
        self._stream: Any = None  # the network stream of the connection in use (shut at a try's deadline)

    # -- Agent API ---------------------------------------------------------------------------------------

    def reset(self, info: dict[str, Any], seed: int | None = None) -> None:
        self._pending = []
        self.requests = []
        self._seed = seed

    def act(self, observation: Observation, info: dict[str, Any]) -> int:
        if info.get("turn_end"):  # a new turn: what the server wrote past the last one's stop goes
            self._pending = []
        if not self._pending:
            self._pending = self._turn(observation)
        return self._pending.pop(0)

    def record_extras(self) -> dict[str, Any]:
        """What the episode record keeps of this episode's requests (bodies, texts, usage; never the key)."""
        return {"requests": self.requests}

    def close(self) -> None:
        self._client.close()

    # -- one request -------------------------------------------------------------------------------------

    def _turn(self, observation: Observation) -> list[int]:
        n = int(observation["length"][0])
        ids = [int(t) for t in observation["tokens"][:n]]
        sources = np.asarray(observation["sources"][:n])
        written = 0  # policy tokens already in this turn (after the last prompt or tool token)
        while written < n and sources[n - 1 - written] == Source.POLICY:
            written += 1
        body: dict[str, Any] = {
            "model": self.options.model,
            "max_tokens": max(1, self.max_turn_tokens - written),
            "temperature": self.temperature,
            "top_p": self.options.top_p,
            "stop": list(STOPS),
            "n": 1,
        }
        if self._seed is not None:  # each request of a sampled episode its own, reproducible seed
            body["seed"] = (self._seed * 1009 + len(self.requests)) % 2**31
        if self.options.api == "completions":
            body["prompt"] = ids if self.options.token_ids else self.tokenizer.decode(ids)
        else:
            prompt = int(np.argmax(sources != Source.PROMPT)) if np.any(sources != Source.PROMPT) else n
            messages = [{"role": "user", "content": self.tokenizer.decode(ids[:prompt])}]
            if prompt < n:
                messages.append({"role": "assistant", "content": self.tokenizer.decode(ids[prompt:])})
            body["messages"] = messages
            body["continue_final_message"] = prompt < n
            body["add_generation_prompt"] = prompt == n
        start = time.perf_counter()
        answer = self._post(body)
        choice, text = self._choice(answer)
        most = body["max_tokens"] * MAX_CHARS_PER_TOKEN
        if len(text) > most:
            raise ServedModelError(
                f"{self._url} answered a completion of {len(text)} characters for at most {body['max_tokens']} "
                f"tokens (more than {MAX_CHARS_PER_TOKEN} characters a token): refused before encoding it"
            )
        tokens = self._tokens(choice, text)
        reason = choice.get("finish_reason")
        self.requests.append(
            {
                "request": body,
                "text": text,
                "finish_reason": reason if isinstance(reason, str) else None,
                "usage": _finite(answer.get("usage")),
                "seconds": round(time.perf_counter() - start, 4),
            }
        )
        return tokens

    @property
    def _path(self) -> str:
        return "completions" if self.options.api == "completions" else "chat/completions"

    @property
    def _url(self) -> str:
        return f"{self.options.base_url.rstrip('/')}/{self._path}"

    def _exchange(self, body: dict[str, Any]) -> tuple[int, bytes]:
        """One try: the answer's status and body, read within the deadline and the size limit.

        Raises:
            _Deadline: the try ran past ``timeout`` seconds.
            _TooLarge: the body is over ``max_response_bytes``.
            httpx.TimeoutException, httpx.TransportError: as ``httpx`` raises them.
        """
        limit, timeout = self.options.max_response_bytes, self.options.timeout
        deadline = time.monotonic() + timeout
        expired = threading.Event()

        def trace(event: str, info: dict[str, Any]) -> None:
            if event == "connection.connect_tcp.complete":
                self._stream = info.get("return_value")

        def cut() -> None:  # a read blocked on a trickling server returns when its socket is shut
            expired.set()
            _cut(self._stream)

        watchdog = threading.Timer(timeout, cut)
        watchdog.daemon = True
        watchdog.start()
        try:
            with self._client.stream("POST", self._path, json=body, extensions={"trace": trace}) as response:
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > limit:
                    raise _TooLarge(response.status_code)
                data = bytearray()
                for chunk in response.iter_bytes():
                    data += chunk
                    if len(data) > limit:
                        raise _TooLarge(response.status_code)
                    if time.monotonic() > deadline:
                        raise _Deadline
                return response.status_code, bytes(data)
        except (self._httpx.TransportError, self._httpx.StreamError):
            if expired.is_set():
                raise _Deadline from None
            raise
        finally:
            watchdog.cancel()

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        """The server's JSON answer to ``body``, retried on a connection error, a timeout, 429 or 5xx.

        Raises:
            ServedModelError: every try failed, the server refused the request (another 4xx), or the answer
                is over the size limit, not JSON, or nested too deeply.
        """
        from searchgym.server.wire import RequestError, loads_bounded

        url = self._url
        why = ""
        for attempt in range(self.options.retries + 1):
            if attempt:
                time.sleep(min(0.5 * 2 ** (attempt - 1), 8.0))
            try:
                status, data = self._exchange(body)
            except (_Deadline, self._httpx.TimeoutException):
                why = f"no complete answer within {self.options.timeout:g} s"
                continue
            except _TooLarge as e:
                raise ServedModelError(
                    f"{url} answered HTTP {e.status} with a body over {self.options.max_response_bytes} bytes: "
                    "refused (--max-response-mb raises the limit)"
                ) from None
            except self._httpx.TransportError as e:
                why = f"cannot connect ({type(e).__name__}: {str(e)[:120] or 'connection failed'}; is the server up?)"
                continue
            text = data[:300].decode("utf-8", "replace")
            if status == 429 or status >= 500:
                why = f"HTTP {status}: {text[:200]}"
                continue
            if status >= 400:
                raise ServedModelError(f"{url} refused the request: HTTP {status}: {text}")
            try:
                # Bounded by the size already; the walk stops deep nesting (64 levels) without recursing far.
                answer = loads_bounded(data, len(data) + 1)
            except RequestError:
                raise ServedModelError(
                    f"{url} answered something that is not JSON (or nested deeper than 64 levels): {text[:200]!r}"
                ) from None
            if not isinstance(answer, dict):
                raise ServedModelError(f"{url} answered a {type(answer).__name__}, not a completion")
            return answer
        tries = self.options.retries + 1
        raise ServedModelError(f"{url}: {why} ({tries} tr{'y' if tries == 1 else 'ies'})")

    def _choice(self, answer: dict[str, Any]) -> tuple[dict[str, Any], str]:
        choices = answer.get("choices")
        choice = (
            choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
        )
        if choice is not None and self.options.api == "chat":
            message = choice.get("message")
            text = message.get("content") if isinstance(message, dict) else None
        else:
            text = choice.get("text") if choice is not None else None
        if choice is None or not isinstance(text, str):
            raise ServedModelError(
                f"{self._url} answered something that is not a {self.options.api} response (no choices[0]."
                f"{'message.content' if self.options.api == 'chat' else 'text'}): {str(answer)[:200]}"
            )
        return choice, text

    def _tokens(self, choice: dict[str, Any], text: str) -> list[int]:
        """The env tokens of a choice: its ``token_ids`` when asked and given, else its text encoded, with the
        stop string the server left out put back (or the end-of-sequence token, where the model stopped on
        it)."""
        vocab = self.tokenizer.vocab_size
        ids = choice.get("token_ids")
        if self.options.token_ids and isinstance(ids, list) and ids:
            if not all(isinstance(t, int) and 0 <= t < vocab for t in ids):
                raise ServedModelError(
                    f"the served model returned token ids outside the env's vocabulary of {vocab}"
                )
            return list(ids)
        tokens = list(self.tokenizer.encode(text)) if text else []
        if choice.get("finish_reason") == "stop":
            stop = choice.get("stop_reason")
            if stop not in STOPS:  # servers that do not name the stop: the tag the text last opened
                opened = max(_OPENS, key=text.rfind)
                stop = _OPENS[opened] if text.rfind(opened) >= 0 else None
            if stop is not None:
                tokens += self.tokenizer.encode(stop)
            elif self.tokenizer.eos_token_id is not None:
                tokens.append(self.tokenizer.eos_token_id)
        if not tokens:  # nothing to play: the turn ends as a model's end-of-sequence would end it
            if self.tokenizer.eos_token_id is None:
                raise ServedModelError("the served model returned an empty completion")
            tokens = [self.tokenizer.eos_token_id]
        return tokens
