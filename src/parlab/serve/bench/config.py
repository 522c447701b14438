"""What ``parlab bench serve`` sends and when: its settings, the target check, vLLM's arrival
schedule, and what one run measured."""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import numpy as np

from parlab.errors import UsageError
from parlab.serve.metrics import RequestOutcome, Slo

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


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
    """Most keep-alive connections when ``max_concurrency`` is unset; further requests wait
    for a free one (the wait counts in their TTFT)."""
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
    """Send-time offsets (seconds from the start) of ``n`` requests, vLLM's ``get_request``:
    gamma gaps of shape ``burstiness`` (1: Poisson, ``inf``: even) and mean ``1 / rate``,
    scaled so the last leaves at ``n / rate``; all at once at an infinite rate; a trace's own
    ``timestamps`` where given."""
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
