"""One request of ``parlab bench serve`` over HTTP (parlab's ``httpc`` client or aiohttp)
and the judging of its answer: both clients read the event stream through ``_Stream``."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from parlab.errors import UsageError
from parlab.serve.bench.config import BenchConfig
from parlab.serve.datasets import SampleRequest
from parlab.serve.httpc import HttpError
from parlab.serve.metrics import RequestOutcome

_JSON = {"Content-Type": "application/json"}


def _payload(cfg: BenchConfig, model: str, req: SampleRequest) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": req.output_len,
        "temperature": 0.0,
        "stream": cfg.stream,
    }
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    if cfg.stream:
        body["stream_options"] = {"include_usage": True}
    if cfg.api == "chat":
        body["messages"] = req.messages or [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    return body


def _chunk_text(data: dict[str, Any], chat: bool) -> str | None:
    choices = data.get("choices")
    if not choices:
        return None
    c = choices[0]
    if chat:
        return (c.get("delta") or {}).get("content") or ""
    return c.get("text") or ""


def _apply_usage(out: RequestOutcome, usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    if isinstance(usage.get("completion_tokens"), int):
        out.output_tokens = usage["completion_tokens"]
    if isinstance(usage.get("prompt_tokens"), int):
        out.prompt_len = usage["prompt_tokens"]
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        out.cached_tokens = details["cached_tokens"]


class _Stream:
    """The SSE reading both clients share, so both time and judge chunks the same way.

    ``feed(line)`` takes one line of the event stream as it arrives and returns True
    when reading should stop (``[DONE]`` or a failure); ``finish()`` settles the outcome.
    """

    __slots__ = ("chat", "chunks", "done", "ended", "last", "out", "st", "text", "usage_seen")

    def __init__(self, out: RequestOutcome, chat: bool, st: float) -> None:
        self.out, self.chat, self.st, self.last = out, chat, st, st
        self.chunks = 0
        self.text: list[str] = []
        self.usage_seen = False
        self.done = False
        self.ended = False

    def feed(self, raw: bytes) -> bool:
        line = raw.strip()
        if not line or line.startswith(b":") or not line.startswith(b"data:"):
            return False
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return True
        out = self.out
        try:
            data = json.loads(payload)
        except ValueError:
            out.error = f"malformed chunk: {payload[:80].decode(errors='replace')!r}"
            return True
        if not isinstance(data, dict):
            out.error = "malformed chunk: not a JSON object"
            return True
        if "error" in data:
            err = data["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            out.error = f"server error in stream: {msg}"
            return True
        choices = data.get("choices")
        if choices and isinstance(choices[0], dict) and choices[0].get("finish_reason"):
            self.ended = True
        t = _chunk_text(data, self.chat)
        if t:
            now = time.perf_counter()
            if self.chunks == 0:
                out.ttft = now - self.st
            else:
                out.itl.append(now - self.last)
            self.last = now
            self.chunks += 1
            self.text.append(t)
        if data.get("usage"):
            self.usage_seen = True
            _apply_usage(out, data["usage"])
        return False

    def finish(self) -> None:
        out = self.out
        if out.error:
            return
        if not (self.done or self.ended):
            out.error = "stream ended before [DONE]"
            return
        if self.chunks == 0:
            out.error = "stream had no text chunk"
            return
        out.latency = self.last - self.st
        out.generated_text = "".join(self.text)
        if not self.usage_seen:
            out.output_tokens = self.chunks
        out.success = True


def _full(out: RequestOutcome, data: Any, chat: bool, st: float) -> None:
    """A non-streaming answer."""
    out.latency = out.ttft = time.perf_counter() - st
    if not isinstance(data, dict):
        out.error = "malformed response: not a JSON object"
        return
    c = (data.get("choices") or [{}])[0]
    t = (c.get("message") or {}).get("content") if chat else c.get("text")
    if t is None:
        out.error = "malformed response: no choices"
        return
    out.generated_text = t
    out.output_tokens = 1 if t else 0  # the server's usage, below, gives the count
    _apply_usage(out, data.get("usage"))
    out.success = True


async def send_one(
    session: aiohttp.ClientSession,
    url: str,
    cfg: BenchConfig,
    model: str,
    req: SampleRequest,
    out: RequestOutcome,
    timeout: aiohttp.ClientTimeout | None = None,
) -> None:
    """Send one request through aiohttp and fill ``out``; never raises (except cancellation)."""
    chat = cfg.api == "chat"
    out.prompt_len = req.prompt_len
    st = time.perf_counter()
    out.start = st
    try:
        async with session.post(
            url,
            data=json.dumps(_payload(cfg, model, req)).encode(),
            headers=_JSON,
            timeout=timeout or aiohttp.ClientTimeout(total=cfg.request_timeout_s),
        ) as resp:
            out.replica = resp.headers.get("x-parlab-replica")
            if resp.status != 200:
                body = (await resp.text())[:200]
                out.error = f"HTTP {resp.status}: {' '.join(body.split())}"
                return
            if not cfg.stream:
                _full(out, await resp.json(content_type=None), chat, st)
                return
            ctype = resp.headers.get("Content-Type", "")
            if "text/event-stream" not in ctype:
                out.error = (
                    f"non-streaming response ({ctype or 'no content type'}) to a streaming request"
                )
                return
            sse = _Stream(out, chat, st)
            async for raw in resp.content:
                if sse.feed(raw):
                    break
            sse.finish()
    except asyncio.TimeoutError:
        out.error = f"timeout after {cfg.request_timeout_s:g} s"
    except aiohttp.ClientConnectorError as exc:
        out.error = f"cannot connect: {exc.os_error.strerror if exc.os_error else exc}"
    except (aiohttp.ClientError, ValueError, OSError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:200]


async def send_one_fast(
    client: Any,
    path: str,
    cfg: BenchConfig,
    model: str,
    req: SampleRequest,
    out: RequestOutcome,
) -> None:
    """Send one request through ``httpc.Client`` and fill ``out``; never raises (except
    cancellation). Same outcomes as ``send_one``."""
    chat = cfg.api == "chat"
    out.prompt_len = req.prompt_len
    # the clock starts before the body is built, as vLLM's (aiohttp serialises ``json=``
    # inside ``post``) and SGLang's clients start it: a request's TTFT includes its encoding
    st = time.perf_counter()
    body = json.dumps(_payload(cfg, model, req)).encode()
    out.start = st

    async def use(resp: Any) -> None:
        out.replica = resp.headers.get("x-parlab-replica")
        if resp.status != 200:
            text = (await resp.body())[:200].decode(errors="replace")
            out.error = f"HTTP {resp.status}: {' '.join(text.split())}"
            return
        if not cfg.stream:
            _full(out, json.loads(await resp.body()), chat, st)
            return
        ctype = resp.headers.get("content-type", "")
        if "text/event-stream" not in ctype:
            await resp.body()
            out.error = (
                f"non-streaming response ({ctype or 'no content type'}) to a streaming request"
            )
            return
        sse = _Stream(out, chat, st)
        buf = b""
        stop = False
        async for piece in resp.pieces():
            if stop:
                continue  # drain to the end so the connection can be reused
            buf += piece
            while not stop and b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                stop = sse.feed(line)
        if not stop and buf:
            sse.feed(buf)
        sse.finish()

    try:
        await client.post(path, body, use, cfg.request_timeout_s)
    except (asyncio.TimeoutError, TimeoutError):
        out.error = f"timeout after {cfg.request_timeout_s:g} s"
    except ConnectionRefusedError as exc:
        out.error = f"cannot connect: {exc.strerror}"
    except asyncio.IncompleteReadError:
        out.error = "stream cut: the connection closed mid-response"
    except (HttpError, ValueError, OSError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:200]


async def resolve_model(session: aiohttp.ClientSession, base: str) -> str:
    """The first model the server lists; ``UsageError`` if it answers without one (pass
    --model); ``unknown`` if it cannot be reached (every request then fails, and the run's
    document says why)."""
    why = ""
    try:
        async with session.get(base + "/v1/models", timeout=aiohttp.ClientTimeout(total=30)) as r:
            data = await r.json(content_type=None)
            if r.status == 200:
                return str(data["data"][0]["id"])
            why = f"HTTP {r.status}"
    except (aiohttp.ClientConnectionError, asyncio.TimeoutError, OSError):
        return "unknown"
    except (aiohttp.ClientError, ValueError, KeyError, IndexError) as exc:
        why = type(exc).__name__
    raise UsageError(f"cannot learn the model name from {base}/v1/models ({why}): pass --model")
