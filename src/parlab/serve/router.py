"""``parlab serve router``: an HTTP proxy in front of N OpenAI-compatible replicas.

Per request: the prompt cut into 16-character blocks (``prefix.block_hashes``), a live
replica picked by the policy (``policy.py``), the body forwarded unchanged over a keep-alive
connection (``httpc.py``) and the replica's bytes streamed back with an
``x-parlab-replica`` header. Each request ends exactly once:
- connection refused: the replica is taken out, the request goes to another (``retried``);
- the replica dies mid-stream, or its health checks take it out while the request is in
  flight there: an ``error`` chunk ends the stream without ``[DONE]`` (``failed``);
- 4xx is the client's fault (``client_errors``, relayed as it is); 5xx counts in ``failed``;
  a client that disconnects counts as ``client_gone``; no live replica: 503.

Health checks (``GET /health`` every ``health_interval_s``; a miss is a status but 200 or no
answer within ``health_timeout_s``) take a replica out after ``health_failures`` misses in a
row and put it back, its prefix tree empty, on the first success; a completed request resets
the count. Replicas can join a running router (``POST /router/replicas``, ``{"url", ...}``).
``GET /router/stats``: per replica its load, requests routed, completed and failed, prompt
tokens and estimated cached tokens (the router's approximate prefix tree of it, under any
policy), and the routing overhead's percentiles. Listens on 127.0.0.1 unless given another
host; every upstream request has a timeout.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import aiohttp
from aiohttp import web

from parlab.errors import UsageError
from parlab.serve import httpc, protocol
from parlab.serve.bench.config import check_target
from parlab.serve.policy import PolicyConfig, PolicyState
from parlab.serve.prefix import DEFAULT_BLOCK, block_hashes
from parlab.serve.router_relay import ClientGone, Relay
from parlab.serve.router_stats import ReplicaStats, count_status, stats_body


@dataclass(frozen=True, kw_only=True)
class RouterConfig:
    """The router's knobs."""

    replicas: tuple[str, ...]
    """Base URLs of the replicas (``http://127.0.0.1:8001``, ...); more can join later
    (``POST /router/replicas``)."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """Routing policy and its thresholds."""
    health_interval_s: float = 0.5
    """Seconds between health checks of each replica."""
    health_failures: int = 2
    """Missed health checks in a row before a replica is taken out."""
    health_timeout_s: float = 1.0
    """A health check slower than this is a miss."""
    request_timeout_s: float = 300.0
    """Longest a forwarded request may take (its deadline)."""
    allow_remote: bool = False
    """Allow replicas on non-loopback addresses."""

    def __post_init__(self) -> None:
        for u in self.replicas:
            check_target(u, allow_remote=self.allow_remote)
        if self.health_interval_s <= 0 or self.health_failures < 1:
            raise UsageError("--health-interval must be positive and --health-failures >= 1")
        if self.health_timeout_s <= 0 or self.request_timeout_s <= 0:
            raise UsageError("--health-timeout and --request-timeout must be positive seconds")


def _replica_client(url: str) -> httpc.Client:
    """The keep-alive client the router forwards to the replica at ``url`` through."""
    u = urlparse(url)
    return httpc.Client(u.hostname or "127.0.0.1", u.port or 80, max_connections=1024)


class Router(protocol.Site):
    """The proxy: ``await start(host, port)``, ``await stop()``, ``stats()``."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.state = PolicyState(len(config.replicas), config.policy)
        self.replicas = [ReplicaStats(url=u.rstrip("/")) for u in config.replicas]
        self.decision_s: list[float] = []
        self.forward_s: list[float] = []
        self.no_replica = 0
        self._session: aiohttp.ClientSession | None = None
        self._clients: list[httpc.Client] = []
        self._health_task: asyncio.Task[None] | None = None
        self._inflight: list[set[asyncio.Task[Any]]] = [set() for _ in config.replicas]
        self._cut: set[asyncio.Task[Any]] = set()

    # -- lifecycle -----------------------------------------------------------
    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/completions", self._proxy),
            web.post("/v1/chat/completions", self._proxy),
            web.get("/v1/models", self._models),
            web.get("/v1/models/{model_id:.+}", self._models),
            web.get("/health", self._health),
            web.get("/router/stats", self._stats),
            web.post("/router/replicas", self._add_replica),
        ]

    async def start(self, host: str = protocol.LOOPBACK, port: int = 0) -> int:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=self.config.request_timeout_s),
        )
        self._clients = [_replica_client(r.url) for r in self.replicas]
        await super().start(host, port)
        self._health_task = asyncio.create_task(self._health_loop())
        return self.port

    async def stop(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            await asyncio.gather(self._health_task, return_exceptions=True)
        await super().stop()
        if self._session is not None:
            await self._session.close()
        for c in self._clients:
            await c.close()

    def add_replica(self, url: str, info: dict[str, Any] | None = None) -> int:
        """Add a replica (``UsageError`` for a bad or non-loopback URL); its index."""
        check_target(url, allow_remote=self.config.allow_remote)
        url = url.rstrip("/")
        if any(r.url == url for r in self.replicas):
            raise UsageError(f"{url} is already a replica of this router")
        self._clients.append(_replica_client(url))
        self.replicas.append(ReplicaStats(url=url, info=dict(info or {})))
        self._inflight.append(set())
        return self.state.add()

    async def _add_replica(self, request: web.Request) -> web.Response:
        try:
            body = await protocol.read_json(request)
            if not isinstance(body, dict) or not isinstance(body.get("url"), str):
                raise protocol.BadRequest("give {'url': 'http://HOST:PORT', ...}", param="url")
            i = self.add_replica(body["url"], body)
        except protocol.BadRequest as exc:
            return protocol.bad_request_response(exc)
        except UsageError as exc:
            return protocol.error_response(str(exc), param="url")
        return web.json_response({"replica": i, "replicas": len(self.replicas)})

    # -- health --------------------------------------------------------------
    def mark(self, i: int, alive: bool) -> None:
        if not alive and self.state.alive[i]:
            self.replicas[i].taken_out += 1
            for t in self._inflight[i]:  # a hung replica's streams would wait for the deadline
                self._cut.add(t)
                t.cancel()
        self.state.set_alive(i, alive)

    async def _check(self, i: int) -> None:
        assert self._session is not None
        r = self.replicas[i]
        try:
            async with self._session.get(
                r.url + "/health",
                timeout=aiohttp.ClientTimeout(total=self.config.health_timeout_s),
            ) as resp:
                ok = resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            ok = False
        if ok:
            r.health_misses = 0
            self.mark(i, True)
        else:
            r.health_misses += 1
            if r.health_misses >= self.config.health_failures:
                self.mark(i, False)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._check(i) for i in range(len(self.replicas))))
            await asyncio.sleep(self.config.health_interval_s)

    # -- handlers ------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        live = sum(self.state.alive)
        return web.Response(text=f"ok {live}/{len(self.replicas)}", status=200 if live else 503)

    async def _models(self, request: web.Request) -> web.Response:
        assert self._session is not None
        for i, r in enumerate(self.replicas):
            if not self.state.alive[i]:
                continue
            try:
                async with self._session.get(r.url + request.path) as resp:
                    body = await resp.json(content_type=None)
                    return web.json_response(body, status=resp.status)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                continue
        return protocol.error_response("no live replica", status=503, kind="unavailable")

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        t_in = time.perf_counter()
        try:
            raw = await protocol.read_body(request)
            key, n_tokens = prompt_key(json.loads(raw))
        except protocol.BadRequest as exc:
            return protocol.bad_request_response(exc)
        except ValueError as exc:
            return protocol.error_response(f"the body is not a JSON request: {exc}"[:200])
        hashes = block_hashes(key, DEFAULT_BLOCK)
        tried: set[int] = set()
        while True:
            t0 = time.perf_counter()
            try:
                i, matched = self._choose(hashes, tried)
            except IndexError:
                self.no_replica += 1
                return protocol.error_response(
                    "no live replica to route to", status=503, kind="unavailable"
                )
            self.decision_s.append(time.perf_counter() - t0)
            tried.add(i)
            r = self.replicas[i]
            r.routed += 1
            self.state.start(i)
            try:
                outcome = await self._forward(request, raw, i, t_in)
            finally:
                self.state.done(i)
            if outcome == "retry":
                r.retried_away += 1
                continue
            if isinstance(outcome, web.StreamResponse):
                r.prompt_tokens += n_tokens
                r.est_cached_tokens += min(matched * DEFAULT_BLOCK, n_tokens)
            return outcome if isinstance(outcome, web.StreamResponse) else web.Response()

    def _choose(self, hashes: list[int], tried: set[int]) -> tuple[int, int]:
        """Choose among live replicas not tried yet for this request."""
        if not tried:
            return self.state.choose(hashes)
        saved = {j: self.state.alive[j] for j in tried}
        try:
            for j in tried:
                self.state.alive[j] = False
            return self.state.choose(hashes)
        finally:
            for j, was in saved.items():
                self.state.alive[j] = was

    async def _forward(
        self, request: web.Request, raw: bytes, i: int, t_in: float
    ) -> web.StreamResponse | str:
        """Send ``raw`` to replica ``i`` and relay its answer: the response sent (or begun),
        or ``"retry"`` where the replica refused the connection (it is taken out)."""
        r = self.replicas[i]
        relay = Relay(request, r.url)
        try:
            self.forward_s.append(time.perf_counter() - t_in)
            await self._send(request, raw, i, relay)
            count_status(r, relay.status)
            assert relay.resp is not None  # the replica answered: the relay began
            return relay.resp
        except ClientGone:
            r.client_gone += 1  # the client left; the replica is fine
            return relay.resp or web.Response(status=499)
        except ConnectionRefusedError:
            # nothing reached the replica: take it out, try another
            self.mark(i, False)
            return "retry"
        except (
            asyncio.TimeoutError,
            TimeoutError,
            EOFError,
            httpc.HttpError,
            OSError,
            ValueError,
        ) as exc:
            r.failed += 1
            timed_out = isinstance(exc, (asyncio.TimeoutError, TimeoutError))
            if not timed_out:
                self.mark(i, False)
            what = "timed out" if timed_out else f"{type(exc).__name__}: {exc}"
            return await relay.fail(f"replica {r.url} failed: {what}"[:300])

    async def _send(self, request: web.Request, raw: bytes, i: int, relay: Relay) -> None:
        """POST ``raw`` upstream as a task the health checks can cut (``mark``): a cut one
        raises ``EOFError``; the client's own cancellation goes on up."""
        task = asyncio.ensure_future(
            self._clients[i].post(request.path, raw, relay, self.config.request_timeout_s)
        )
        self._inflight[i].add(task)
        try:
            await task
        except asyncio.CancelledError:
            if task not in self._cut:
                task.cancel()
                raise  # the client's handler was cancelled
            self._cut.discard(task)
            self.replicas[i].cut += 1
            raise EOFError("the replica was taken out by its health checks") from None
        finally:
            self._inflight[i].discard(task)

    # -- stats ---------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """What ``GET /router/stats`` answers (``router_stats.stats_body``)."""
        return stats_body(
            self.config.policy.name,
            self.replicas,
            self.state,
            no_replica=self.no_replica,
            decision_s=self.decision_s,
            forward_s=self.forward_s,
        )


def prompt_key(body: Any) -> tuple[str | list[int], int]:
    """What the router hashes of a request (its prompt text, or its token ids) and its
    length (characters, or token ids); ``ValueError`` if ``body`` is no JSON object."""
    if not isinstance(body, dict):
        raise ValueError("not an object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
        return prompt, len(prompt)
    if isinstance(prompt, list):
        prompt = "".join(x for x in prompt if isinstance(x, str))
    if prompt is None and isinstance(body.get("messages"), list):
        parts = []
        for m in body["messages"]:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, list):
                c = "".join(p.get("text", "") for p in c if isinstance(p, dict))
            parts.append(f"{m.get('role') if isinstance(m, dict) else ''}:{c or ''}")
        prompt = "\n".join(parts)
    text = prompt if isinstance(prompt, str) else ""
    return text, len(text)
