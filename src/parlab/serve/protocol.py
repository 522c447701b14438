"""The OpenAI-compatible wire format parlab's servers speak (and its client expects).

Endpoints: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (JSON
body; ``"stream": true`` answers with server-sent events, one
``data: {json}\\n\\n`` per chunk and a final ``data: [DONE]\\n\\n``),
``GET /v1/models`` and ``GET /health``. A streamed completion chunk carries
``choices[0].text``; a chat chunk ``choices[0].delta.content``. With
``stream_options.include_usage`` a last chunk carries ``usage``
(``prompt_tokens``, ``completion_tokens`` and, as vLLM reports it,
``prompt_tokens_details.cached_tokens``). Errors are ``{"error": {message,
type, code}}`` with a 4xx/5xx status; an error after the stream began is sent
as a ``data: {"error": ...}`` chunk and the stream is closed without
``[DONE]``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

LOOPBACK = "127.0.0.1"
MAX_TOKENS_LIMIT = 1 << 16


@dataclass(frozen=True, kw_only=True)
class GenRequest:
    """A parsed generation request."""

    prompt: str
    """The prompt (chat: the messages' contents joined by newlines)."""
    max_tokens: int
    """Tokens to generate."""
    stream: bool
    """Server-sent events or one JSON response."""
    chat: bool
    """``/v1/chat/completions`` (else ``/v1/completions``)."""
    model: str
    """The model name the client asked for."""
    include_usage: bool
    """Send a final ``usage`` chunk when streaming."""
    temperature: float = 0.0
    """0: greedy."""
    seed: int | None = None
    """Sampling seed."""


class BadRequest(ValueError):
    """A request the server rejects with 400."""


def parse_request(body: Any, *, chat: bool, default_model: str) -> GenRequest:
    """Parse a JSON body; ``BadRequest`` names what is wrong."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("'messages' must be a non-empty list")
        parts = []
        for m in msgs:
            if not isinstance(m, dict) or not isinstance(m.get("content"), str):
                raise BadRequest("each message needs a string 'content'")
            parts.append(m["content"])
        prompt = "\n".join(parts)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise BadRequest("'prompt' must be a string")
    mt = body.get("max_completion_tokens", body.get("max_tokens", 16))
    if isinstance(mt, bool) or not isinstance(mt, int) or not 1 <= mt <= MAX_TOKENS_LIMIT:
        raise BadRequest(f"'max_tokens' must be an integer in 1..{MAX_TOKENS_LIMIT}")
    temp = body.get("temperature", 0.0)
    if isinstance(temp, bool) or not isinstance(temp, (int, float)) or temp < 0:
        raise BadRequest("'temperature' must be a number >= 0")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest("'seed' must be an integer")
    opts = body.get("stream_options") or {}
    return GenRequest(
        prompt=prompt,
        max_tokens=mt,
        stream=bool(body.get("stream", False)),
        chat=chat,
        model=str(body.get("model") or default_model),
        include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
        temperature=float(temp),
        seed=seed,
    )


def error_body(message: str, *, kind: str = "invalid_request_error", code: int = 400) -> dict:
    return {"error": {"message": message, "type": kind, "code": code}}


def error_response(message: str, *, status: int = 400, kind: str = "invalid_request_error"):
    return web.json_response(error_body(message, kind=kind, code=status), status=status)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> dict:
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


def chunk(
    req: GenRequest,
    rid: str,
    text: str,
    *,
    finish_reason: str | None = None,
    usage_obj: dict | None = None,
) -> bytes:
    """One SSE event; ``text=""`` with ``usage_obj`` is the final usage chunk."""
    if req.chat:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": text} if text else {},
            "finish_reason": finish_reason,
        }
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish_reason}
        obj = "text_completion"
    data: dict[str, Any] = {
        "id": rid,
        "object": obj,
        "created": int(time.time()),
        "model": req.model,
        "choices": [] if usage_obj is not None else [choice],
    }
    if usage_obj is not None:
        data["usage"] = usage_obj
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def full_response(req: GenRequest, rid: str, text: str, usage_obj: dict) -> dict:
    if req.chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "length",
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": "length"}
        obj = "text_completion"
    return {
        "id": rid,
        "object": obj,
        "created": int(time.time()),
        "model": req.model,
        "choices": [choice],
        "usage": usage_obj,
    }


def models_body(name: str) -> dict:
    return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "parlab"}]}


async def start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start ``app`` on ``host:port`` (0: a free port); return the runner and the port."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
    await site.start()
    server = site._server  # the asyncio Server: the port actually bound
    bound = server.sockets[0].getsockname()[1] if server and server.sockets else port
    return runner, int(bound)


async def sse_start(request: web.Request, headers: dict[str, str] | None = None):
    resp = web.StreamResponse(
        status=200,
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            **(headers or {}),
        },
    )
    await resp.prepare(request)
    return resp
