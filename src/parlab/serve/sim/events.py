"""The simulation itself: a heap of events (arrivals, ends of steps, KV transfers) over the
replicas' queues and batches, and the vLLM-style summary of what it timed."""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from parlab.errors import UsageError
from parlab.serve.policy import PolicyConfig, PolicyState
from parlab.serve.prefix import BlockLRU
from parlab.serve.sim.profile import ReplicaProfile
from parlab.serve.sim.workload import Disaggregation, Workload


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


class _Sim:
    """One simulation's state: the replicas, the routers, per request its times; ``run``
    pops the events in time order."""

    def __init__(
        self,
        work: Workload,
        replicas: int,
        profile: ReplicaProfile,
        policy: PolicyConfig,
        disagg: Disaggregation | None,
    ) -> None:
        n = len(work.arrival)
        p = self.p = profile
        self.work, self.policy, self.disagg = work, policy, disagg
        self.n_front = n_front = disagg.prefill_replicas if disagg else replicas
        self.reps = [
            _Rep(cache=BlockLRU(p.cache_blocks) if p.cache_blocks > 0 else None)
            for _ in range(replicas)
        ]
        self.router = PolicyState(n_front, policy)
        self.dec_router = (
            PolicyState(disagg.decode_replicas, PolicyConfig(name="least_outstanding"))
            if disagg
            else None
        )
        self.ttft = np.zeros(n)
        self.finish = np.zeros(n)
        self.cached = np.zeros(n, dtype=np.int64)
        self.joined = np.zeros(n, dtype=np.int64)  # the replica's step count when r joined
        self.front = np.zeros(n, dtype=np.int64)
        self.back = np.zeros(n, dtype=np.int64)
        self.group_blocks: dict[int, list[int]] = {}
        self.fresh = 1 << 62
        self.events: list[tuple[float, int, int, int, int]] = [
            (float(work.arrival[r]), r, _ARRIVE, r, 0) for r in range(n)
        ]
        self.seq = n
        heapq.heapify(self.events)
        self.is_prefill_only = [disagg is not None and i < n_front for i in range(replicas)]
        self.is_decode_only = [disagg is not None and i >= n_front for i in range(replicas)]
        self.count = 0

    def hashes_of(self, r: int) -> list[int]:
        """Request ``r``'s prompt blocks: its own, or its group's prefix and fresh ones."""
        work = self.work
        if work.hashes is not None:
            return work.hashes[r]
        assert work.group is not None and work.prefix_len is not None
        g = int(work.group[r])
        gb = self.group_blocks.get(g)
        if gb is None:
            gb = [hash(("g", g, j)) for j in range(int(work.prefix_len[r]) // self.p.block)]
            self.group_blocks[g] = gb
        rest = int(work.prompt_len[r]) // self.p.block - len(gb)
        self.fresh += max(rest, 0)
        return gb + list(range(self.fresh - max(rest, 0), self.fresh))

    def push(self, t: float, kind: int, a: int, b: int) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, a, b))
        self.seq += 1

    # -- a replica's next step -----------------------------------------------------------------
    def start(self, i: int, now: float) -> None:
        """Begin replica ``i``'s next step at ``now``: a prefill (admitting), a decode leap,
        or idle."""
        rep, p = self.reps[i], self.p
        if rep.waiting and p.max_batch - len(rep.running) > 0:
            if not self.is_decode_only[i]:
                self._start_prefill(i, rep, now)
                return
            # KV arrived already: joining the batch costs nothing here
            while rep.waiting and len(rep.running) < p.max_batch:
                self.join(rep, rep.waiting.popleft())
        if rep.running:
            self._start_decode(i, rep, now)
            return
        rep.busy, rep.kind = False, -1

    def _start_prefill(self, i: int, rep: _Rep, now: float) -> None:
        """Admit waiting requests first come, first served, within the token budget."""
        p, work = self.p, self.work
        free = p.max_batch - len(rep.running)
        b = len(rep.running)
        dur = p.decode_base_s
        if b:  # the step also advances the running requests by a token
            dur += p.decode_per_seq_s * b + p.decode_per_token_s * (rep.ctx + b * rep.steps)
        budget = p.max_step_tokens - b
        adm = rep.admitted
        while rep.waiting and (self.is_prefill_only[i] or len(adm) < free):
            r = rep.waiting[0]
            plen = int(work.prompt_len[r])
            if adm and plen > budget:
                break
            rep.waiting.popleft()
            hs = self.hashes_of(r)
            hit = 0
            if rep.cache is not None:
                m = rep.cache.match(hs)
                m = min(m, (plen - 1) // p.block)
                hit = m * p.block
                rep.cache.insert(hs)
            self.cached[r] = hit
            dur += p.prefill_s(plen - hit, hit)
            budget -= plen - hit
            adm.append(r)
        dur += p.loop_s(len(adm) + b)
        rep.busy, rep.kind, rep.mixed = True, 0, b > 0
        rep.version += 1
        self.push(now + dur, _END, i, rep.version)

    def _start_decode(self, i: int, rep: _Rep, now: float) -> None:
        """Leap to the running batch's next completion (or until an arrival cuts it)."""
        p = self.p
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
        self.push(now + k * t, _END, i, rep.version)

    # -- requests --------------------------------------------------------------------------------
    def enqueue(self, i: int, r: int, now: float) -> None:
        """Request ``r`` waits at replica ``i``; a decode leap in progress ends at its step."""
        rep = self.reps[i]
        rep.waiting.append(r)
        if not rep.busy:
            self.start(i, now)
        elif rep.kind == 1 and len(rep.running) < self.p.max_batch:
            done = int((now - rep.leap_start) / rep.leap_t)
            if done + 1 < rep.leap_k:
                rep.leap_k = done + 1
                rep.version += 1
                self.push(rep.leap_start + rep.leap_k * rep.leap_t, _END, i, rep.version)

    def join(self, rep: _Rep, r: int) -> None:
        heapq.heappush(rep.running, (rep.steps + int(self.work.output_len[r]) - 1, r))
        self.joined[r] = rep.steps
        rep.ctx += int(self.work.prompt_len[r]) + 1 - rep.steps

    def finish_req(self, r: int, now: float) -> None:
        self.finish[r] = now
        if self.disagg is None:
            self.router.done(int(self.front[r]))
        else:
            assert self.dec_router is not None
            self.dec_router.done(int(self.back[r]) - self.n_front)

    def advance(self, i: int, rep: _Rep, k: int, now: float) -> None:
        """``k`` steps of the running requests ended at ``now``."""
        rep.steps += k
        while rep.running and rep.running[0][0] <= rep.steps:
            _, r = heapq.heappop(rep.running)
            rep.ctx -= int(self.work.prompt_len[r]) + 1 - int(self.joined[r])
            self.finish_req(r, now)
            if self.is_decode_only[i]:
                rep.served += 1

    def prefilled(self, i: int, rep: _Rep, r: int, now: float) -> None:
        """Request ``r``'s prefill ended at ``now``: its first token; then it decodes here,
        its KV goes to a decode replica, or it is done."""
        self.ttft[r] = now
        rep.served += 1
        out_len = int(self.work.output_len[r])
        if self.is_prefill_only[i]:
            disagg = self.disagg
            assert disagg is not None
            self.router.done(i)
            if out_len <= 1:
                self.finish[r] = now
                return
            xfer = (
                disagg.kv_base_s
                + int(self.work.prompt_len[r]) * disagg.kv_bytes_per_token / disagg.kv_bandwidth
            )
            self.push(now + xfer, _KV, r, 0)
        elif out_len <= 1:
            self.finish_req(r, now)
        else:
            self.join(rep, r)

    # -- the event loop --------------------------------------------------------------------------
    def step_ended(self, i: int, version: int, now: float) -> None:
        rep = self.reps[i]
        if version != rep.version:
            return  # a leap cut short by an arrival: its later end is stale
        if rep.kind == 0:
            if rep.mixed:
                self.advance(i, rep, 1, now)
            for r in rep.admitted:
                self.prefilled(i, rep, r, now)
            rep.admitted = []
        else:
            self.advance(i, rep, rep.leap_k, now)
        self.start(i, now)

    def run(self, max_events: int) -> None:
        events = self.events
        cache_aware = self.policy.name == "cache_aware"
        while events:
            self.count += 1
            if self.count > max_events:
                raise RuntimeError(f"simulation passed {max_events} events")
            now, _, kind, a, b = heapq.heappop(events)
            if kind == _ARRIVE:
                i, _ = self.router.choose(self.hashes_of(a) if cache_aware else ())
                self.router.start(i)
                self.front[a] = i
                self.enqueue(i, a, now)
            elif kind == _KV:
                assert self.dec_router is not None
                j, _ = self.dec_router.choose(())
                self.dec_router.start(j)
                self.back[a] = self.n_front + j
                self.enqueue(self.n_front + j, a, now)
            else:
                self.step_ended(a, b, now)


def _summary(sim: _Sim) -> dict[str, Any]:
    """vLLM's summary of the simulated times, plus the cache hit rate and the load per
    replica."""
    work, n = sim.work, len(sim.work.arrival)
    arr = work.arrival
    t_ttft = sim.ttft - arr + sim.p.path_s
    e2e = sim.finish - arr + sim.p.path_s
    out = work.output_len.astype(np.float64)
    multi = out > 1
    tpot = np.where(multi, (e2e - t_ttft) / np.maximum(out - 1, 1), 0.0)
    duration = float(sim.finish.max() - arr.min()) if n else 0.0
    res: dict[str, Any] = {
        "duration": duration,
        "completed": int(n),
        "request_throughput": n / duration if duration else math.inf,
        "output_throughput": float(out.sum()) / duration if duration else math.inf,
        "cache_hit_rate": float(sim.cached.sum() / max(1, work.prompt_len.sum())),
        "events": sim.count,
    }
    for name, arr_ in (("ttft", t_ttft), ("tpot", tpot[multi]), ("e2el", e2e)):
        a_ = (arr_ if len(arr_) else np.zeros(1)) * 1e3
        res[f"mean_{name}_ms"] = float(a_.mean())
        res[f"median_{name}_ms"] = float(np.median(a_))
        res[f"p90_{name}_ms"] = float(np.percentile(a_, 90))
        res[f"p99_{name}_ms"] = float(np.percentile(a_, 99))
    served = [rep.served for rep in sim.reps]
    res["per_replica_served"] = served
    res["load_imbalance"] = (
        float(max(served) / (sum(served) / len(served))) if sum(served) else None
    )
    return res


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
    if replicas < 1:
        raise UsageError("--replicas must be at least 1")
    if disagg is not None:
        if disagg.prefill_replicas < 1 or disagg.decode_replicas < 1:
            raise UsageError("disaggregated serving needs >= 1 prefill and >= 1 decode replica")
        replicas = disagg.prefill_replicas + disagg.decode_replicas
    sim = _Sim(work, replicas, profile, policy, disagg)
    sim.run(max_events)
    return _summary(sim)
