"""The replica's small endpoints, a mixin of ``ReplicaServer`` (``replica.py``): ``GET
/health``, ``/v1/models`` and ``/v1/models/{id}`` (vLLM's ``root`` and ``max_model_len``),
``/version`` (vLLM's, with ``engine``), ``POST /tokenize`` and ``/detokenize`` (vLLM's), ``GET
/engine/stats``, ``GET /engine/log`` (every step: kind, batch, tokens, seconds, the serving
loop's ``wall`` and ``gap``), ``POST /engine/profile`` (``profiling.profile_engine``) and
``POST /engine/reset`` (the prefix cache and the log emptied), the last two when idle."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any

from aiohttp import web

from parlab import __version__
from parlab.serve import protocol
from parlab.serve.engine import Engine, Sequence
from parlab.serve.profiling import profile_engine
from parlab.serve.protocol import BadRequest
from parlab.serve.tokenizer import render_chat


class ReplicaEndpoints:
    """Everything but generation; the state it reads is ``ReplicaServer``'s."""

    engine: Engine
    name: str
    tok: Any
    stall_s: float
    served: int
    cancelled: int
    timed_out: int
    step_errors: int
    _pending: list[Sequence]
    _open: dict[str, float]
    _step_started: float | None
    _last_step_end: float
    _task: asyncio.Task[None] | None
    _exec: concurrent.futures.ThreadPoolExecutor

    def health(self) -> tuple[int, dict[str, Any]]:
        """The health check's status and body (see the module docstring)."""
        now = time.monotonic()
        oldest = min(self._open.values(), default=None)
        body: dict[str, Any] = {
            "status": "ok",
            "outstanding": len(self._open),
            "oldest_request_s": None if oldest is None else now - oldest,
            "step_running_s": None if self._step_started is None else now - self._step_started,
            "step_errors": self.step_errors,
        }
        waiting = self.engine.has_work() or bool(self._pending)
        if self._task is None or self._task.done():
            body["status"] = "dead"
        elif (self._step_started is not None and now - self._step_started > self.stall_s) or (
            self._step_started is None and waiting and now - self._last_step_end > self.stall_s
        ):
            body["status"] = "stalled"
        return (200 if body["status"] == "ok" else 503), body

    async def _health(self, request: web.Request) -> web.Response:
        status, body = self.health()
        return web.json_response(body, status=status)

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"engine": "parlab", "version": __version__})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            protocol.models_body(self.name, max_model_len=self.engine.config.max_len)
        )

    async def _model(self, request: web.Request) -> web.Response:
        mid = request.match_info["model_id"]
        if mid != self.name:
            return self._no_model(mid)
        return web.json_response(
            protocol.model_card(self.name, max_model_len=self.engine.config.max_len)
        )

    def _no_model(self, mid: str) -> web.Response:
        return protocol.error_response(
            f"the model {mid!r} does not exist here: this replica serves {self.name!r}",
            status=404,
            kind="not_found_error",
            param="model",
        )

    async def _tokenize(self, request: web.Request) -> web.Response:
        try:
            body = await protocol.read_json(request)
            if not isinstance(body, dict) or not (
                isinstance(body.get("prompt"), str) or isinstance(body.get("messages"), list)
            ):
                raise BadRequest("give 'prompt' (a string) or 'messages'", param="prompt")
            if "messages" in body:
                text = render_chat(protocol.parse_request(body, chat=True).messages)
            else:
                text = body["prompt"]
        except BadRequest as exc:
            return protocol.bad_request_response(exc)
        ids = self.tok.encode(text)
        cap = self.engine.config.max_len
        return web.json_response({"count": len(ids), "max_model_len": cap, "tokens": ids})

    async def _detokenize(self, request: web.Request) -> web.Response:
        try:
            body = await protocol.read_json(request)
            ids = body.get("tokens") if isinstance(body, dict) else None
            if not isinstance(ids, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < self.tok.vocab_size
                for i in ids
            ):
                raise BadRequest("'tokens' must be a list of token ids", param="tokens")
        except BadRequest as exc:
            return protocol.bad_request_response(exc)
        return web.json_response({"prompt": self.tok.decode(ids)})

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def _log(self, request: web.Request) -> web.Response:
        return web.json_response(self.engine.log[-100_000:])

    def stats(self) -> dict[str, Any]:
        log = self.engine.log
        out: dict[str, Any] = {
            "served": self.served,
            "cancelled": self.cancelled,
            "timed_out": self.timed_out,
            "step_errors": self.step_errors,
            "prefix_cache_hit_pages": self.engine.sched.pool.hits,
        }
        for kind, label in ((0, "prefill"), (1, "decode")):
            xs = [e for e in log if e["kind"] == kind]
            out[f"{label}_iterations"] = len(xs)
            out[f"{label}_mean_s"] = sum(e["s"] for e in xs) / len(xs) if xs else None
            out[f"{label}_mean_batch"] = sum(e["batch"] for e in xs) / len(xs) if xs else None
        return out

    def _busy(self) -> bool:
        return self.engine.has_work() or bool(self._pending) or self._step_started is not None

    async def _profile(self, request: web.Request) -> web.Response:
        if self._busy():
            return protocol.error_response("the replica is busy: profile it idle", status=409)
        loop = asyncio.get_running_loop()
        return web.json_response(
            await loop.run_in_executor(self._exec, profile_engine, self.engine)
        )

    async def _reset(self, request: web.Request) -> web.Response:
        """Empty the prefix cache and the step log (between experiments)."""
        if self._busy():
            return protocol.error_response("the replica is busy: reset it idle", status=409)
        self.engine.reset_cache()
        return web.json_response({"reset": True})
