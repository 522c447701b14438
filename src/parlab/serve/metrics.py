"""Serving metrics, defined exactly as vLLM's ``benchmarks/benchmark_serving.py``
(``calculate_metrics``) and SGLang's ``bench_serving.py`` define them.

Per request (``RequestOutcome``), timed on the client with ``time.perf_counter``:

- **TTFT**: from sending the request to the first streamed chunk that carries
  generated text;
- **ITL** (inter-token latency): the gaps between consecutive streamed chunks
  of one request; the gaps of all successful requests are *pooled* into one
  list before taking mean/median/percentiles (vLLM: ``itls += output.itl``);
- **E2E latency**: from sending to the last streamed chunk (vLLM sets
  ``latency = most_recent_timestamp - st``);
- **TPOT**: ``(E2E - TTFT) / (output_tokens - 1)`` per request, then averaged
  over requests; requests with one output token are left out of TPOT (vLLM
  appends to ``tpots`` only when ``output_len > 1``) but count as TPOT 0 for
  goodput (vLLM's ``all_tpots``).

Over the run (``duration`` = wall time from the first send to the last
completion, as vLLM's ``benchmark_duration``):

- ``request_throughput = completed / duration``;
- ``output_throughput = total_output_tokens / duration``;
- ``total_token_throughput = (total_input_tokens + total_output_tokens) / duration``;
- ``request_goodput = good / duration`` where a request is good when every
  given SLO holds (``ttft``, ``tpot``, ``e2el`` in ms; vLLM's ``--goodput``);
- for each of ttft, tpot, itl, e2el: mean, median, std and the chosen
  percentiles (default 90 and 99; vLLM's default is 99 only), in ms, with
  ``numpy.percentile`` (linear interpolation). An empty list gives 0, as
  ``np.mean(ttfts or 0)`` does in vLLM.

Only successful requests enter the latency lists and the token totals;
failed ones are counted in ``failed`` with their error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
SLO_KEYS = ("ttft", "tpot", "e2el")


@dataclass(kw_only=True)
class RequestOutcome:
    """What the client saw of one request."""

    success: bool = False
    """True when a complete response arrived (streams: at least one text chunk and ``[DONE]``)."""
    prompt_len: int = 0
    """Input tokens (the server's ``usage.prompt_tokens`` where given, else the dataset's)."""
    output_tokens: int = 0
    """Output tokens (the server's ``usage.completion_tokens`` where given, else chunks seen)."""
    cached_tokens: int | None = None
    """Prompt tokens the server served from its prefix cache, where it reports them."""
    ttft: float = 0.0
    """Seconds from send to the first text chunk."""
    latency: float = 0.0
    """Seconds from send to the last text chunk (E2E)."""
    itl: list[float] = field(default_factory=list)
    """Gaps between consecutive text chunks, seconds."""
    start: float = 0.0
    """``perf_counter`` time the request was sent."""
    scheduled: float = 0.0
    """``perf_counter`` time the arrival process meant it to be sent."""
    error: str = ""
    """Why it failed (empty on success)."""
    generated_text: str = ""
    """The text received."""
    replica: str | None = None
    """The replica that served it, where a router says so (``x-parlab-replica`` header)."""


@dataclass(frozen=True, kw_only=True)
class Slo:
    """Goodput service-level objectives, in milliseconds (vLLM ``--goodput ttft:.. tpot:..``)."""

    ttft_ms: float | None = None
    """Largest acceptable TTFT."""
    tpot_ms: float | None = None
    """Largest acceptable TPOT."""
    e2el_ms: float | None = None
    """Largest acceptable end-to-end latency."""

    @classmethod
    def parse(cls, items: Sequence[str]) -> Slo:
        """Parse ``["ttft:500", "tpot:50"]``; ``ValueError`` names a bad item."""
        vals: dict[str, float] = {}
        for item in items:
            key, sep, val = item.partition(":")
            if not sep or key not in SLO_KEYS:
                raise ValueError(
                    f"bad SLO {item!r}: write KEY:MILLISECONDS with KEY one of {', '.join(SLO_KEYS)}"
                )
            try:
                ms = float(val)
            except ValueError:
                raise ValueError(f"bad SLO {item!r}: {val!r} is not a number of ms") from None
            if ms <= 0:
                raise ValueError(f"bad SLO {item!r}: the bound must be positive")
            vals[f"{key}_ms"] = ms
        return cls(**vals)

    def is_set(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2el_ms))

    def to_json(self) -> dict[str, float]:
        out = {"ttft": self.ttft_ms, "tpot": self.tpot_ms, "e2el": self.e2el_ms}
        return {k: v for k, v in out.items() if v is not None}


def _pct_label(p: float) -> str:
    # vLLM: p_word = str(int(p)) if int(p) == p else str(p)
    return str(int(p)) if int(p) == p else str(p)


def summarize(
    outcomes: Sequence[RequestOutcome],
    duration: float,
    *,
    percentiles: Iterable[float] = (90.0, 99.0),
    slo: Slo | None = None,
) -> dict[str, Any]:
    """The benchmark's summary, with vLLM's field names (``mean_ttft_ms``, ``p99_itl_ms``, ...)."""
    pcts = [float(p) for p in percentiles]
    for p in pcts:
        if not 0 < p <= 100:
            raise ValueError(f"percentile {p} is outside (0, 100]: give values like 50, 90, 99")
    ttfts: list[float] = []
    tpots: list[float] = []
    all_tpots: list[float] = []
    itls: list[float] = []
    e2els: list[float] = []
    completed = 0
    total_input = 0
    total_output = 0
    cached = 0
    cached_known = 0
    for o in outcomes:
        if not o.success:
            continue
        completed += 1
        total_input += o.prompt_len
        total_output += o.output_tokens
        tpot = 0.0
        if o.output_tokens > 1:
            tpot = (o.latency - o.ttft) / (o.output_tokens - 1)
            tpots.append(tpot)
        all_tpots.append(tpot)
        itls.extend(o.itl)
        ttfts.append(o.ttft)
        e2els.append(o.latency)
        if o.cached_tokens is not None:
            cached += o.cached_tokens
            cached_known += o.prompt_len
    dur = max(duration, 1e-12)
    good = completed
    if slo is not None and slo.is_set():
        good = 0
        for t, tp, e in zip(ttfts, all_tpots, e2els, strict=True):
            ok = (
                (slo.ttft_ms is None or t * 1e3 <= slo.ttft_ms)
                and (slo.tpot_ms is None or tp * 1e3 <= slo.tpot_ms)
                and (slo.e2el_ms is None or e * 1e3 <= slo.e2el_ms)
            )
            good += ok
    out: dict[str, Any] = {
        "duration": duration,
        "completed": completed,
        "failed": len(outcomes) - completed,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": completed / dur,
        "request_goodput": (good / dur) if slo is not None and slo.is_set() else None,
        "output_throughput": total_output / dur,
        "total_token_throughput": (total_input + total_output) / dur,
        "cache_hit_rate": (cached / cached_known) if cached_known else None,
    }
    lists = {"ttft": ttfts, "tpot": tpots, "itl": itls, "e2el": e2els}
    for name in LATENCY_METRICS:
        arr = np.asarray(lists[name] or [0.0], dtype=np.float64) * 1e3
        out[f"mean_{name}_ms"] = float(arr.mean())
        out[f"median_{name}_ms"] = float(np.median(arr))
        out[f"std_{name}_ms"] = float(arr.std())
        for p in pcts:
            out[f"p{_pct_label(p)}_{name}_ms"] = float(np.percentile(arr, p))
    return out


def vllm_result_json(
    summary: Mapping[str, Any],
    outcomes: Sequence[RequestOutcome],
    *,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON vLLM's ``--save-result`` writes: the summary plus per-request lists."""
    out: dict[str, Any] = dict(extra or {})
    out.update(summary)
    out["input_lens"] = [o.prompt_len for o in outcomes]
    out["output_lens"] = [o.output_tokens if o.success else 0 for o in outcomes]
    out["ttfts"] = [o.ttft if o.success else 0.0 for o in outcomes]
    out["itls"] = [o.itl if o.success else [] for o in outcomes]
    out["errors"] = [o.error for o in outcomes]
    return out
