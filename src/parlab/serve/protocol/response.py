"""The OpenAI-compatible answers: JSON errors, stream chunks, the non-streaming body, the
model list, and the aiohttp plumbing (the JSON body read, the server, the event stream)."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from typing import Any

from aiohttp import web

from parlab.serve.protocol.request import LOOPBACK, MAX_BODY_BYTES, BadRequest, GenRequest


async def read_body(request: web.Request) -> bytes:
    """The request's body; ``BadRequest`` (413) for one over ``MAX_BODY_BYTES``."""
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        limit = MAX_BODY_BYTES // 2**20
        raise BadRequest(f"the body is over the {limit} MiB limit", status=413) from None


async def read_json(request: web.Request) -> Any:
    """The request's JSON body; ``BadRequest`` for a body over ``MAX_BODY_BYTES`` (413) or
    one that is not JSON (400)."""
    raw = await read_body(request)
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}"[:200]) from None


def error_body(
    message: str, *, kind: str = "invalid_request_error", code: int = 400, param: str | None = None
) -> dict:
    return {"error": {"message": message, "type": kind, "code": code, "param": param}}


def error_chunk(message: str, *, kind: str, code: int) -> bytes:
    """An error after the stream began: one ``data: {"error": ...}`` event (the stream then
    ends without ``[DONE]``)."""
    return b"data: " + json.dumps(error_body(message, kind=kind, code=code)).encode() + b"\n\n"


def error_response(
    message: str,
    *,
    status: int = 400,
    kind: str = "invalid_request_error",
    param: str | None = None,
) -> web.Response:
    return web.json_response(
        error_body(message, kind=kind, code=status, param=param), status=status
    )


def bad_request_response(exc: BadRequest) -> web.Response:
    kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
    return error_response(str(exc), status=exc.status, kind=kind, param=exc.param)


@web.middleware
async def json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Unknown paths and methods answer JSON errors (404/405) naming what was asked."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return error_response(f"no such path {request.path!r}", status=404, kind="not_found_error")
    except web.HTTPMethodNotAllowed as exc:
        return error_response(
            f"{request.method} is not allowed on {request.path}: use {', '.join(exc.allowed_methods)}",
            status=405,
        )


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
    index: int = 0,
    role: bool = False,
    finish_reason: str | None = None,
    usage_obj: dict | None = None,
    created: int | None = None,
) -> bytes:
    """One SSE event of choice ``index``; ``role``: the chat choice's first delta (it carries
    ``"role": "assistant"``); ``usage_obj``: the final usage chunk (no choices)."""
    if req.chat:
        delta: dict[str, Any] = {"role": "assistant"} if role else {}
        if text or role:
            delta["content"] = text
        choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text, "finish_reason": finish_reason}
        obj = "text_completion"
    data: dict[str, Any] = {
        "id": rid,
        "object": obj,
        "created": created or int(time.time()),
        "model": req.model,
        "choices": [] if usage_obj is not None else [choice],
    }
    if usage_obj is not None:
        data["usage"] = usage_obj
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def full_response(
    req: GenRequest, rid: str, choices: list[tuple[str, str]], usage_obj: dict
) -> dict:
    """The non-streaming answer: ``choices`` as ``(text, finish_reason)`` in index order."""
    out = []
    for i, (text, reason) in enumerate(choices):
        body = {"message": {"role": "assistant", "content": text}} if req.chat else {"text": text}
        out.append({"index": i, **body, "finish_reason": reason, "logprobs": None})
    return {
        "id": rid,
        "object": "chat.completion" if req.chat else "text_completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": out,
        "usage": usage_obj,
    }


def model_card(name: str, *, max_model_len: int | None = None, root: str | None = None) -> dict:
    """One ``/v1/models`` entry, with vLLM's ``root`` and ``max_model_len``."""
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "parlab",
        "root": root or name,
        "parent": None,
        "max_model_len": max_model_len,
    }


def models_body(name: str, *, max_model_len: int | None = None) -> dict:
    return {"object": "list", "data": [model_card(name, max_model_len=max_model_len)]}


async def start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start ``app`` on ``host:port`` (0: a free port); return the runner and the port."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
    await site.start()
    server = site._server  # the asyncio Server: the port actually bound
    bound = server.sockets[0].getsockname()[1] if server and server.sockets else port
    return runner, int(bound)


def api_routes(generate: Any, models: Any, model: Any, health: Any) -> list[web.RouteDef]:
    """The OpenAI-compatible routes: ``generate(request, chat=...)`` serves both generation
    endpoints, ``models`` the list, ``model`` one entry, ``health`` ``GET /health``."""
    return [
        web.post("/v1/completions", functools.partial(generate, chat=False)),
        web.post("/v1/chat/completions", functools.partial(generate, chat=True)),
        web.get("/v1/models", models),
        web.get("/v1/models/{model_id:.+}", model),
        web.get("/health", health),
    ]


class Site:
    """An HTTP server answering ``routes()`` (unknown paths: JSON errors): ``await
    start(host, port)`` (0: a free port) and ``await stop()``."""

    port = 0
    _runner: web.AppRunner | None = None

    def routes(self) -> list[web.RouteDef]:
        raise NotImplementedError

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[json_errors])
        app.add_routes(self.routes())
        return app

    async def start(self, host: str = LOOPBACK, port: int = 0) -> int:
        self._runner, self.port = await start_site(self.app(), host, port)
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"


async def serve_until(
    server: Site, host: str, port: int, duration_s: float | None, what: str = "replica"
) -> None:
    """Run ``server`` until Ctrl-C or ``duration_s``; print its URL first (flushed): ``parlab
    <what> listening on <url>``, the line a launcher waits for."""
    bound = await server.start(host, port)
    print(f"parlab {what} listening on http://{host}:{bound}", flush=True)
    try:
        await (asyncio.Event().wait() if duration_s is None else asyncio.sleep(duration_s))
    finally:
        await server.stop()


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
