"""A discrete-event simulator of serving replicas behind a router.

Each simulated replica schedules as the reference engine does (``engine/scheduler.py``):
every step advances each running request by a token; when requests wait and slots are
free, the step also admits them first come, first served, up to its token budget
(``max_step_tokens``, at least one request), and each admitted request gets its first
token at the step's end. A step costs (``ReplicaProfile.step_s``)::

    decode_base_s + decode_per_seq_s * running + decode_per_token_s * context tokens
      + sum over admitted requests of (prefill_base_s + prefill_per_token_s * uncached
                                      + prefill_per_cached_token_s * cached)

plus the replica's serving loop (``loop_base_s + loop_per_seq_s * requests`` that got a
token: the hand-offs to the engine thread and the streamed tokens), and every request pays
its path through the router (``path_s``, added to TTFT and end-to-end latency). Those
numbers come from a short measured profile of a real replica (``profiling.profile_engine``,
the replica's ``POST /engine/profile``, and the serving project's probe of its serving
loop), or from the step log of a real run (``fit_profile``), so simulated times rest on
measured ones. A cached prompt token is not free: the new tokens attend to it. Each replica
has a prefix cache (``BlockLRU``); the router runs the same policy code as the real router
(``policy.py``).

Decode steps are simulated in leaps: between two events nothing changes, so a replica jumps
to its next completion (a heap of per-request finishing step counts) in one event; an
arrival that can be admitted cuts the leap at the end of the step in progress, as the
engine would. That keeps the cost per request to a few heap operations: 1,000 replicas and
1M requests take minutes on one core.

Disaggregated mode (the prefill/decode split): ``prefill_replicas`` only prefill, then send
the request's KV to the least-loaded of ``decode_replicas`` (``kv_base_s + prompt tokens *
kv_bytes_per_token / kv_bandwidth``, from the measured NCCL send/recv of ``kvxfer.py``),
which only decode; TTFT is the prefill's end, as in colocated serving.

Not modelled: ITL per token (the summary gives TTFT, TPOT, E2E), a prompt's chunks over
several steps (a prompt is admitted whole: its cost is its tokens' either way), network
time between client and router.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from parlab.errors import UsageError
from parlab.serve.policy import PolicyConfig, PolicyState
from parlab.serve.prefix import BlockLRU

PROFILE_TERMS = (
    "decode_base_s",
    "prefill_base_s",
    "prefill_per_token_s",
    "prefill_per_cached_token_s",
    "decode_per_seq_s",
    "decode_per_token_s",
)
"""The step cost's coefficients, in the order of ``step_features``."""


def step_features(e: dict[str, float]) -> list[float]:
    """A logged engine step's regressors for ``PROFILE_TERMS``: 1, requests admitted, prompt
    tokens computed, prompt tokens cached, decoding requests, context tokens."""
    return [
        1.0,
        float(e.get("admitted", 0)),
        float(e.get("prefill", 0)),
        float(e.get("cached", 0)),
        float(e.get("decode", 0)),
        float(e.get("context", 0)),
    ]


@dataclass(frozen=True, kw_only=True)
class ReplicaProfile:
    """Measured step costs of one replica (``profiling.profile_engine``, ``fit_profile``)."""

    prefill_base_s: float
    """Cost of admitting one request."""
    prefill_per_token_s: float
    """Cost per uncached prompt token computed."""
    decode_base_s: float
    """Fixed cost of a step."""
    decode_per_seq_s: float
    """Cost per running (decoding) request in a step."""
    prefill_per_cached_token_s: float = 0.0
    """Cost per prompt token taken from the prefix cache (the new tokens attend to it)."""
    decode_per_token_s: float = 0.0
    """Cost per context token of the running batch in a step (attention reads)."""
    max_batch: int = 16
    """Requests running at once."""
    max_step_tokens: int = 8192
    """Token budget of a step: the running requests' one each, then prompts."""
    block: int = 16
    """Prefix-cache block, tokens."""
    cache_blocks: int = 4096
    """Prefix-cache capacity, blocks (0: no prefix cache)."""
    loop_base_s: float = 0.0
    """The serving loop's cost per step beyond the engine's (the hand-off to the engine
    thread and back, streaming the new tokens), fixed part."""
    loop_per_seq_s: float = 0.0
    """The same, per request that gets a token in the step. Both from ``fit_loop`` on a
    short probe of the replica's own serving loop; 0: the engine alone."""
    path_s: float = 0.0
    """A request's way from the client through the router to the engine and its first
    token's way back, seconds: added to every request's TTFT and end-to-end latency (the
    serving project's probe); 0: the replica alone."""

    @classmethod
    def from_json(cls, data: dict[str, Any], **over: Any) -> ReplicaProfile:
        """A profile from ``profile_engine``'s or ``fit_profile``'s dictionary; fields it
        lacks keep their defaults, ``over`` sets any field."""
        keys = ("prefill_base_s", "prefill_per_token_s", "decode_base_s", "decode_per_seq_s")
        extra = (
            "prefill_per_cached_token_s",
            "decode_per_token_s",
            "loop_base_s",
            "loop_per_seq_s",
            "path_s",
        )
        return cls(
            **{k: float(data[k]) for k in keys},
            **{k: float(data[k]) for k in extra if k in data},
            **over,
        )

    def prefill_s(self, uncached: int, cached: int) -> float:
        """One admitted request's share of a step."""
        return (
            self.prefill_base_s
            + self.prefill_per_token_s * uncached
            + self.prefill_per_cached_token_s * cached
        )

    def decode_step_s(self, batch: int, context: float) -> float:
        """A step's decoding part: ``batch`` running requests holding ``context`` tokens,
        plus the serving loop's (``loop_s``)."""
        return self.engine_decode_s(batch, context) + self.loop_s(batch)

    def engine_decode_s(self, batch: int, context: float) -> float:
        """``decode_step_s`` without the serving loop's part."""
        return (
            self.decode_base_s + self.decode_per_seq_s * batch + self.decode_per_token_s * context
        )

    def step_s(self, e: dict[str, float]) -> float:
        """The engine's cost of a logged step (``step_features``), the serving loop left out."""
        coef = [getattr(self, k) for k in PROFILE_TERMS]
        return float(np.dot(coef, step_features(e)))

    def loop_s(self, requests: int) -> float:
        """The serving loop's seconds around one step that gives ``requests`` a token."""
        return self.loop_base_s + self.loop_per_seq_s * requests


def nonneg_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (a cost is never negative): the best
    unconstrained fit over every subset of the columns whose coefficients all come out
    non-negative; the others zero. Exact for the few columns a profile has."""
    k = a.shape[1]
    best, best_err = np.zeros(k), float(np.sum(y**2))
    for mask in range(1, 1 << k):
        cols = [j for j in range(k) if mask >> j & 1]
        c, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
        if np.any(c < 0):
            continue
        err = float(np.sum((y - a[:, cols] @ c) ** 2))
        if err < best_err:
            best, best_err = np.zeros(k), err
            best[cols] = c
    return best


def fit_loop(log: list[dict[str, float]], engine: ReplicaProfile) -> dict[str, Any]:
    """The serving loop's cost per step (``ReplicaProfile.loop_base_s`` and
    ``loop_per_seq_s``) from the step log of a replica that served real requests (its
    ``wall`` and ``gap``, as the serving loop saw them) and the engine's own costs in
    ``engine`` (its idle profile): least squares, non-negative, of ``wall + gap -`` the
    step's engine cost against the requests that got a token."""
    rows = [
        (e["batch"], e["wall"] + e.get("gap", 0.0) - engine.step_s(e)) for e in log if "wall" in e
    ]
    if len(rows) < 2:
        raise ValueError("fit_loop needs the log of at least two served steps")
    a = np.asarray(rows, dtype=float)
    base, per_seq = nonneg_lstsq(np.column_stack([np.ones(len(a)), a[:, 0]]), a[:, 1])
    return {
        "loop_base_s": float(base),
        "loop_per_seq_s": float(per_seq),
        "loop_iterations": len(rows),
        "loop_median_s": float(statistics.median(a[:, 1])),
    }


def fit_profile(log: list[dict[str, float]]) -> dict[str, Any]:
    """Step costs from an engine's step log (``GET /engine/log``): least squares with
    non-negative costs of each step's seconds -- its wall time as the serving loop saw it
    plus the gap before it, where logged, else its compute time -- against
    ``step_features``. The profile of a replica *under the run's own conditions* (its
    serving loop included, where logged)."""
    if not any(e.get("prefill", 0) for e in log) or not any(e.get("decode", 0) for e in log):
        raise ValueError("the step log needs steps with prompt tokens and with decoding ones")

    def cost(e: dict[str, float]) -> float:
        return e.get("wall", e["s"]) + e.get("gap", 0.0)

    a = np.asarray([step_features(e) for e in log], dtype=float)
    coef = nonneg_lstsq(a, np.asarray([cost(e) for e in log]))
    return {k: float(c) for k, c in zip(PROFILE_TERMS, coef, strict=True)}


@dataclass(frozen=True, kw_only=True)
class Disaggregation:
    """The prefill/decode split."""

    prefill_replicas: int
    """Replicas that only prefill."""
    decode_replicas: int
    """Replicas that only decode."""
    kv_bytes_per_token: int
    """KV-cache bytes of one token (all layers, K and V)."""
    kv_base_s: float = 0.0
    """Fixed cost of one transfer (measured latency)."""
    kv_bandwidth: float = 1e11
    """Bytes per second of the transfer (measured)."""


@dataclass
class Workload:
    """Requests as arrays (``from_dataset`` or ``shared_prefix_arrays``)."""

    arrival: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    hashes: list[list[int]] | None = None
    """Block hashes per request (real prompts); else built from groups."""
    group: np.ndarray | None = None
    prefix_len: np.ndarray | None = None


def from_dataset(dataset: Any, arrival: np.ndarray, block: int = 16) -> Workload:
    """A workload of a ``Dataset``'s requests, hashed as the replica hashes them."""
    from parlab.serve.prefix import block_hashes
    from parlab.serve.tokenizer import get

    tok = get()
    ids = [tok.encode(r.prompt) for r in dataset.requests]
    return Workload(
        arrival=np.asarray(arrival, dtype=np.float64),
        prompt_len=np.asarray([len(x) for x in ids]),
        output_len=np.asarray([r.output_len for r in dataset.requests]),
        hashes=[block_hashes(x, block) for x in ids],
    )


def shared_prefix_arrays(
    *,
    n: int,
    groups: int,
    prefix_len: int,
    question_len: int,
    output_len: int,
    rate: float,
    seed: int = 0,
) -> Workload:
    """A large shared-prefix workload as arrays (no text), Poisson arrivals."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=n)
    gaps[0] = 0.0
    return Workload(
        arrival=np.cumsum(gaps),
        prompt_len=np.full(n, prefix_len + question_len),
        output_len=np.full(n, output_len),
        group=rng.integers(0, groups, size=n),
        prefix_len=np.full(n, prefix_len),
    )


@dataclass
class _Rep:
    cache: BlockLRU | None
    waiting: deque[int] = field(default_factory=deque)
    running: list[tuple[int, int]] = field(default_factory=list)  # heap (finish_step, rid)
    steps: int = 0
    busy: bool = False
    version: int = 0
    leap_start: float = 0.0
    leap_t: float = 0.0
    leap_k: int = 0
    kind: int = -1  # 0 prefill, 1 decode
    admitted: list[int] = field(default_factory=list)
    served: int = 0
    ctx: int = 0  # sum over running requests of (prompt length + 1 - step at which it joined)
    mixed: bool = False  # the prefill step in progress also advances the running requests


_ARRIVE, _END, _KV = 0, 1, 2


def simulate(
    work: Workload,
    *,
    replicas: int,
    profile: ReplicaProfile,
    policy: PolicyConfig,
    disagg: Disaggregation | None = None,
    max_events: int = 200_000_000,
) -> dict[str, Any]:
    """Run the simulation; return the vLLM-style summary plus cache and load figures."""
    n = len(work.arrival)
    if replicas < 1:
        raise UsageError("--replicas must be at least 1")
    if disagg is not None:
        if disagg.prefill_replicas < 1 or disagg.decode_replicas < 1:
            raise UsageError("disaggregated serving needs >= 1 prefill and >= 1 decode replica")
        replicas = disagg.prefill_replicas + disagg.decode_replicas
    n_front = disagg.prefill_replicas if disagg else replicas
    p = profile
    reps = [
        _Rep(cache=BlockLRU(p.cache_blocks) if p.cache_blocks > 0 else None)
        for _ in range(replicas)
    ]
    router = PolicyState(n_front, policy)
    dec_router = (
        PolicyState(disagg.decode_replicas, PolicyConfig(name="least_outstanding"))
        if disagg
        else None
    )
    ttft = np.zeros(n)
    finish = np.zeros(n)
    cached = np.zeros(n, dtype=np.int64)
    joined = np.zeros(n, dtype=np.int64)  # the replica's step count when r joined its batch
    front = np.zeros(n, dtype=np.int64)
    back = np.zeros(n, dtype=np.int64)
    group_blocks: dict[int, list[int]] = {}
    fresh = [1 << 62]

    def hashes_of(r: int) -> list[int]:
        if work.hashes is not None:
            return work.hashes[r]
        assert work.group is not None and work.prefix_len is not None
        g = int(work.group[r])
        gb = group_blocks.get(g)
        if gb is None:
            gb = [hash(("g", g, j)) for j in range(int(work.prefix_len[r]) // p.block)]
            group_blocks[g] = gb
        rest = int(work.prompt_len[r]) // p.block - len(gb)
        fresh[0] += max(rest, 0)
        return gb + list(range(fresh[0] - max(rest, 0), fresh[0]))

    events: list[tuple[float, int, int, int, int]] = []
    seq = 0
    for r in range(n):
        events.append((float(work.arrival[r]), seq, _ARRIVE, r, 0))
        seq += 1
    heapq.heapify(events)

    def push(t: float, kind: int, a: int, b: int) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, a, b))
        seq += 1

    is_prefill_only = [disagg is not None and i < n_front for i in range(replicas)]
    is_decode_only = [disagg is not None and i >= n_front for i in range(replicas)]

    def start(i: int, now: float) -> None:
        rep = reps[i]
        free = p.max_batch - len(rep.running)
        if rep.waiting and free > 0:
            if is_decode_only[i]:
                # KV arrived already: joining the batch costs nothing here
                while rep.waiting and len(rep.running) < p.max_batch:
                    join(rep, rep.waiting.popleft())
            else:
                b = len(rep.running)
                dur = p.decode_base_s
                if b:  # the step also advances the running requests by a token
                    dur += p.decode_per_seq_s * b + p.decode_per_token_s * (rep.ctx + b * rep.steps)
                budget = p.max_step_tokens - b
                adm = rep.admitted
                while rep.waiting and (is_prefill_only[i] or len(adm) < free):
                    r = rep.waiting[0]
                    plen = int(work.prompt_len[r])
                    if adm and plen > budget:
                        break
                    rep.waiting.popleft()
                    hs = hashes_of(r)
                    hit = 0
                    if rep.cache is not None:
                        m = rep.cache.match(hs)
                        m = min(m, (plen - 1) // p.block)
                        hit = m * p.block
                        rep.cache.insert(hs)
                    cached[r] = hit
                    dur += p.prefill_s(plen - hit, hit)
                    budget -= plen - hit
                    adm.append(r)
                dur += p.loop_s(len(adm) + b)
                rep.busy, rep.kind, rep.mixed = True, 0, b > 0
                rep.version += 1
                push(now + dur, _END, i, rep.version)
                return
        if rep.running:
            b = len(rep.running)
            k = max(1, rep.running[0][0] - rep.steps)
            # context tokens at this step: sum of (prompt + tokens generated so far); the
            # leap's steps are timed at its mean context (it grows by b tokens a step);
            # ReplicaProfile.decode_step_s, inline (the hot path)
            ctx = rep.ctx + b * rep.steps + b * (k - 1) / 2
            t = p.decode_base_s + p.decode_per_seq_s * b + p.decode_per_token_s * ctx
            t += p.loop_s(b)
            rep.busy, rep.kind = True, 1
            rep.leap_start, rep.leap_t, rep.leap_k = now, t, k
            rep.version += 1
            push(now + k * t, _END, i, rep.version)
            return
        rep.busy, rep.kind = False, -1

    def enqueue(i: int, r: int, now: float) -> None:
        rep = reps[i]
        rep.waiting.append(r)
        if not rep.busy:
            start(i, now)
        elif rep.kind == 1 and len(rep.running) < p.max_batch:
            done = int((now - rep.leap_start) / rep.leap_t)
            if done + 1 < rep.leap_k:
                rep.leap_k = done + 1
                rep.version += 1
                push(rep.leap_start + rep.leap_k * rep.leap_t, _END, i, rep.version)

    def join(rep: _Rep, r: int) -> None:
        heapq.heappush(rep.running, (rep.steps + int(work.output_len[r]) - 1, r))
        joined[r] = rep.steps
        rep.ctx += int(work.prompt_len[r]) + 1 - rep.steps

    def finish_req(r: int, now: float) -> None:
        finish[r] = now
        if disagg is None:
            router.done(int(front[r]))
        else:
            assert dec_router is not None
            dec_router.done(int(back[r]) - n_front)

    def advance(i: int, rep: _Rep, k: int, now: float) -> None:
        """``k`` steps of the running requests ended at ``now``."""
        rep.steps += k
        while rep.running and rep.running[0][0] <= rep.steps:
            _, r = heapq.heappop(rep.running)
            rep.ctx -= int(work.prompt_len[r]) + 1 - int(joined[r])
            finish_req(r, now)
            if is_decode_only[i]:
                rep.served += 1

    count = 0
    while events:
        count += 1
        if count > max_events:
            raise RuntimeError(f"simulation passed {max_events} events")
        now, _, kind, a, b = heapq.heappop(events)
        if kind == _ARRIVE:
            r = a
            i, _ = router.choose(hashes_of(r) if policy.name == "cache_aware" else ())
            router.start(i)
            front[r] = i
            enqueue(i, r, now)
        elif kind == _KV:
            r = a
            assert dec_router is not None
            j, _ = dec_router.choose(())
            dec_router.start(j)
            back[r] = n_front + j
            enqueue(n_front + j, r, now)
        else:
            i, version = a, b
            rep = reps[i]
            if version != rep.version:
                continue
            if rep.kind == 0:
                if rep.mixed:
                    advance(i, rep, 1, now)
                for r in rep.admitted:
                    ttft[r] = now
                    rep.served += 1
                    if is_prefill_only[i]:
                        assert disagg is not None
                        router.done(i)
                        if int(work.output_len[r]) <= 1:
                            finish[r] = now
                            continue
                        xfer = (
                            disagg.kv_base_s
                            + int(work.prompt_len[r])
                            * disagg.kv_bytes_per_token
                            / disagg.kv_bandwidth
                        )
                        push(now + xfer, _KV, r, 0)
                    elif int(work.output_len[r]) <= 1:
                        finish_req(r, now)
                    else:
                        join(rep, r)
                rep.admitted = []
            else:
                advance(i, rep, rep.leap_k, now)
            start(i, now)
    arr = work.arrival
    t_ttft = ttft - arr + p.path_s
    e2e = finish - arr + p.path_s
    out = work.output_len.astype(np.float64)
    multi = out > 1
    tpot = np.where(multi, (e2e - t_ttft) / np.maximum(out - 1, 1), 0.0)
    duration = float(finish.max() - arr.min()) if n else 0.0
    res: dict[str, Any] = {
        "duration": duration,
        "completed": int(n),
        "request_throughput": n / duration if duration else math.inf,
        "output_throughput": float(out.sum()) / duration if duration else math.inf,
        "cache_hit_rate": float(cached.sum() / max(1, work.prompt_len.sum())),
        "events": count,
    }
    for name, arr_ in (("ttft", t_ttft), ("tpot", tpot[multi]), ("e2el", e2e)):
        a_ = (arr_ if len(arr_) else np.zeros(1)) * 1e3
        res[f"mean_{name}_ms"] = float(a_.mean())
        res[f"median_{name}_ms"] = float(np.median(a_))
        res[f"p90_{name}_ms"] = float(np.percentile(a_, 90))
        res[f"p99_{name}_ms"] = float(np.percentile(a_, 99))
    served = [rep.served for rep in reps]
    res["per_replica_served"] = served
    res["load_imbalance"] = (
        float(max(served) / (sum(served) / len(served))) if sum(served) else None
    )
    return res
