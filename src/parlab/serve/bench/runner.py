"""A ``parlab bench serve`` run: the requests sent on their schedule, each timed, and the
outcomes summed up."""

from __future__ import annotations

import asyncio
import collections
import gc
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlparse

import aiohttp
import numpy as np
from rich.console import Console
from rich.progress import Progress

from parlab.serve.bench.client import resolve_model, send_one, send_one_fast
from parlab.serve.bench.config import ENDPOINTS, BenchConfig, BenchResult, arrival_offsets
from parlab.serve.datasets import Dataset
from parlab.serve.httpc import Client
from parlab.serve.metrics import RequestOutcome, summarize

_SPIN_S = 0.0015


def _fast_client(cfg: BenchConfig, base: str) -> Client | None:
    """parlab's lean client for ``base``, or None where aiohttp sends (``--client``)."""
    u = urlparse(base)
    if not (cfg.client == "fast" or (cfg.client == "auto" and u.scheme == "http")):
        return None
    return Client(
        u.hostname or "127.0.0.1",
        u.port or 80,
        max_connections=cfg.max_concurrency or cfg.max_connections,
    )


async def _dispatch(
    offsets: np.ndarray,
    outcomes: list[RequestOutcome],
    t0: float,
    one: Callable[[int], Awaitable[None]],
    tasks: list[asyncio.Task[None]],
) -> None:
    """Start request ``i`` at ``t0 + offsets[i]`` (into ``tasks``), then wait for them all."""
    for i in range(len(outcomes)):
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


def _result(
    cfg: BenchConfig, outcomes: list[RequestOutcome], model: str, t0: float, t_end: float
) -> BenchResult:
    """Sum up the outcomes of a run that started at ``t0`` and ended at ``t_end``."""
    for o in outcomes:
        if not o.success and not o.error:
            o.error = f"cancelled at the time limit ({cfg.max_duration_s:g} s)"
    ends = [o.start + o.latency for o in outcomes if o.success]
    duration = (max(ends) - t0) if ends else (t_end - t0)
    summary = summarize(outcomes, duration, percentiles=cfg.percentiles, slo=cfg.slo)
    open_loop = not cfg.max_concurrency  # a closed loop's sends wait for a slot, not a lag
    lags = [
        (o.start - o.scheduled) * 1e3 for o in outcomes if o.scheduled and open_loop and o.start
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
        fast = _fast_client(cfg, base)
        path = (urlparse(base).path.rstrip("/") or "") + ENDPOINTS[cfg.api]

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
        with progress:
            try:
                await asyncio.wait_for(
                    _dispatch(offsets, outcomes, t0, one, tasks), timeout=cfg.max_duration_s
                )
            except asyncio.TimeoutError:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            finally:
                if fast is not None:
                    await fast.close()
        t_end = time.perf_counter()
    return _result(cfg, outcomes, model, t0, t_end)


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
