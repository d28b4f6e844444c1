"""A streaming front for a non-streaming OpenAI-compatible server, for the vf-eval end-to-end test.

verifiers' chat harness always asks for ``stream=true``; ``searchgym serve-policy`` answers whole
completions only. This app forwards each ``/v1/chat/completions`` request with ``stream=false`` and returns the
completion as server-sent events (one content chunk, then the finish chunk and ``[DONE]``). Usage:
``python sse_shim.py UPSTREAM_URL PORT``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def create_app(upstream: str) -> Starlette:
    async def chat(request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        stream = bool(body.pop("stream", False))
        body.pop("stream_options", None)
        async with httpx.AsyncClient(timeout=600) as client:
            r = await client.post(f"{upstream}/chat/completions", json=body)
        if r.status_code >= 400 or not stream:
            return JSONResponse(r.json(), status_code=r.status_code)
        done = r.json()
        choice = done["choices"][0]
        head = {k: done[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
        message = {"role": "assistant", "content": choice["message"].get("content") or ""}
        events = [
            head | {"choices": [{"index": 0, "delta": message, "finish_reason": None}]},
            head | {"choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
            head | {"choices": [], "usage": done.get("usage")},
        ]

        async def sse() -> Any:
            for event in events:
                yield f"data: {json.dumps(event)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


if __name__ == "__main__":
    uvicorn.run(
        create_app(sys.argv[1].rstrip("/")), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning"
    )
