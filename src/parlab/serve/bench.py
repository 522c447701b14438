"""The load generator behind ``parlab bench serve``.

It sends a dataset's requests to an OpenAI-compatible endpoint over HTTP
(keep-alive connections: parlab's lean HTTP/1.1 client ``httpc.py`` for
``http``, aiohttp for ``https`` or on request -- both read the stream through
the same ``_Stream``) and times every streamed chunk with
``time.perf_counter`` on arrival, the way vLLM's ``benchmark_serving.py`` and
SGLang's ``bench_serving.py`` do; the metrics are theirs (``metrics.py``).

Arrivals (vLLM's ``get_request``): with a finite ``request_rate`` every request's gap,
the first one's included, is drawn from a gamma distribution with shape ``burstiness``
and scale ``1 / (request_rate * burstiness)`` -- burstiness 1 is a Poisson process,
below 1 burstier, above 1 steadier, ``inf`` evenly spaced -- from a seeded numpy
generator, and the send times are scaled so the last request leaves at
``num_prompts / request_rate`` exactly (vLLM: "to close the gap for stabilizing the
throughput data from different random seeds"). An infinite rate sends everything at once;
with ``max_concurrency`` at most that many requests are in flight (a closed
loop). A trace's own ``timestamp`` field can be replayed instead. The lag
between the scheduled and the actual send time is measured per request and
reported (``dispatch_lag_p99_ms``): it is how accurate the timestamps are.
To keep it small the last 1.5 ms before each send yield to the other tasks
instead of sleeping (asyncio's timers wake up to 1 ms late), and the cyclic
garbage collector is paused for the run (its pauses stall the loop).

What counts as a success (stricter than vLLM, which accepts a stream cut
after its first chunk): HTTP 200 and, when streaming, at least one chunk with
text and the stream's end -- the final ``data: [DONE]``, or, for servers that send none
(``transformers serve``), a body that ends whole after a chunk with a ``finish_reason``;
a chunk that is not JSON, an ``error`` chunk, a stream that stops before its end, a JSON
answer to a streaming request, a timeout or a refused connection are failures, each
with its reason. Every request ends in exactly one outcome. TTFT is taken at the first
chunk whose text is non-empty (as SGLang does).

Bounds: the request count is the dataset's; every request has a timeout and
the whole run a time limit (unfinished requests are failed, reason
"cancelled at the time limit"); only loopback addresses are targeted unless
``allow_remote`` is set.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import ipaddress
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import aiohttp
import numpy as np

from parlab.errors import UsageError
from parlab.serve.datasets import Dataset, SampleRequest
from parlab.serve.metrics import RequestOutcome, Slo, summarize

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
_JSON = {"Content-Type": "application/json"}
_SPIN_S = 0.0015


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """How to send the requests."""

    base_url: str
    """``http://host:port`` of the server or router."""
    api: str = "completions"
    """``completions`` or ``chat``."""
    model: str | None = None
    """Model name sent in requests; None: the first of ``/v1/models`` (else ``parlab``)."""
    request_rate: float = math.inf
    """Mean requests per second; ``inf``: all at once."""
    burstiness: float = 1.0
    """Gamma shape of the gaps (1: Poisson)."""
    max_concurrency: int | None = None
    """Most requests in flight at once (None: no limit)."""
    max_connections: int = 256
    """Keep-alive connections to open at most when ``max_concurrency`` is unset; further
    requests wait for a free one (the wait counts in their TTFT, as for any client). Without
    a cap a client that falls behind opens a connection per queued request and falls
    further behind."""
    replay_timestamps: bool = False
    """Send at the dataset's ``timestamp`` offsets instead of a rate."""
    stream: bool = True
    """Ask for server-sent events."""
    ignore_eos: bool = True
    """Send ``ignore_eos`` (vLLM's and SGLang's field), so every request runs to its
    ``max_tokens``; off for servers that reject the field (``transformers serve``)."""
    seed: int = 0
    """Seed of the arrival schedule."""
    request_timeout_s: float = 60.0
    """Longest a single request may take."""
    max_duration_s: float = 600.0
    """Longest the whole run may take."""
    percentiles: tuple[float, ...] = (90.0, 99.0)
    """Percentiles to report."""
    slo: Slo | None = None
    """Goodput SLOs."""
    allow_remote: bool = False
    """Allow a non-loopback target."""
    progress: bool = True
    """Show a progress bar on stderr."""
    client: str = "auto"
    """HTTP client: ``fast`` (parlab's lean keep-alive client, ``httpc.py``), ``aiohttp``,
    or ``auto`` (fast for http, aiohttp for https)."""

    def __post_init__(self) -> None:
        if self.api not in ENDPOINTS:
            raise UsageError(f"--api {self.api!r} is not one of {', '.join(ENDPOINTS)}")
        if not (self.request_rate > 0):
            raise UsageError(f"--request-rate {self.request_rate} must be positive (or inf)")
        if not (self.burstiness > 0):
            raise UsageError(f"--burstiness {self.burstiness} must be positive")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise UsageError(f"--max-concurrency {self.max_concurrency} is below 1")
        if self.client not in ("auto", "fast", "aiohttp"):
            raise UsageError(f"--client {self.client!r} is not one of auto, fast, aiohttp")
        if self.request_timeout_s <= 0 or self.max_duration_s <= 0:
            raise UsageError("--request-timeout and --max-duration must be positive seconds")
        check_target(self.base_url, allow_remote=self.allow_remote)


def check_target(url: str, *, allow_remote: bool) -> None:
    """``UsageError`` unless ``url`` is http(s) on loopback (or ``allow_remote``)."""
    u = urlparse(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise UsageError(f"bad URL {url!r}: write http://HOST:PORT")
    if allow_remote:
        return
    host = u.hostname
    loop = host == "localhost"
    if not loop:
        try:
            loop = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loop = False
    if not loop:
        raise UsageError(
            f"{host} is not a loopback address: pass --allow-remote to send requests to it"
        )


def arrival_offsets(
    n: int, *, rate: float, burstiness: float, seed: int, timestamps: Sequence[float | None] = ()
) -> np.ndarray:
    """Send-time offsets (seconds from the start) of ``n`` requests (vLLM's schedule)."""
    if timestamps:
        if any(t is None for t in timestamps):
            raise UsageError("--replay-timestamps needs a 'timestamp' on every dataset line")
        return np.asarray(timestamps, dtype=np.float64) - float(min(timestamps))  # type: ignore[type-var]
    if math.isinf(rate) or n == 0:
        return np.zeros(n)
    if math.isinf(burstiness):
        gaps = np.full(n, 1.0 / rate)
    else:
        rng = np.random.default_rng(seed)
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    sends = np.cumsum(gaps)
    return sends * (n / rate / sends[-1])


@dataclass
class BenchResult:
    """Everything one run measured."""

    outcomes: list[RequestOutcome]
    summary: dict[str, Any]
    duration: float
    dispatch_lag_ms: dict[str, float]
    errors: dict[str, int]
    model: str
    replicas: dict[str, int] = field(default_factory=dict)
    """Requests per serving replica, where a router names it."""


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
    from parlab.serve.httpc import HttpError

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


async def arun(cfg: BenchConfig, dataset: Dataset) -> BenchResult:
    """Run the benchmark inside a running event loop."""
    reqs = dataset.requests
    offsets = arrival_offsets(
        len(reqs),
        rate=cfg.request_rate,
        burstiness=cfg.burstiness,
        seed=cfg.seed,
        timestamps=[r.timestamp for r in reqs] if cfg.replay_timestamps else (),
    )
    base = cfg.base_url.rstrip("/")
    url = base + ENDPOINTS[cfg.api]
    outcomes = [RequestOutcome() for _ in reqs]
    sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
    connector = aiohttp.TCPConnector(limit=cfg.max_concurrency or cfg.max_connections)
    progress = _Progress(len(reqs), enabled=cfg.progress)
    async with aiohttp.ClientSession(connector=connector) as session:
        model = cfg.model or await resolve_model(session, base)

        timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s)
        u = urlparse(base)
        fast = None
        if cfg.client == "fast" or (cfg.client == "auto" and u.scheme == "http"):
            from parlab.serve.httpc import Client

            fast = Client(
                u.hostname or "127.0.0.1",
                u.port or 80,
                max_connections=cfg.max_concurrency or cfg.max_connections,
            )
        path = (u.path.rstrip("/") or "") + ENDPOINTS[cfg.api]

        async def send(i: int) -> None:
            if fast is not None:
                await send_one_fast(fast, path, cfg, model, reqs[i], outcomes[i])
            else:
                await send_one(session, url, cfg, model, reqs[i], outcomes[i], timeout)

        async def one(i: int) -> None:
            try:
                if sem is not None:
                    async with sem:
                        await send(i)
                else:
                    await send(i)
            finally:
                progress.advance()

        tasks: list[asyncio.Task[None]] = []
        t0 = time.perf_counter()

        async def dispatch() -> None:
            for i in range(len(reqs)):
                target = t0 + float(offsets[i])
                delay = target - time.perf_counter()
                if delay > _SPIN_S:
                    await asyncio.sleep(delay - _SPIN_S)
                # the event loop's timers wake up to ~1 ms late (epoll's millisecond timeout):
                # the last stretch yields to the other tasks until the send time instead
                while time.perf_counter() < target:
                    await asyncio.sleep(0)
                outcomes[i].scheduled = target
                tasks.append(asyncio.create_task(one(i)))
            if tasks:
                await asyncio.wait(tasks)

        with progress:
            try:
                await asyncio.wait_for(dispatch(), timeout=cfg.max_duration_s)
            except asyncio.TimeoutError:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            finally:
                if fast is not None:
                    await fast.close()
        t_end = time.perf_counter()
    for o in outcomes:
        if not o.success and not o.error:
            o.error = f"cancelled at the time limit ({cfg.max_duration_s:g} s)"
    ends = [o.start + o.latency for o in outcomes if o.success]
    duration = (max(ends) - t0) if ends else (t_end - t0)
    summary = summarize(outcomes, duration, percentiles=cfg.percentiles, slo=cfg.slo)
    lags = [
        (o.start - o.scheduled) * 1e3 for o in outcomes if o.scheduled and sem is None and o.start
    ]
    lag = {
        "mean": float(np.mean(lags)) if lags else 0.0,
        "p99": float(np.percentile(lags, 99)) if lags else 0.0,
        "max": float(np.max(lags)) if lags else 0.0,
    }
    errors = collections.Counter(o.error for o in outcomes if not o.success)
    replicas = collections.Counter(o.replica for o in outcomes if o.replica)
    return BenchResult(
        outcomes=outcomes,
        summary=summary,
        duration=duration,
        dispatch_lag_ms=lag,
        errors=dict(errors.most_common()),
        model=model,
        replicas=dict(replicas),
    )


def run(cfg: BenchConfig, dataset: Dataset) -> BenchResult:
    """Run the benchmark in a fresh event loop.

    The cyclic garbage collector is paused for the run (everything it would find is
    freed at the end anyway): its full collections over thousands of live request
    objects stall the event loop for tens of milliseconds, which would show up as
    send-time lag and inflated latencies.
    """
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        return asyncio.run(arun(cfg, dataset))
    finally:
        if was:
            gc.enable()


class _Progress:
    """A rich progress bar on stderr (cheap to advance: rich refreshes 4 times a second)."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self.total = total
        self.enabled = enabled
        self._p: Any = None
        self._task: Any = None

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import Progress

            console = Console(stderr=True, highlight=False)
            self._p = Progress(console=console, transient=True, refresh_per_second=4)
            self._p.__enter__()
            self._task = self._p.add_task("requests", total=self.total)
        return self

    def advance(self) -> None:
        if self._p is not None:
            self._p.advance(self._task)

    def __exit__(self, *exc: object) -> None:
        if self._p is not None:
            self._p.__exit__(None, None, None)


PROJECT = "PAR-DISTRIBUTED-INFERENCE"


def _unit(name: str) -> str:
    if name.endswith("_ms"):
        return "ms"
    if name == "duration":
        return "s"
    if name in ("request_throughput", "request_goodput"):
        return "req/s"
    if name.endswith("_throughput"):
        return "tokens/s"
    if name == "cache_hit_rate":
        return "fraction"
    return "count"


def to_document(
    result: BenchResult,
    cfg: BenchConfig,
    dataset: Dataset,
    *,
    command: str,
    role: str = "baseline",
    layout: dict[str, Any] | None = None,
    notes: Sequence[str] = (),
    artifacts: dict[str, str] | None = None,
    run_id: str | None = None,
) -> Any:
    """The ``serving-benchmark`` contract document of one run."""
    from parlab.contract import Document, Failure, Metric, new_run_id, now_iso
    from parlab.hardware.env import snapshot

    none_done = result.summary["completed"] == 0  # no latency was measured: unknown, not 0 ms
    metrics = {
        k: Metric(
            value=None if v is None or (none_done and k.endswith("_ms")) else float(v),
            unit=_unit(k),
        )
        for k, v in result.summary.items()
    }
    metrics["dispatch_lag_p99_ms"] = Metric(value=result.dispatch_lag_ms["p99"], unit="ms")
    metrics["dispatch_lag_max_ms"] = Metric(value=result.dispatch_lag_ms["max"], unit="ms")
    if result.replicas:
        names = sorted(result.replicas)
        metrics["requests_per_replica"] = Metric(
            value=float(max(result.replicas.values())),
            unit="count",
            per_rank=[float(result.replicas[n]) for n in names],
        )
    failure = None
    status = "ok"
    if result.summary["completed"] == 0:
        status = "failed"
        top = next(iter(result.errors), "no request was sent")
        failure = Failure(
            kind="timeout" if top.startswith(("timeout", "cancelled")) else "crash",
            message=f"no request succeeded ({len(result.outcomes)} sent); most common error: {top}",
        )
    all_notes = list(notes)
    if dataset.bad_lines:
        shown = ", ".join(f"line {n}: {why}" for n, why in dataset.bad_lines[:5])
        all_notes.append(f"{len(dataset.bad_lines)} bad dataset line(s) skipped ({shown})")
    if result.errors:
        all_notes.append(
            "failed requests: "
            + "; ".join(f"{n} x {e}" for e, n in list(result.errors.items())[:5])
        )
    return Document(
        run_id=run_id or new_run_id("serve-bench"),
        created=now_iso(),
        project=PROJECT,
        task="T4",
        role="failure" if status == "failed" else role,
        evidence_level="serving-benchmark",
        command=command,
        environment=snapshot(probe_links=False),
        workload={
            "dataset": dataset.name,
            "dataset_params": dataset.params,
            "num_requests": len(dataset.requests),
            "bad_lines": [{"line": n, "reason": why} for n, why in dataset.bad_lines],
            "api": cfg.api,
            "stream": cfg.stream,
            "model": result.model,
            "request_rate": None if math.isinf(cfg.request_rate) else cfg.request_rate,
            "burstiness": cfg.burstiness,
            "max_concurrency": cfg.max_concurrency,
            "seed": cfg.seed,
            "slo_ms": cfg.slo.to_json() if cfg.slo else {},
            "percentiles": list(cfg.percentiles),
            "target": cfg.base_url,
        },
        layout={"world_size": 1, "strategy": "serving", **(layout or {})},
        metrics=metrics,
        status=status,
        failure=failure,
        notes=all_notes,
        artifacts=artifacts or {},
    )
