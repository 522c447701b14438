"""``parlab serve replica``: the reference replica, an OpenAI-compatible server over ``Engine``.

One asyncio loop serves HTTP; one worker thread runs the engine's
iterations (``Engine.step``) so streaming never waits on a forward pass.
New requests are handed to the engine between iterations (never while one
runs); each request's tokens come back through its own queue and are
streamed as SSE chunks (``protocol.py``), one token a chunk, then a usage
chunk (``prompt_tokens_details.cached_tokens`` from the prefix cache) and
``[DONE]``. A client that disconnects cancels its request.

Extra endpoints: ``POST /engine/reset`` (empty the prefix cache, when idle),
``GET /engine/log`` (every iteration: kind, batch, tokens, compute seconds,
its wall time as the serving loop sees it, and the gap since the previous one
while busy -- the serving loop's own overhead),
``GET /engine/stats`` (iterations run, by kind, with their
mean time; requests served; prefix-cache hits) and ``POST /engine/profile``
(the short prefill/decode profile that feeds the simulator; only while idle).
Listens on 127.0.0.1 unless given another host.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import time
from typing import Any

from aiohttp import web

from parlab.errors import UsageError
from parlab.serve import protocol
from parlab.serve.engine import Engine, EngineConfig, Sequence, decode, encode


def build_engine(
    model: str = "tiny",
    *,
    device: str = "cpu",
    dtype: str = "float32",
    seed: int = 0,
    config: EngineConfig | None = None,
) -> Engine:
    """The reference model ``model`` with random weights (seeded) in an ``Engine``."""
    import torch

    from parlab.models import get_spec
    from parlab.models.reference import build_model

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in dtypes:
        raise UsageError(f"--dtype {dtype!r} is not one of {', '.join(dtypes)}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {device}: no GPU here; use --device cpu")
    spec = get_spec(model)
    return Engine(build_model(spec, device=device, dtype=dtypes[dtype], seed=seed), config)


class ReplicaServer:
    """HTTP front of one engine: ``await start()``, ``await stop()``."""

    def __init__(
        self, engine: Engine, *, name: str = "parlab-tiny", heartbeat_s: float | None = None
    ) -> None:
        """``heartbeat_s``: when idle, run an empty iteration this often (tensor-parallel
        engines: keeps the other ranks in step)."""
        self.engine = engine
        self.name = name
        self.heartbeat_s = heartbeat_s
        self._ids = itertools.count()
        self._pending: list[Sequence] = []
        self._wake = asyncio.Event()
        self._busy = False
        self._exec = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="engine")
        self._task: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.served = 0
        self.cancelled = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/engine/stats", self._stats)
        app.router.add_get("/engine/log", self._log)
        app.router.add_post("/engine/profile", self._profile)
        app.router.add_post("/engine/reset", self._reset)
        return app

    async def start(self, host: str = protocol.LOOPBACK, port: int = 0) -> int:
        self._task = asyncio.create_task(self._loop())
        self._runner, self.port = await protocol.start_site(self.app(), host, port)
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._exec.shutdown(wait=True, cancel_futures=True)

    @property
    def url(self) -> str:
        return f"http://{protocol.LOOPBACK}:{self.port}"

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
                    pass  # an empty iteration: the other ranks take part in it
            self._busy = True
            t0 = time.perf_counter()
            n_log = len(eng.log)
            try:
                emitted = await loop.run_in_executor(self._exec, eng.step)
            finally:
                self._busy = False
            t1 = time.perf_counter()
            if len(eng.log) > n_log:
                # as the serving loop sees it: the iteration including the hand-offs to and
                # from the engine thread, and the time since the previous one while busy
                eng.log[-1]["wall"] = t1 - t0
                eng.log[-1]["gap"] = 0.0 if prev_end is None else t0 - prev_end
            prev_end = t1
            for s in emitted:
                if s.sink is not None:
                    s.sink.put_nowait(s.output[-1])
                    if s.finished:
                        s.sink.put_nowait(None)
            if emitted:
                # let the woken handlers write their chunks before the next iteration takes
                # the GIL-heavy engine thread: tokens leave as soon as they exist
                await asyncio.sleep(0)

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(protocol.models_body(self.name))

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def _log(self, request: web.Request) -> web.Response:
        return web.json_response(self.engine.log[-100_000:])

    def stats(self) -> dict[str, Any]:
        log = self.engine.log
        out: dict[str, Any] = {"served": self.served, "cancelled": self.cancelled}
        for kind, label in ((0, "prefill"), (1, "decode")):
            xs = [e for e in log if e["kind"] == kind]
            out[f"{label}_iterations"] = len(xs)
            out[f"{label}_mean_s"] = sum(e["s"] for e in xs) / len(xs) if xs else None
            out[f"{label}_mean_batch"] = sum(e["batch"] for e in xs) / len(xs) if xs else None
        return out

    async def _profile(self, request: web.Request) -> web.Response:
        if self.engine.has_work() or self._pending or self._busy:
            return protocol.error_response("the replica is busy: profile it idle", status=409)
        loop = asyncio.get_running_loop()
        prof = await loop.run_in_executor(self._exec, self.engine.profile)
        return web.json_response(prof)

    async def _reset(self, request: web.Request) -> web.Response:
        """Empty the prefix cache and the iteration log (between experiments)."""
        if self.engine.has_work() or self._pending or self._busy:
            return protocol.error_response("the replica is busy: reset it idle", status=409)
        self.engine.prefix.clear()
        self.engine.log.clear()
        return web.json_response({"reset": True})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            req = protocol.parse_request(await request.json(), chat=chat, default_model=self.name)
            seq = Sequence(
                prompt=encode(req.prompt),
                max_tokens=req.max_tokens,
                temperature=req.temperature,
                seed=req.seed,
            )
            if not seq.prompt:
                raise UsageError("empty prompt: give at least one character")
            cfg = self.engine.config
            if len(seq.prompt) + seq.max_tokens > cfg.max_len:
                raise UsageError(
                    f"prompt ({len(seq.prompt)} tokens) + max_tokens ({seq.max_tokens}) "
                    f"exceeds the replica's max length {cfg.max_len}"
                )
        except ValueError as exc:
            return protocol.error_response(str(exc))
        rid = f"cmpl-parlab-{next(self._ids)}"
        queue: asyncio.Queue[int | None] = asyncio.Queue()
        seq.sink = queue
        self._pending.append(seq)
        self._wake.set()
        resp: web.StreamResponse | None = None
        try:
            if req.stream:
                resp = await protocol.sse_start(request)
            pieces: list[str] = []
            n = 0
            while True:
                tok = await queue.get()
                if tok is None:
                    break
                n += 1
                text = decode([tok])
                if resp is not None:
                    last = n == req.max_tokens
                    await resp.write(
                        protocol.chunk(req, rid, text, finish_reason="length" if last else None)
                    )
                else:
                    pieces.append(text)
            use = protocol.usage(len(seq.prompt), n, seq.cached_tokens)
            self.served += 1
            if resp is None:
                return web.json_response(protocol.full_response(req, rid, "".join(pieces), use))
            if req.include_usage:
                await resp.write(protocol.chunk(req, rid, "", usage_obj=use))
            await resp.write(protocol.DONE)
            return resp
        except (asyncio.CancelledError, ConnectionError):
            self.engine.cancel(seq)
            self.cancelled += 1
            raise


async def serve_forever(
    engine: Engine, *, host: str, port: int, name: str, duration_s: float | None
) -> None:
    """Run a replica until Ctrl-C or ``duration_s``; print its URL first (flushed)."""
    server = ReplicaServer(engine, name=name)
    bound = await server.start(host, port)
    print(f"parlab replica listening on http://{host}:{bound}", flush=True)
    try:
        if duration_s is None:
            await asyncio.Event().wait()
        else:
            await asyncio.sleep(duration_s)
    finally:
        await server.stop()
