"""A model-free OpenAI-compatible endpoint with a timing model, for the load generator's and
the router's own overhead (every delay 0: a "trivial endpoint"), the router's failure
handling and cache-locality experiments where only the shape of the cost matters. It streams
``max_tokens`` one-character chunks and counts prompt tokens with parlab's tokenizer.

Timing model (each term 0 by default): a prefill of ``prefill_base_s + prefill_per_token_s *
uncached``, ``uncached`` being the prompt's tokens its own prefix cache (a ``BlockLRU`` of
16-token blocks) lacks, one prefill at a time (``serial_prefill``), then ``token_s`` between
chunks; ``usage.prompt_tokens_details.cached_tokens`` as vLLM reports it.
``serve_trivial``: a raw asyncio protocol answering every POST with the same canned stream,
for measuring the load generator itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
from dataclasses import dataclass

from aiohttp import web

from parlab.serve import protocol
from parlab.serve.prefix import DEFAULT_BLOCK, BlockLRU, block_hashes
from parlab.serve.tokenizer import get as get_tokenizer
from parlab.serve.tokenizer import render_chat


@dataclass(frozen=True, kw_only=True)
class StubConfig:
    """The stub's timing model."""

    name: str = "stub"
    """Model name it reports."""
    prefill_base_s: float = 0.0
    """Fixed cost of a prefill, seconds."""
    prefill_per_token_s: float = 0.0
    """Cost per uncached prompt token, seconds."""
    token_s: float = 0.0
    """Time between output tokens, seconds."""
    serial_prefill: bool = True
    """Prefills wait for each other (one accelerator)."""
    prefix_cache: bool = True
    """Keep a prefix cache (else every prompt token is uncached)."""
    cache_blocks: int = 4096
    """Prefix-cache capacity in blocks of 16 tokens."""


class StubServer(protocol.Site):
    """An in-process stub endpoint: ``await start()``, ``await stop()``."""

    def __init__(self, config: StubConfig | None = None) -> None:
        self.config = config or StubConfig()
        self.cache = BlockLRU(self.config.cache_blocks)
        self.tok = get_tokenizer()
        self._lock = asyncio.Lock()
        self._ids = itertools.count()
        self._dead = False
        self.served = 0

    def routes(self) -> list[web.RouteDef]:
        return [
            *protocol.api_routes(self._generate, self._models, self._model, self._health),
            web.post("/engine/reset", self._reset),
        ]

    async def stop(self, *, abort: bool = False) -> None:
        """Stop listening; ``abort``: cut in-flight streams as a crash would."""
        self._dead = abort
        await super().stop()

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _reset(self, request: web.Request) -> web.Response:
        self.cache.clear()
        return web.json_response({"reset": True})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(protocol.models_body(self.config.name))

    async def _model(self, request: web.Request) -> web.Response:
        if request.match_info["model_id"] != self.config.name:
            return protocol.error_response("no such model", status=404, param="model")
        return web.json_response(protocol.model_card(self.config.name))

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            req = protocol.parse_request(await protocol.read_json(request), chat=chat)
            if req.n != 1 or req.stop or len(req.prompts) > 1:
                raise protocol.BadRequest("the stub serves one prompt, n = 1, no stop strings")
        except protocol.BadRequest as exc:
            return protocol.bad_request_response(exc)
        cfg = self.config
        req = dataclasses.replace(req, model=cfg.name, max_tokens=req.max_tokens or 16)
        assert req.max_tokens is not None
        rid = f"cmpl-stub-{next(self._ids)}"
        text = render_chat(req.messages) if chat else req.prompts[0]
        ids = self.tok.encode(text) if isinstance(text, str) else list(text)
        hashes = block_hashes(ids, DEFAULT_BLOCK) if cfg.prefix_cache else []
        cached = self.cache.match(hashes) * DEFAULT_BLOCK if cfg.prefix_cache else 0
        n_prompt = len(ids)
        cached = min(cached, n_prompt)
        prefill = cfg.prefill_base_s + cfg.prefill_per_token_s * (n_prompt - cached)
        if prefill > 0:
            async with self._lock if cfg.serial_prefill else contextlib.nullcontext():
                await asyncio.sleep(prefill)
        if cfg.prefix_cache:
            self.cache.insert(hashes)
        use = protocol.usage(n_prompt, req.max_tokens, cached if cfg.prefix_cache else None)
        if not req.stream:
            if cfg.token_s > 0:
                await asyncio.sleep(cfg.token_s * (req.max_tokens - 1))
            self.served += 1
            return web.json_response(
                protocol.full_response(req, rid, [("x" * req.max_tokens, "length")], use)
            )
        resp = await protocol.sse_start(request)
        for i in range(req.max_tokens):
            if i and cfg.token_s > 0:
                await asyncio.sleep(cfg.token_s)
            if self._dead:
                if request.transport is not None:
                    request.transport.abort()
                return resp
            last = i == req.max_tokens - 1
            await resp.write(
                protocol.chunk(req, rid, "x", role=i == 0, finish_reason="length" if last else None)
            )
        if req.include_usage:
            await resp.write(protocol.chunk(req, rid, "", usage_obj=use))
        await resp.write(protocol.DONE)
        self.served += 1
        return resp


async def serve_forever(
    config: StubConfig, *, host: str, port: int, duration_s: float | None
) -> None:
    """Run a stub until Ctrl-C or ``duration_s``; print its URL first (flushed)."""
    await protocol.serve_until(StubServer(config), host, port, duration_s)


class _TrivialProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive, one request at a time per connection, canned answers."""

    def __init__(self, stream_body: bytes, models_body: bytes) -> None:
        self.buf = b""
        self.stream_body = stream_body
        self.models_body = models_body
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v)
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            assert self.transport is not None
            method_path = head.split(" ", 2)
            if method_path[0] == "POST":
                self.transport.write(self.stream_body)
            elif method_path[1] in ("/v1/models", "/health"):
                self.transport.write(self.models_body)
            else:
                self.transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")


def trivial_responses(output_len: int, name: str = "trivial") -> tuple[bytes, bytes]:
    """The canned streaming answer (``output_len`` one-character chunks, usage, [DONE]) and
    the ``/v1/models`` answer, as complete HTTP/1.1 responses."""
    req = protocol.GenRequest(
        prompts=("",), messages=(), max_tokens=output_len, stream=True, chat=False, model=name,
        include_usage=True,
    )  # fmt: skip
    events = [
        protocol.chunk(
            req, "cmpl-trivial", "x", finish_reason="length" if i == output_len - 1 else None
        )
        for i in range(output_len)
    ]
    events.append(
        protocol.chunk(req, "cmpl-trivial", "", usage_obj={"completion_tokens": output_len})
    )
    events.append(protocol.DONE)
    body = b"".join(f"{len(e):x}\r\n".encode() + e + b"\r\n" for e in events) + b"0\r\n\r\n"
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    models = json.dumps(protocol.models_body(name)).encode()
    mhead = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
    return head + body, mhead + str(len(models)).encode() + b"\r\n\r\n" + models


async def serve_trivial(*, host: str, port: int, output_len: int, duration_s: float | None) -> None:
    """A trivial endpoint: every POST gets the same canned stream (no parsing of the body,
    no model, no timing model) -- what the load generator's own capacity is measured against."""
    stream_body, models_body = trivial_responses(output_len)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _TrivialProtocol(stream_body, models_body), host, port, backlog=1024
    )
    bound = server.sockets[0].getsockname()[1]
    print(f"parlab replica listening on http://{host}:{bound}", flush=True)
    try:
        async with server:
            if duration_s is None:
                await asyncio.Event().wait()
            else:
                await asyncio.sleep(duration_s)
    finally:
        server.close()
