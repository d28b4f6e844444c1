"""An OpenAI-compatible completions server over any token generator: ``searchgym serve-policy``'s app.

Routes: ``POST /v1/completions`` (``prompt`` as text or token ids), ``POST /v1/chat/completions``
(``messages``; the contents are joined in order into one prompt — the policy was trained on Search-R1's raw
text, with no chat template — so a chat that continues the assistant's message continues that text), ``GET
/v1/models`` and ``GET /health``. Requests take ``model``, ``max_tokens``, ``temperature`` (0: greedy),
``top_p``, ``stop`` (up to 4 strings), ``seed``, ``n`` (1 only) and ``stream``. A choice carries OpenAI's
``text`` (or ``message``) and ``finish_reason``, vLLM's ``stop_reason`` (the stop string matched) and
``token_ids`` (every generated id, the stop's own tokens included), and the answer its ``usage``.

``stream: true`` answers server-sent events in OpenAI's chunk format (``text/event-stream``): each event a
``data: {...}`` line — a ``chat.completion.chunk`` (its ``delta``: the role, then the text) or a
``text_completion`` chunk, the last one with the ``finish_reason``, ``stop_reason`` and ``token_ids`` —
then, when ``stream_options.include_usage`` is true, a chunk with no choices and the ``usage`` (every other
chunk then has ``"usage": null``), and ``data: [DONE]``. The completion is generated whole before the first
event is sent (one generation at a time, as above), so the text arrives in one delta; a request refused is
one 4xx JSON line, as unstreamed.

Bounded like ``searchgym serve``: the same body-size and read-time guards and connection cap
(:mod:`searchgym.server.guards`, :mod:`searchgym.server.connections`), and the same bounded JSON parser
(:func:`~searchgym.server.wire.loads_bounded`: at most ``max_prompt_tokens`` + 1,024 values, 64 levels of
nesting), run off the event loop with the rest of a body's checks, so ``/health`` answers while a body is
parsed. A prompt text longer than :data:`MAX_CHARS_PER_TOKEN` characters per allowed prompt token is
refused before it is tokenized; a tokenized prompt may hold at most ``max_prompt_tokens``, which must leave
the model's context room for one generated token. At most ``max_tokens_max`` tokens per request, and one
generation at a time (a model is not thread-safe; the others wait their turn, up to ``max_waiting`` of
them, then get 503). Every bad request is one 4xx line, never a 500.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from searchgym.errors import ConfigError, MissingDependencyError

from .guards import BodyLimit
from .wire import RequestError, ServerLimits, loads_bounded

__all__ = ["MAX_CHARS_PER_TOKEN", "Completion", "CompletionLimits", "Generator", "create_completions_app"]

MAX_CHARS_PER_TOKEN = 64
"""Characters one token may stand for, at most, in the size checks made before tokenizing: a prompt text
longer than ``max_prompt_tokens`` times this is refused unread (no tokenizer this project uses has a longer
token), and the ``openai:`` agent refuses a completion longer than its ``max_tokens`` times this."""

SEED_RANGE = (-(2**63), 2**64 - 1)
"""The seeds a request may give: those torch's generators take."""


@dataclass(frozen=True)
class Completion:
    """What a generator made of one prompt."""

    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" (a stop string or the end-of-sequence token) or "length"
    stop: str | None  # the stop string matched, if any


class Generator(Protocol):
    """The model side: ``serve-policy`` wraps a trained policy in one (:mod:`searchgym.agents.llm.completer`)."""

    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def complete(
        self,
        ids: list[int],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        seed: int | None,
        stops: list[str],
    ) -> Completion: ...


@dataclass(frozen=True)
class CompletionLimits:
    """What one request may ask, and how many may wait.

    Attributes:
        max_tokens_max: The most tokens one request may generate (also the default of one that asks none).
        max_prompt_tokens: The longest prompt, in tokens.
        max_waiting: Requests waiting for the model at once; one more gets 503.
        context_tokens: The model's context (prompt and completion), if known: ``max_prompt_tokens`` must
            leave room for one generated token.
        connection: The connection guards of :class:`~searchgym.server.ServerLimits` (read timeout, body
            size, connection cap) shared with ``searchgym serve``.
    """

    max_tokens_max: int = 512
    max_prompt_tokens: int = 8192
    max_waiting: int = 64
    context_tokens: int | None = None
    connection: ServerLimits = field(default_factory=lambda: ServerLimits(max_body_bytes=4 * 2**20))

    def __post_init__(self) -> None:
        for name in ("max_tokens_max", "max_prompt_tokens", "max_waiting"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        context = self.context_tokens
        if context is not None and self.max_prompt_tokens >= context:
            raise ConfigError(
                f"max_prompt_tokens (--max-prompt-tokens) {self.max_prompt_tokens} leaves the model no room to "
                f"write: its context holds {context} tokens, prompt and completion; give at most {context - 1}"
            )

    @property
    def max_body_values(self) -> int:
        """JSON values a body may hold: a prompt of token ids and room for the other fields."""
        return self.max_prompt_tokens + 1024


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _number(body: dict[str, Any], name: str, default: float, ok: Callable[[float], bool], what: str) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not ok(value)
    ):
        raise _BadRequest(400, f"{name} must be {what}, got {value!r}")
    return float(value)


def _text_fits(text: str, limits: CompletionLimits) -> str:
    """``text``, if it may fit ``max_prompt_tokens`` (checked before tokenizing; see MAX_CHARS_PER_TOKEN)."""
    most = limits.max_prompt_tokens * MAX_CHARS_PER_TOKEN
    if len(text) > most:
        raise _BadRequest(
            400,
            f"the prompt has {len(text)} characters, more than this server's {limits.max_prompt_tokens} tokens "
            f"can hold ({most} characters at most): refused before tokenizing",
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _BadRequest(400, f"the prompt is not text: a lone surrogate at character {e.start}") from None
    return text


def _parse(
    body: Any, chat: bool, model: str, generator: Generator, limits: CompletionLimits
) -> dict[str, Any]:
    """The checked settings and prompt ids of a request body (already parsed, within the value budget)."""
    if not isinstance(body, dict):
        raise _BadRequest(400, "the body must be a JSON object")
    if body.get("model") not in (None, model):
        raise _BadRequest(
            404, f"model {body.get('model')!r} is not served here (this server serves {model!r})"
        )
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _BadRequest(400, f"stream must be true or false, got {stream!r}")
    options = body.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise _BadRequest(400, "stream_options must be an object whose include_usage is true or false")
    if options and not stream:
        raise _BadRequest(400, "stream_options is only allowed with stream=true")
    if body.get("n", 1) != 1:
        raise _BadRequest(400, f"n must be 1, got {body.get('n')!r}")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest(400, "messages must be a non-empty list of {role, content}")
        parts = []
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("content"), str):
                raise _BadRequest(400, "every message needs a string content")
            parts.append(m["content"])
        ids = generator.encode(_text_fits("".join(parts), limits))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = generator.encode(_text_fits(prompt, limits))
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            if not all(0 <= t < generator.vocab_size for t in prompt):
                raise _BadRequest(400, f"prompt token ids must lie in 0..{generator.vocab_size - 1}")
            ids = list(prompt)
        else:
            raise _BadRequest(400, "prompt must be a string or a non-empty list of token ids")
    if not ids:
        raise _BadRequest(400, "the prompt is empty")
    if len(ids) > limits.max_prompt_tokens:
        room = (
            f" (the model's context holds {limits.context_tokens} tokens, prompt and completion)"
            if limits.context_tokens is not None
            else ""
        )
        raise _BadRequest(
            400,
            f"the prompt has {len(ids)} tokens, more than this server's {limits.max_prompt_tokens}{room}",
        )
    stop = body.get("stop") or []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise _BadRequest(400, "stop must be a string or a list of at most 4 non-empty strings")
    seed = body.get("seed")
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int) or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]
    ):
        shown = repr(seed) if len(repr(seed)) <= 40 else repr(seed)[:40] + "..."
        raise _BadRequest(400, f"seed must be an integer in -2**63..2**64-1, got {shown}")
    return {
        "ids": ids,
        "max_tokens": int(
            _number(
                body,
                "max_tokens",
                limits.max_tokens_max,
                lambda v: v == int(v) and 1 <= v <= limits.max_tokens_max,
                f"an integer in 1..{limits.max_tokens_max}",
            )
        ),
        "temperature": _number(body, "temperature", 1.0, lambda v: 0 <= v <= 100, "a number in [0, 100]"),
        "top_p": _number(body, "top_p", 1.0, lambda v: 0 < v <= 1, "a number in (0, 1]"),
        "seed": seed,
        "stops": stops,
        "stream": stream,
        "include_usage": bool(options.get("include_usage", False)),
    }


def _closing_choice(done: Completion) -> dict[str, Any]:
    """What a completion's choice says of how it ended (an answer's choice, a stream's last chunk)."""
    return {
        "index": 0,
        "finish_reason": done.finish_reason,
        "stop_reason": done.stop,
        "token_ids": done.token_ids,
        "logprobs": None,
    }


def _events(
    head: dict[str, Any], chat: bool, done: Completion, usage: dict[str, int], include_usage: bool
) -> list[bytes]:
    """The server-sent events of a streamed completion (see the module docstring)."""
    last = _closing_choice(done)
    if chat:
        first = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "finish_reason": None,
            "logprobs": None,
        }
        text = {"index": 0, "delta": {"content": done.text}, "finish_reason": None, "logprobs": None}
        choices = [first, text, {**last, "delta": {}}]
    else:
        choices = [{**last, "text": done.text}]
    chunks: list[dict[str, Any]] = [{**head, "choices": [c]} for c in choices]
    if include_usage:
        chunks = [{**c, "usage": None} for c in chunks] + [{**head, "choices": [], "usage": usage}]
    events = [b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n" for c in chunks]
    return [*events, b"data: [DONE]\n\n"]


class _LoopSemaphore:
    """An ``asyncio.Semaphore`` per event loop (the app may be served from more than one, in tests)."""

    def __init__(self, value: int) -> None:
        self.value = value
        self._by_loop: dict[Any, asyncio.Semaphore] = {}

    async def __aenter__(self) -> None:
        loop = asyncio.get_running_loop()
        await self._by_loop.setdefault(loop, asyncio.Semaphore(self.value)).acquire()

    async def __aexit__(self, *exc: object) -> None:
        self._by_loop[asyncio.get_running_loop()].release()


def create_completions_app(generator: Generator, model: str, limits: CompletionLimits | None = None) -> Any:
    """The FastAPI app serving ``generator`` as ``model`` (see the module docstring).

    Raises:
        MissingDependencyError: FastAPI is not installed (the ``server`` extra).
    """
    try:
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse, StreamingResponse
        from starlette.concurrency import run_in_threadpool
    except ImportError:
        raise MissingDependencyError("fastapi", "server", "The policy server") from None
    limits = limits or CompletionLimits()
    app = FastAPI(title="searchgym serve-policy", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.limits = limits.connection  # run_server and ServerThread apply the connection limits
    app.add_middleware(
        BodyLimit,
        max_body_bytes=limits.connection.max_body_bytes,
        read_timeout=limits.connection.read_timeout,
    )
    locks: dict[Any, asyncio.Lock] = {}  # one per event loop that serves the app
    # Bodies parsed and tokenized at once (the work of one is bounded; so is their number).
    parsing = _LoopSemaphore(limits.connection.max_concurrent)
    waiting = [0]

    def error(status: int, message: str) -> Any:
        return JSONResponse(
            {"error": {"message": message, "code": status}, "detail": message}, status_code=status
        )

    def checked(raw: bytes, chat: bool) -> dict[str, Any]:
        """A body parsed (bounded) and checked: run in a worker thread, off the event loop."""
        return _parse(loads_bounded(raw, limits.max_body_values), chat, model, generator, limits)

    async def serve(request: Request, chat: bool) -> Any:
        raw = await request.body()
        try:
            async with parsing:
                settings = await run_in_threadpool(checked, raw, chat)
        except RequestError as e:
            return error(e.status, e.message)
        except _BadRequest as e:
            return error(e.status, str(e))
        if waiting[0] >= limits.max_waiting:
            return error(503, f"{waiting[0]} requests are waiting for the model; try again later")
        lock = locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())
        stream, include_usage = settings.pop("stream"), settings.pop("include_usage")
        waiting[0] += 1
        try:
            async with lock:
                ids = settings.pop("ids")
                done = await run_in_threadpool(lambda: generator.complete(ids, **settings))
        finally:
            waiting[0] -= 1
        choice = _closing_choice(done)
        if chat:
            choice["message"] = {"role": "assistant", "content": done.text}
        else:
            choice["text"] = done.text
        usage = {
            "prompt_tokens": len(ids),
            "completion_tokens": len(done.token_ids),
            "total_tokens": len(ids) + len(done.token_ids),
        }
        head = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
        }
        if stream:
            head["object"] = "chat.completion.chunk" if chat else "text_completion"
            events = _events(head, chat, done, usage, include_usage)
            return StreamingResponse(
                iter(events), media_type="text/event-stream", headers={"cache-control": "no-cache"}
            )
        return JSONResponse({**head, "choices": [choice], "usage": usage})

    async def completions(request: Request) -> Any:
        return await serve(request, chat=False)

    async def chat_completions(request: Request) -> Any:
        return await serve(request, chat=True)

    async def models(request: Request) -> Any:
        return JSONResponse(
            {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "searchgym"}]}
        )

    async def health(request: Request) -> Any:
        return JSONResponse({"status": "ok", "model": model, "max_tokens_max": limits.max_tokens_max})

    # Plain routes, as searchgym serve's: the handlers read the raw request themselves (exact 4xx messages),
    # so FastAPI's parameter injection, which would need the annotations resolvable at module level, is skipped.
    app.add_route("/v1/completions", completions, methods=["POST"])
    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_route("/v1/models", models, methods=["GET"])
    app.add_route("/health", health, methods=["GET"])
    return app
