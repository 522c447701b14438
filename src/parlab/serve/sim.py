"""A discrete-event simulator of serving replicas behind a router.

Each simulated replica schedules exactly as the reference engine does
(``engine.py``): when requests wait and KV slots are free, a *prefill
iteration* prefills every admitted request (``prefill_base_s +
prefill_per_token_s * uncached tokens + prefill_per_cached_token_s * cached
tokens`` each, or with ``prefill_overlap`` the larger of the first two terms plus
the third; each then has its first token); otherwise a *decode iteration*
advances the running batch by one token in ``decode_base_s + decode_per_seq_s *
batch + decode_per_token_s * context tokens`` seconds (the context: every
running request's prompt and generated tokens) -- or, for an engine whose
decode is a static CUDA graph over every KV slot per key-length bucket
(``ReplicaProfile.decode_bucket_s``), in the measured seconds of the smallest
bucket above the longest running request's length, as the engine picks its
graph. A prefill of an engine whose prefills are static graphs
(``ReplicaProfile.prefill_bucket_s``) costs its graph's measured seconds plus the
host work around it. Every iteration also pays the replica's serving loop
(``loop_base_s + loop_per_seq_s * requests``: the hand-offs to the engine thread and
the streamed tokens), and every request its path through the router
(``path_s``, added to TTFT and end-to-end latency). Those numbers come from a
short measured profile of a real replica (``Engine.profile``, the replica's
``POST /engine/profile``, and the serving project's ``loop_probe`` of its serving
loop: all but ``decode_per_token_s``), or from the iteration log of a real run
(``fit_profile``: all, the buckets its log saw, its serving loop included), so
simulated times rest on measured ones.
A cached prompt token is not free: the reference engine copies its KV into the
request's slot and the new tokens attend to it (on 2xH200 a prefix-cache hit
cost about as much as a miss: ``benchmarks/serve_sim_accuracy.py``). Each replica has a prefix cache (``BlockLRU``); the router runs the
same policy code as the real router (``policy.py``).

Decode iterations are simulated in leaps: between two events nothing
changes, so a replica jumps to its next completion (a heap of per-request
finishing step counts) in one event -- with decode buckets, or to the step
where its longest request's length reaches the next bucket, whichever comes
first (a heap of the running requests' lengths); an arrival that can be
admitted cuts the leap at the end of the step in progress, as the engine
would. That keeps the cost per request to a few heap operations: 1,000
replicas and 1M requests take minutes on one core.

Disaggregated mode (the prefill/decode split): ``prefill_replicas`` only
prefill, then send the request's KV to the least-loaded of
``decode_replicas`` (``kv_base_s + prompt tokens * kv_bytes_per_token /
kv_bandwidth``, from the measured NCCL send/recv of ``kvxfer.py``), which
only decode; TTFT is the prefill's end, as in colocated serving.

Not modelled: ITL per token (the summary gives TTFT, TPOT, E2E), chunked
prefill, preemption, network time between client and router.
"""

from __future__ import annotations

import bisect
import heapq
import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from parlab.errors import UsageError
from parlab.serve.policy import PolicyConfig
from parlab.serve.policy import Router as PolicyState
from parlab.serve.prefix import BlockLRU


@dataclass(frozen=True, kw_only=True)
class ReplicaProfile:
    """Measured iteration times of one replica (``Engine.profile``)."""

    prefill_base_s: float
    """Fixed cost of prefilling one request."""
    prefill_per_token_s: float
    """Cost per uncached prompt token."""
    decode_base_s: float
    """Fixed cost of a decode iteration."""
    decode_per_seq_s: float
    """Cost per running request in a decode iteration."""
    prefill_per_cached_token_s: float = 0.0
    """Cost per prompt token taken from the prefix cache (its KV copied in, attended to)."""
    decode_per_token_s: float = 0.0
    """Cost per context token of the running batch in a decode iteration (attention reads)."""
    max_batch: int = 16
    """KV slots."""
    max_prefill_tokens: int = 8192
    """Prefill token budget per iteration."""
    block: int = 16
    """Prefix-cache block, tokens."""
    cache_blocks: int = 4096
    """Prefix-cache capacity, blocks (0: no prefix cache)."""
    decode_bucket_s: tuple[tuple[int, float], ...] | None = None
    """``(L, seconds)`` per key-length bucket of a static (CUDA-graph) decode, ascending in
    ``L``; None: an eager decode (the linear cost). When set, a decode iteration costs the
    seconds of the smallest ``L`` above its longest running request's length (prompt plus
    tokens generated so far, as the engine's ``_decode_slots`` picks its graph), whatever
    the batch; a length at or past the largest ``L`` is charged the largest (the engine's
    last bucket is ``max_len``, which no running request reaches). From ``Engine.profile``
    (every bucket of the engine) or ``fit_profile`` (the buckets its log saw)."""

    prefill_overlap: bool = False
    """How a request's prefill terms combine: False, they add (``base + per_token * uncached
    + per_cached_token * cached``: ``fit_profile``'s least squares); True, the fixed host
    cost and the per-token GPU work overlap (``max(base, per_token * uncached) +
    per_cached_token * cached``): the host enqueues every layer's kernels whatever the
    length, and the GPU runs them meanwhile, so a prompt costs its GPU work only once that
    exceeds the host's time (``Engine.profile``'s prefill model)."""

    prefill_bucket_s: tuple[tuple[int, int, float], ...] | None = None
    """``(Q, L, seconds)`` per pair of a static (CUDA-graph) prefill: ``Q`` new tokens (the
    request's uncached ones, zero-padded) attending over ``L`` keys of its slot, or, with
    ``L = 0``, a miss's ``Q`` tokens attending causally to themselves; None: an eager
    prefill. When set, a request's prefill costs the seconds of its pair -- a miss: the
    smallest ``Q`` of ``L = 0`` that holds its prompt; a hit: the smallest ``Q`` that holds
    its uncached tokens, and the smallest ``L`` of that ``Q`` that holds its whole prompt, as
    the engine's ``_prefill_slot`` picks its graph -- plus the additive host
    terms ``prefill_base_s + prefill_per_token_s * uncached + prefill_per_cached_token_s *
    cached`` (what the engine does around the replay: hashing the prompt, copying its cached
    blocks in, storing its new ones). From ``Engine.profile`` (every pair: their replays
    timed, the host terms fitted to its prefills' remainder)."""

    loop_base_s: float = 0.0
    """The serving loop's cost per iteration beyond the engine's modelled one (the hand-off to
    the engine thread and back, streaming the new tokens, the wait for the next iteration),
    fixed part; added to every prefill and decode iteration."""
    loop_per_seq_s: float = 0.0
    """The same, per request that gets a token in the iteration (the decode batch, or the
    requests a prefill iteration admitted). Both from ``loop_overhead`` on a short probe of
    the replica's own serving loop; 0: the engine alone, as ``Engine.profile`` times it."""
    path_s: float = 0.0
    """A request's way from the client through the router to the replica's engine and its
    first token's way back (HTTP, the router, the replica's hand-off), seconds: added to
    every request's TTFT and end-to-end latency. From ``loop_overhead``'s lone requests
    (their TTFT as the client saw it less their prefill iteration as the replica's serving
    loop did); 0: the replica alone."""
    _pairs: Any = field(default=None, init=False, repr=False, compare=False)
    """``prefill_pair_s``'s lookup (``__post_init__``): the misses' prompt lengths and seconds,
    and each hit query length's key lengths and seconds."""

    def prefill_s(self, uncached: int, cached: int) -> float:
        """Seconds of one request's prefill (``prefill_bucket_s``, else ``prefill_overlap``,
        say how the terms add)."""
        work = self.prefill_per_token_s * uncached
        if self.prefill_bucket_s is not None:
            host = self.prefill_base_s + work + self.prefill_per_cached_token_s * cached
            return self.prefill_pair_s(uncached, uncached + cached) + host
        own = max(self.prefill_base_s, work) if self.prefill_overlap else self.prefill_base_s + work
        return own + self.prefill_per_cached_token_s * cached

    def prefill_pair_s(self, new: int, total: int) -> float:
        """The replay seconds of the static prefill pair for ``new`` uncached tokens of a
        ``total``-token prompt (the largest ``Q``, or ``L``, where none holds it; a miss
        without ``L = 0`` pairs is priced as a hit)."""
        misses, hits = self._pairs
        if new == total and misses[0]:
            qs, secs = misses
            return secs[min(bisect.bisect_left(qs, new), len(qs) - 1)]
        qs = sorted(hits)
        q = qs[min(bisect.bisect_left(qs, new), len(qs) - 1)]
        ls, secs = hits[q]
        return secs[min(bisect.bisect_left(ls, total), len(ls) - 1)]

    def __post_init__(self) -> None:
        pairs: dict[int, tuple[list[int], list[float]]] = {}
        misses: tuple[list[int], list[float]] = ([], [])
        if self.prefill_bucket_s is not None:
            seen: set[tuple[int, int]] = set()
            for Q, L, t in sorted(self.prefill_bucket_s):
                if (0 < L < Q) or t < 0 or (Q, L) in seen:
                    raise ValueError(
                        "prefill_bucket_s: give (Q, L, seconds) triples, L >= Q (or 0: a miss), "
                        f"each pair once, seconds >= 0; got {self.prefill_bucket_s!r}"
                    )
                seen.add((Q, L))
                ls, secs = misses if L == 0 else pairs.setdefault(Q, ([], []))
                ls.append(Q if L == 0 else L)
                secs.append(t)
            if not pairs:
                raise ValueError("prefill_bucket_s: give at least one (Q, L >= Q, seconds) triple")
        object.__setattr__(self, "_pairs", (misses, pairs))
        if self.decode_bucket_s is not None:
            ls = [L for L, _ in self.decode_bucket_s]
            if not ls or ls != sorted(set(ls)) or any(s < 0 for _, s in self.decode_bucket_s):
                raise ValueError(
                    "decode_bucket_s: give (L, seconds) pairs, L ascending and distinct, "
                    f"seconds >= 0; got {self.decode_bucket_s!r}"
                )

    @classmethod
    def from_json(cls, data: dict[str, Any], **over: Any) -> ReplicaProfile:
        """A profile from ``Engine.profile``'s or ``fit_profile``'s dictionary (or its JSON:
        ``decode_bucket_s`` as ``{L: seconds}``, its keys strings or ints, or as pairs;
        ``prefill_bucket_s`` as ``[Q, L, seconds]`` triples);
        fields it lacks keep their defaults, ``over`` sets any field."""
        keys = ("prefill_base_s", "prefill_per_token_s", "decode_base_s", "decode_per_seq_s")
        extra = (
            "prefill_per_cached_token_s",
            "decode_per_token_s",
            "loop_base_s",
            "loop_per_seq_s",
            "path_s",
        )
        buckets = data.get("decode_bucket_s")
        if buckets is not None:
            pairs = buckets.items() if isinstance(buckets, dict) else buckets
            over = {"decode_bucket_s": tuple(sorted((int(L), float(t)) for L, t in pairs)), **over}
        if data.get("prefill_overlap"):
            over = {"prefill_overlap": True, **over}
        if data.get("prefill_bucket_s") is not None:
            triples = tuple((int(q), int(L), float(t)) for q, L, t in data["prefill_bucket_s"])
            over = {"prefill_bucket_s": triples, **over}
        return cls(
            **{k: float(data[k]) for k in keys},
            **{k: float(data[k]) for k in extra if k in data},
            **over,
        )

    def decode_step_s(self, batch: int, context: float, longest: int) -> float:
        """Seconds of one decode iteration: ``batch`` running requests holding ``context``
        tokens in all, the longest ``longest`` (its bucket's seconds with
        ``decode_bucket_s``, else the linear cost), plus the serving loop's (``loop_s``)."""
        return self.engine_decode_s(batch, context, longest) + self.loop_s(batch)

    def engine_decode_s(self, batch: int, context: float, longest: int) -> float:
        """``decode_step_s`` without the serving loop's part (``loop_s``)."""
        if self.decode_bucket_s is not None:
            ls = [L for L, _ in self.decode_bucket_s]
            j = min(bisect.bisect_right(ls, longest), len(ls) - 1)
            return self.decode_bucket_s[j][1]
        return (
            self.decode_base_s + self.decode_per_seq_s * batch + self.decode_per_token_s * context
        )

    def loop_s(self, requests: int) -> float:
        """The serving loop's seconds around one iteration that gives ``requests`` a token."""
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
    """The serving loop's cost per iteration (``ReplicaProfile.loop_base_s`` and
    ``loop_per_seq_s``) from the iteration log of a replica that served real requests (its
    ``wall`` and ``gap``, as the serving loop saw them) and the engine's own costs in
    ``engine`` (its idle profile): least squares, non-negative, of ``wall + gap -`` the
    iteration's engine cost (a static decode's bucket, else the linear decode cost; a prefill
    of one request, ``prefill_s``) against the requests that got a token. Prefill iterations
    of several requests are left out (the log sums their tokens)."""
    rows: list[tuple[float, float]] = []
    for e in log:
        if "wall" not in e:
            continue
        if e["kind"] == 1:
            graph = int(e.get("graph", 0))
            cost = engine.engine_decode_s(int(e["batch"]), e["tokens"], max(graph - 1, 0))
            if graph and engine.decode_bucket_s is None:
                continue  # a static decode without the table that prices it
        elif e["batch"] == 1:
            cost = engine.prefill_s(int(e["tokens"]), int(e.get("cached", 0)))
        else:
            continue
        rows.append((e["batch"], e["wall"] + e.get("gap", 0.0) - cost))
    if len(rows) < 2:
        raise ValueError("fit_loop needs the log of at least two served iterations")
    a = np.asarray(rows, dtype=float)
    base, per_seq = nonneg_lstsq(np.column_stack([np.ones(len(a)), a[:, 0]]), a[:, 1])
    return {
        "loop_base_s": float(base),
        "loop_per_seq_s": float(per_seq),
        "loop_iterations": len(rows),
        "loop_median_s": float(statistics.median(a[:, 1])),
    }


def fit_profile(log: list[dict[str, float]]) -> dict[str, Any]:
    """Iteration costs from an engine's iteration log (``GET /engine/log``), least squares
    with non-negative costs: prefill iteration ``s = base * requests + per_token * uncached
    tokens + per_cached_token * cached tokens``, decode ``s = base + per_seq * batch +
    per_token * context tokens``, where ``s`` is the iteration's wall time as the serving
    loop saw it plus the gap before it (the serving loop's overhead), where logged, else its
    compute time; ``cached`` is 0 where the log does not say. Where decode iterations ran a
    static decode (``graph``: its bucket, > 0), also ``decode_bucket_s``: the median cost
    ``s`` (as above) of each bucket seen, ``{L: seconds}`` (absent otherwise); the simulator then prices decode
    iterations by it (``ReplicaProfile.decode_bucket_s``). The profile of a replica *under
    the run's own conditions*."""
    pre = [e for e in log if e["kind"] == 0]
    dec = [e for e in log if e["kind"] == 1]
    if not pre or not dec:
        raise ValueError("the iteration log needs prefill and decode iterations")

    def cost(e: dict[str, float]) -> float:
        return e.get("wall", e["s"]) + e.get("gap", 0.0)

    a = np.asarray([[e["batch"], e["tokens"], e.get("cached", 0)] for e in pre], dtype=float)
    pb, pt, pc = nonneg_lstsq(a, np.asarray([cost(e) for e in pre]))
    b = np.asarray([[1.0, e["batch"], e["tokens"]] for e in dec], dtype=float)
    db, ds, dt = nonneg_lstsq(b, np.asarray([cost(e) for e in dec]))
    out: dict[str, Any] = {
        "prefill_base_s": float(pb),
        "prefill_per_token_s": float(pt),
        "prefill_per_cached_token_s": float(pc),
        "decode_base_s": float(db),
        "decode_per_seq_s": float(ds),
        "decode_per_token_s": float(dt),
    }
    graphs: dict[int, list[float]] = {}
    for e in dec:
        if e.get("graph", 0) > 0:
            graphs.setdefault(int(e["graph"]), []).append(cost(e))
    if graphs:
        out["decode_bucket_s"] = {L: statistics.median(c) for L, c in sorted(graphs.items())}
    return out


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
    from parlab.serve.engine import encode
    from parlab.serve.prefix import block_hashes

    reqs = dataset.requests
    return Workload(
        arrival=np.asarray(arrival, dtype=np.float64),
        prompt_len=np.asarray([len(encode(r.prompt)) for r in reqs]),
        output_len=np.asarray([r.output_len for r in reqs]),
        hashes=[block_hashes(encode(r.prompt), block) for r in reqs],
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
    ctx: int = 0  # sum over running requests of (prompt length - step at which it joined)
    # with decode buckets: a heap of (step at which r joined - its prompt length, r) over the
    # requests that joined, finished ones popped lazily; its top gives the longest running
    # request's length at step s: s - top (the engine's seq.length: prompt + decode steps)
    by_length: list[tuple[int, int]] = field(default_factory=list)


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
    gone = bytearray(n)  # r finished decoding (``_Rep.by_length`` drops it lazily)
    bucket_ls = [L for L, _ in p.decode_bucket_s] if p.decode_bucket_s is not None else []
    bucket_s = [t for _, t in p.decode_bucket_s] if p.decode_bucket_s is not None else []
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
                dur = 0.0
                budget = p.max_prefill_tokens
                adm = rep.admitted
                while rep.waiting and (is_prefill_only[i] or len(adm) < free):
                    r = rep.waiting[0]
                    plen = int(work.prompt_len[r])
                    if adm and plen - 0 > budget:
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
                dur += p.loop_s(len(adm))
                rep.busy, rep.kind = True, 0
                rep.version += 1
                push(now + dur, _END, i, rep.version)
                return
        if rep.running:
            b = len(rep.running)
            k = max(1, rep.running[0][0] - rep.steps)
            if bucket_ls:
                # the bucket of the longest running request (ReplicaProfile.decode_step_s);
                # the leap ends where that request's length reaches the bucket, so each
                # step is charged its own bucket
                top = rep.by_length
                while gone[top[0][1]]:
                    heapq.heappop(top)
                longest = rep.steps - top[0][0]
                j = bisect.bisect_right(bucket_ls, longest)
                if j < len(bucket_ls):
                    k = min(k, bucket_ls[j] - longest)
                t = bucket_s[min(j, len(bucket_s) - 1)] + p.loop_s(b)
            else:
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
        rep.ctx += int(work.prompt_len[r]) - rep.steps
        if bucket_ls:
            heapq.heappush(rep.by_length, (rep.steps - int(work.prompt_len[r]), r))

    def finish_req(r: int, now: float) -> None:
        finish[r] = now
        if disagg is None:
            router.done(int(front[r]))
        else:
            assert dec_router is not None
            dec_router.done(int(back[r]) - n_front)

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
                rep.steps += rep.leap_k
                while rep.running and rep.running[0][0] <= rep.steps:
                    _, r = heapq.heappop(rep.running)
                    rep.ctx -= int(work.prompt_len[r]) - int(joined[r])
                    gone[r] = 1
                    finish_req(r, now)
                    if is_decode_only[i]:
                        rep.served += 1
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
