"""``parlab serve replica``: the reference replica, an OpenAI-compatible server over ``Engine``.

One asyncio loop serves HTTP; one worker thread runs the engine's steps (``Engine.step``).
New requests reach the engine between steps; each choice's tokens come back through its
request's queue and leave as SSE chunks (``protocol/``), then a usage chunk
(``prompt_tokens_details.cached_tokens`` from the prefix cache) and ``[DONE]``. A client that
disconnects cancels its request.

Reliability: ``protocol.parse_request`` and ``choices.prompt_ids`` reject what the engine
cannot take (4xx naming the field; 413 past ``protocol.MAX_BODY_BYTES``); a step that raises
fails the requests it held (500 / an error chunk) and the loop goes on (``step_errors``);
every request has a deadline (``request_timeout_s``: 504 / an error chunk); ``GET /health``
is 503 ``dead`` once the loop task ended and ``stalled`` when a step has run, or work has
waited for one, longer than ``stall_s``. The small endpoints (models, version, tokenize,
stats, step log, profile, reset) are ``replica_endpoints.py``'s. Listens on 127.0.0.1 unless
given another host.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import sys
import time
import traceback
from typing import Any

import torch
from aiohttp import web

from parlab.errors import UsageError
from parlab.models import get_spec
from parlab.models.reference import build_model
from parlab.serve import protocol
from parlab.serve.choices import Choice, prompt_ids
from parlab.serve.engine import Engine, EngineConfig, Sequence
from parlab.serve.protocol import BadRequest
from parlab.serve.replica_endpoints import ReplicaEndpoints
from parlab.serve.tokenizer import get as get_tokenizer

DTYPES = ("float32", "bfloat16", "float16")


def serving_spec(name: str) -> Any:
    """The catalog model ``name`` with a vocabulary that holds parlab's tokenizer (a
    smaller vocabulary, as ``tiny``'s 256, is widened to it)."""
    spec = get_spec(name)
    vocab = get_tokenizer().vocab_size
    return dataclasses.replace(spec, vocab_size=vocab) if spec.vocab_size < vocab else spec


def build_engine(
    model: str = "tiny",
    *,
    device: str = "cpu",
    dtype: str = "float32",
    seed: int = 0,
    config: EngineConfig | None = None,
) -> Engine:
    """The reference model ``model`` with random weights (seeded) in an ``Engine``."""
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {device}: no GPU here; use --device cpu")
    m = build_model(serving_spec(model), device=device, dtype=getattr(torch, dtype), seed=seed)
    return Engine(m, config)


class ReplicaServer(ReplicaEndpoints, protocol.Site):
    """HTTP front of one engine: ``await start()``, ``await stop()``; its small endpoints are
    ``ReplicaEndpoints``'s (``replica_endpoints.py``)."""

    def __init__(
        self,
        engine: Engine,
        *,
        name: str = "parlab-tiny",
        heartbeat_s: float | None = None,
        request_timeout_s: float = 300.0,
        stall_s: float = 1.0,
    ) -> None:
        """``heartbeat_s``: when idle, run an empty step this often (tensor-parallel engines:
        keeps the other ranks in step)."""
        self.engine = engine
        self.name = name
        self.heartbeat_s = heartbeat_s
        self.request_timeout_s = request_timeout_s
        self.stall_s = stall_s
        self.tok = engine.tokenizer
        self._ids = itertools.count()
        self._pending: list[Sequence] = []
        self._wake = asyncio.Event()
        self._exec = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="engine")
        self._task: asyncio.Task[None] | None = None
        self._step_started: float | None = None
        self._last_step_end = time.monotonic()
        self._open: dict[str, float] = {}
        self.served = 0
        self.cancelled = 0
        self.timed_out = 0
        self.step_errors = 0
        self.last_error = ""

    def routes(self) -> list[web.RouteDef]:
        return [
            *protocol.api_routes(self._generate, self._models, self._model, self._health),
            web.get("/version", self._version),
            web.post("/tokenize", self._tokenize),
            web.post("/detokenize", self._detokenize),
            web.get("/engine/stats", self._stats),
            web.get("/engine/log", self._log),
            web.post("/engine/profile", self._profile),
            web.post("/engine/reset", self._reset),
        ]

    async def start(self, host: str = protocol.LOOPBACK, port: int = 0) -> int:
        self._task = asyncio.create_task(self._loop())
        return await super().start(host, port)

    async def stop(self) -> None:
        await super().stop()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._exec.shutdown(wait=True, cancel_futures=True)

    # -- the engine loop ---------------------------------------------------------------------
    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        eng = self.engine
        prev_end: float | None = None
        while True:
            for s in self._pending:
                eng.submit(s)
            self._pending.clear()
            if not eng.has_work():
                prev_end = None
                self._wake.clear()
                if self.heartbeat_s is None:
                    await self._wake.wait()
                    continue
                try:
                    await asyncio.wait_for(self._wake.wait(), self.heartbeat_s)
                    continue
                except asyncio.TimeoutError:
                    pass  # an empty step: the other ranks take part in it
            t0 = time.perf_counter()
            self._step_started = time.monotonic()
            n_log = len(eng.log)
            try:
                emitted = await loop.run_in_executor(self._exec, eng.step)
            except Exception as exc:  # one request must not take the replica down
                self._failed_step(exc)
                continue
            finally:
                self._step_started = None
                self._last_step_end = time.monotonic()
            t1 = time.perf_counter()
            if len(eng.log) > n_log:
                # as the serving loop sees it: the step including the hand-offs to and from
                # the engine thread, and the time since the previous one while busy
                eng.log[-1]["wall"] = t1 - t0
                eng.log[-1]["gap"] = 0.0 if prev_end is None else t0 - prev_end
            prev_end = t1
            for s in emitted:
                if s.sink is not None:
                    queue, index = s.sink
                    queue.put_nowait((index, s.output[-1], s.finish_reason))
            if emitted:
                # let the woken handlers write their chunks before the next step takes the
                # GIL-heavy engine thread: tokens leave as soon as they exist
                await asyncio.sleep(0)

    def _failed_step(self, exc: Exception) -> None:
        self.step_errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]
        print(f"parlab replica: a step failed: {self.last_error}", file=sys.stderr, flush=True)
        traceback.print_exc(file=sys.stderr)
        for s in self.engine.fail_step():
            if s.sink is not None:
                queue, index = s.sink
                queue.put_nowait((index, None, "error"))

    # -- generation --------------------------------------------------------------------------
    def _sequences(self, req: protocol.GenRequest) -> tuple[list[Sequence], list[list[int]]]:
        cfg = self.engine.config
        vocab = self.engine.model.spec.vocab_size
        prompts = prompt_ids(req, self.tok, vocab=vocab, max_len=cfg.max_len)
        seqs = [
            Sequence(
                prompt=p,
                max_tokens=req.max_tokens or cfg.max_len - len(p),
                temperature=req.temperature,
                top_p=req.top_p,
                seed=None if req.seed is None else req.seed + j,
                ignore_eos=req.ignore_eos,
            )
            for p in prompts
            for j in range(req.n)
        ]
        return seqs, prompts

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            req = protocol.parse_request(await protocol.read_json(request), chat=chat)
            if req.model is not None and req.model != self.name:
                return self._no_model(req.model)
            seqs, prompts = self._sequences(req)
        except BadRequest as exc:
            return protocol.bad_request_response(exc)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-parlab-{next(self._ids)}"
        req = dataclasses.replace(req, model=self.name)
        queue: asyncio.Queue[tuple[int, int | None, str | None]] = asyncio.Queue()
        for i, s in enumerate(seqs):
            s.sink = (queue, i)
        self._pending.extend(seqs)
        self._wake.set()
        self._open[rid] = time.monotonic()
        try:
            return await self._respond(request, req, rid, seqs, prompts, queue)
        except (asyncio.CancelledError, ConnectionError):
            self.cancelled += 1
            raise
        finally:
            del self._open[rid]
            for s in seqs:
                if not s.finished:
                    self.engine.cancel(s)

    async def _respond(
        self,
        request: web.Request,
        req: protocol.GenRequest,
        rid: str,
        seqs: list[Sequence],
        prompts: list[list[int]],
        queue: asyncio.Queue,
    ) -> web.StreamResponse:
        choices = [Choice(stop=req.stop) for _ in seqs]
        deadline = time.monotonic() + self.request_timeout_s
        resp = await protocol.sse_start(request) if req.stream else None
        created = int(time.time())
        open_ = len(seqs)
        while open_:
            try:
                index, token, reason = await asyncio.wait_for(
                    queue.get(), max(0.0, deadline - time.monotonic())
                )
            except asyncio.TimeoutError:
                self.timed_out += 1
                return await self._fail(resp, "the request passed its deadline", 504)
            ch = choices[index]
            if ch.finish_reason is not None:
                continue  # a choice a stop string ended, before its cancel took effect
            if token is None:
                return await self._fail(resp, f"the engine step failed: {self.last_error}", 500)
            text = ch.add(self.tok.piece(token), reason)
            if ch.finish_reason is not None:
                open_ -= 1
                if not seqs[index].finished:
                    self.engine.cancel(seqs[index])  # a stop string ended it
            if resp is not None and (text or ch.finish_reason is not None):
                first = req.chat and not ch.started
                ch.started = True
                fin = ch.finish_reason
                event = protocol.chunk(
                    req, rid, text, index=index, role=first, finish_reason=fin, created=created
                )
                await resp.write(event)
        cached = sum(seqs[i * req.n].cached_tokens for i in range(len(prompts)))
        use = protocol.usage(sum(map(len, prompts)), sum(c.tokens for c in choices), cached)
        self.served += 1
        if resp is None:
            body = protocol.full_response(
                req, rid, [(c.text, c.finish_reason or "length") for c in choices], use
            )
            return web.json_response(body)
        if req.include_usage:
            await resp.write(protocol.chunk(req, rid, "", usage_obj=use, created=created))
        await resp.write(protocol.DONE)
        return resp

    async def _fail(
        self, resp: web.StreamResponse | None, message: str, status: int
    ) -> web.StreamResponse:
        kind = "timeout" if status == 504 else "internal_error"
        if resp is None:
            return protocol.error_response(message, status=status, kind=kind)
        await resp.write(protocol.error_chunk(message, kind=kind, code=status))
        return resp


async def serve_forever(
    engine: Engine,
    *,
    host: str,
    port: int,
    name: str,
    duration_s: float | None,
    request_timeout_s: float = 300.0,
) -> None:
    """Run a replica until Ctrl-C or ``duration_s``; print its URL first (flushed)."""
    server = ReplicaServer(engine, name=name, request_timeout_s=request_timeout_s)
    await protocol.serve_until(server, host, port, duration_s)
