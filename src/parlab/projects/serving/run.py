"""``parlab project serving``: PAR-DISTRIBUTED-INFERENCE end to end.

1. Starts N reference replicas as child processes (CPU: the ``tiny`` model, 2 replicas;
   GPU: one per GPU), each on 127.0.0.1 with a free port -- or takes running replicas of
   any OpenAI-compatible engine (``--replicas URL,...``: vLLM, SGLang, transformers, ...),
   and records each one's engine and version.
2. Profiles replica 0 where it is parlab's (``POST /engine/profile``: step costs, the
   simulator's input) and probes its serving loop and a request's path (``loop_probe``).
3. For each routing policy: empties every replica's prefix cache, starts the router in this
   process, sends the same seeded shared-prefix workload through it (vLLM's arrival
   schedule) and writes one ``serving-benchmark`` document with the client's metrics (vLLM's
   definitions), the router's per-replica load, estimated cache hits and overhead, and -- as
   ``predictions`` -- what the simulator said for the same arrivals.
4. Failover (parlab's replicas): round robin while the last replica is killed; its
   in-flight requests must fail, each once, new ones go elsewhere; it is restarted on its
   port and must rejoin and serve again.
5. Measures the KV-cache transfer between two ranks and simulates colocated against
   disaggregated serving on it (an ``analytic`` document).
6. Writes a report comparing the policies (``report.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from parlab.contract import Document
from parlab.dtypes import TENSOR_DTYPE_OF
from parlab.errors import UsageError
from parlab.projects.serving import documents, rank
from parlab.projects.serving.config import ALL_POLICIES, Preset, get_preset
from parlab.projects.serving.report import write_report
from parlab.serve import bench, datasets, sim
from parlab.serve.policy import PolicyConfig
from parlab.serve.procs import ReplicaProcess, get_json, post_json, restart_replica
from parlab.serve.router import Router, RouterConfig


def _bench(base: str, **kw: Any) -> bench.BenchConfig:
    return bench.BenchConfig(base_url=base, progress=False, request_timeout_s=120.0, **kw)


async def loop_probe(url: str, p: Preset, profile: dict[str, Any]) -> dict[str, Any]:
    """What the idle profile does not see, from a short probe of the replica at ``url``: the
    serving loop's cost per step (``sim.fit_loop``: the hand-offs to the engine thread and
    back, streaming each token) and a request's path from the client through a router and
    back (``path_s``). Random 32-token prompts, streamed over HTTP from this process: 16
    tokens each in a closed loop of 2 and then of ``max_batch`` requests, straight to the
    replica; then 8 lone requests of one token through a one-replica router, the path being
    each one's TTFT as the client saw it less its step as the serving loop saw it (the
    median). The replica's log and prefix cache are reset before and after."""
    await post_json(url + "/engine/reset")
    for conc in (2, p.max_batch):
        ds = datasets.synthetic(num_prompts=3 * conc, input_len=32, output_len=16, seed=conc)
        await bench.arun(_bench(url, max_concurrency=conc, seed=conc), ds)
    loop = sim.fit_loop(await get_json(url + "/engine/log"), sim.ReplicaProfile.from_json(profile))
    await post_json(url + "/engine/reset")
    router = Router(RouterConfig(replicas=(url,), policy=PolicyConfig(name="round_robin")))
    await router.start()
    try:
        lone = datasets.synthetic(num_prompts=8, input_len=32, output_len=1, seed=7)
        res = await bench.arun(_bench(router.url, max_concurrency=1, seed=1), lone)
    finally:
        await router.stop()
    steps = [e for e in await get_json(url + "/engine/log") if e["kind"] == 0]
    await post_json(url + "/engine/reset")
    ok = [o for o in res.outcomes if o.success]
    if len(ok) != len(lone.requests) or len(steps) != len(ok):
        raise RuntimeError(
            f"path probe: {len(ok)} of {len(lone.requests)} lone requests answered, "
            f"{len(steps)} prefill steps logged"
        )
    paths = [o.ttft - e["wall"] for o, e in zip(ok, steps, strict=True)]
    return {**loop, "path_s": float(max(0.0, statistics.median(paths))), "path_samples": paths}


def _workload(p: Preset, seed: int, n: int) -> datasets.Dataset:
    groups = max(1, min(p.groups, n))
    return datasets.shared_prefix(
        num_groups=groups,
        prompts_per_group=max(1, n // groups),
        prefix_len=p.prefix_len,
        question_len=p.question_len,
        output_len=p.output_len,
        seed=seed,
    )


async def _route(
    urls: list[str], name: str, p: Preset, ds: datasets.Dataset
) -> tuple[bench.BenchResult, bench.BenchConfig, dict[str, Any]]:
    """The workload through a router of ``name``: the result, its config, the router's
    stats."""
    pol = PolicyConfig(name=name, seed=0, tree_blocks=max(1, p.cache_blocks))
    router = Router(RouterConfig(replicas=tuple(urls), policy=pol))
    await router.start()
    cfg = _bench(router.url, request_rate=p.rate, seed=0, max_duration_s=300.0)
    try:
        res = await bench.arun(cfg, ds)
    finally:
        stats = router.stats()
        await router.stop()
    return res, cfg, stats


async def run_policies(
    urls: list[str],
    engines: list[dict[str, Any]],
    p: Preset,
    policies: list[str],
    profile: dict[str, Any] | None,
    console: Console,
    command: str,
) -> list[Document]:
    """One document per policy (see the module docstring, step 3)."""
    ds = _workload(p, 0, p.num_prompts)
    offsets = bench.arrival_offsets(len(ds.requests), rate=p.rate, burstiness=1.0, seed=0)
    work = sim.from_dataset(ds, offsets, block=16)
    shape = {"max_batch": p.max_batch, "block": 16, "cache_blocks": p.cache_blocks}
    prof = sim.ReplicaProfile.from_json(profile, **shape) if profile else None
    parlab_replicas = all(e["engine"] == "parlab" for e in engines)
    if p.warmup_prompts:
        # a discarded pass of the same shape (other prompts): without it the first measured
        # policy alone pays the replicas' cold start (allocator growth, first-seen shapes)
        await _route(urls, "round_robin", p, _workload(p, 1, p.warmup_prompts))
    docs: list[Document] = []
    calibration: tuple[dict[str, Any], str] | None = None
    for name in policies:
        resets = [await rank.reset_cache(u) for u in urls]
        res, cfg, stats = await _route(urls, name, p, ds)
        pol = PolicyConfig(name=name, seed=0, tree_blocks=max(1, p.cache_blocks))
        pred = pred_run = eng = None
        if prof is not None:
            pred = sim.simulate(work, replicas=len(urls), profile=prof, policy=pol)
        if parlab_replicas:
            eng = [await get_json(u + "/engine/stats") for u in urls]
            logs = [e for u in urls for e in await get_json(u + "/engine/log")]
            if calibration is None:
                with contextlib.suppress(ValueError):  # a run with no decode step
                    calibration = (sim.fit_profile(logs), name)
            if calibration is not None:
                fitted = sim.ReplicaProfile.from_json(calibration[0], **shape)
                run = sim.simulate(work, replicas=len(urls), profile=fitted, policy=pol)
                pred_run = (run, calibration[1])
        doc = bench.to_document(
            res,
            cfg,
            ds,
            command=command,
            role="baseline" if name == policies[0] else "candidate",
            layout={
                "world_size": len(urls),
                "mesh": {"replica": len(urls)},
                "strategy": f"router:{name}",
                "policy": name,
                "replicas": len(urls),
                "engines": engines,
                "model": engines[0].get("model"),
                "max_batch": p.max_batch if parlab_replicas else None,
                "prefix_cache_blocks": p.cache_blocks if parlab_replicas else None,
            },
            notes=[
                *(["predictions: discrete-event simulation (parlab.serve.sim) of the same "
                   "arrivals, from replica 0's measured step profile"] if pred else []),
                *([f"measured after a discarded round-robin pass of {p.warmup_prompts} "
                   "requests of the same shape (the replicas' cold start)"]
                  if p.warmup_prompts else []),
                *([f"prefix cache not reset between policies on {u} (no reset endpoint)"
                   for u, r in zip(urls, resets, strict=True) if r is None]),
            ],
        )  # fmt: skip
        doc = documents.policy_document(
            doc, stats=stats, engine_stats=eng, pred=pred, pred_run=pred_run, profile=profile,
            name=name,
        )  # fmt: skip
        docs.append(doc)
        s = res.summary
        sim_note = "" if pred is None else f" (sim {pred['mean_ttft_ms']:.1f})"
        console.print(
            f"{name:>18}: {s['completed']}/{len(ds.requests)} ok, "
            f"{s['request_throughput']:.2f} req/s, TTFT mean {s['mean_ttft_ms']:.1f} ms{sim_note}, "
            f"TPOT mean {s['mean_tpot_ms']:.2f} ms, cache hit {s['cache_hit_rate'] or 0:.1%}, "
            f"load {[r['routed'] for r in stats['replicas']]}"
        )
    return docs


async def run_failover(
    procs: list[ReplicaProcess], p: Preset, command: str, console: Console
) -> Document:
    """Round robin over the replicas; the last is killed (SIGKILL) a third of the way
    through the arrivals; then restarted on its port, it must rejoin and serve again."""
    urls = [r.url for r in procs]
    for u in urls:
        await post_json(u + "/engine/reset")
    ds = datasets.synthetic(
        num_prompts=max(12, int(3 * p.rate)),  # 3 s of arrivals: 2 s of them after the kill
        input_len=p.question_len * 4,
        output_len=p.output_len * 4,  # long enough that some are in flight at the kill
        seed=1,
    )
    pol = PolicyConfig(name="round_robin")
    router = Router(RouterConfig(replicas=tuple(urls), policy=pol, health_interval_s=0.25))
    await router.start()
    cfg = _bench(router.url, request_rate=p.rate)
    kill_at = len(ds.requests) / p.rate / 3

    async def killer() -> float:
        await asyncio.sleep(kill_at)
        procs[-1].kill()
        return time.perf_counter()

    try:
        res, t_kill = await asyncio.gather(bench.arun(cfg, ds), killer())
        procs[-1] = await asyncio.to_thread(restart_replica, procs[-1])
        deadline = time.monotonic() + 120
        while not router.state.alive[-1] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        again = datasets.synthetic(num_prompts=4 * len(urls), input_len=32, output_len=4, seed=2)
        res2 = await bench.arun(_bench(router.url, request_rate=p.rate * 2), again)
    finally:
        stats = router.stats()
        await router.stop()
    s = res.summary
    unaccounted = len(ds.requests) - s["completed"] - s["failed"]
    # by then the router has taken the replica out (two missed checks, 0.25 s apart)
    late = [o for o in res.outcomes if o.start > t_kill + 0.6]
    late_ok = sum(o.success for o in late)
    rejoined = res2.replicas.get(urls[-1], 0) if res2.summary["failed"] == 0 else 0
    doc = bench.to_document(
        res,
        cfg,
        ds,
        command=command,
        role="candidate",
        layout={
            "world_size": len(urls),
            "strategy": "router:round_robin-failover",
            "policy": "round_robin",
            "replicas": len(urls),
            "killed_replica": len(urls) - 1,
            "model": p.model,
        },
        notes=[
            f"replica {len(urls) - 1} was killed (SIGKILL) {kill_at:.1f} s into the arrivals, "
            f"then restarted on its port; {rejoined} of {len(again.requests)} later requests "
            "went to it"
        ],
    )
    metrics = documents.failover_metrics(stats, unaccounted, len(late), late_ok, rejoined)
    doc = documents.with_metrics(doc, metrics=metrics)
    reps = stats["replicas"]
    console.print(
        f"{'failover':>18}: {s['completed']} ok, {s['failed']} failed, {unaccounted} "
        f"unaccounted of {len(ds.requests)}; after the kill {late_ok}/{len(late)} ok; "
        f"failed {[r['failed'] for r in reps]}; rejoined, it served {rejoined}"
    )
    return doc


def disagg(
    profile: dict[str, Any], kv: Document, p: Preset, replicas: int, command: str
) -> Document:
    """Colocated against the prefill/decode split in the simulator, at about 70 % of what
    ``replicas`` colocated replicas sustain on the workload, least-outstanding routing."""
    n = max(2, replicas)
    bw = (kv.metric("kv_transfer_bandwidth") or kv.metric("kv_transfer_algbw_peak") or 1.0) * 1e9
    prof = sim.ReplicaProfile.from_json(
        profile, max_batch=p.max_batch, block=16, cache_blocks=p.cache_blocks
    )
    mid = p.prefix_len + p.question_len + p.output_len // 2
    step = prof.decode_step_s(p.max_batch, p.max_batch * mid)
    per_rep = 1.0 / (
        prof.prefill_s(p.prefix_len + p.question_len, 0) + step * p.output_len / p.max_batch
    )
    rate = 0.7 * n * per_rep
    w = sim.shared_prefix_arrays(
        n=4000, groups=max(64, p.groups), prefix_len=p.prefix_len, question_len=p.question_len,
        output_len=p.output_len, rate=rate,
    )  # fmt: skip
    pol = PolicyConfig(name="least_outstanding")
    split = sim.Disaggregation(
        prefill_replicas=n // 2,
        decode_replicas=n - n // 2,
        kv_bytes_per_token=int(kv.metric("kv_bytes_per_token") or 0),
        kv_base_s=kv.metric("kv_transfer_base") or 0.0,
        kv_bandwidth=bw,
    )
    col = sim.simulate(w, replicas=n, profile=prof, policy=pol)
    dis = sim.simulate(w, replicas=n, profile=prof, policy=pol, disagg=split)
    workload = {
        "requests": len(w.arrival),
        "rate": rate,
        "prefix_len": p.prefix_len,
        "question_len": p.question_len,
        "output_len": p.output_len,
        "profile": {k: v for k, v in profile.items() if k != "samples"},
    }
    return documents.disagg_document(
        (col, dis), workload=workload, kv=kv, p=p, n=n, command=command
    )


def _profile_line(profile: dict[str, Any]) -> str:
    ms = {k: profile.get(k, 0.0) * 1e3 for k in sim.PROFILE_TERMS}
    return (
        f"replica profile: step {ms['decode_base_s']:.3f} ms + {ms['decode_per_seq_s']:.4f} "
        f"ms/decoding request + {ms['decode_per_token_s'] * 1e3:.4f} us/context token; "
        f"admitting {ms['prefill_base_s']:.3f} ms + {ms['prefill_per_token_s'] * 1e3:.3f} "
        f"us/prompt token + {ms['prefill_per_cached_token_s'] * 1e3:.3f} us/cached token; "
        f"serving loop {profile['loop_base_s'] * 1e3:.3f} ms + "
        f"{profile['loop_per_seq_s'] * 1e3:.4f} ms/request a step; request path "
        f"{profile['path_s'] * 1e3:.3f} ms"
    )


def run_project(
    root: Path,
    *,
    preset: str | Preset = "cpu",
    policies: list[str] | None = None,
    num_prompts: int | None = None,
    request_rate: float | None = None,
    kv_transfer: bool = True,
    failover: bool = True,
    replicas: list[str] | None = None,
    console: Console | None = None,
    command: str | None = None,
) -> int:
    """Run the project; return the number of failed parts."""
    con = console or Console(stderr=True)
    p = preset if isinstance(preset, Preset) else get_preset(preset)
    over = {"num_prompts": num_prompts, "rate": request_rate, "replicas": tuple(replicas or ())}
    p = replace(p, **{k: v for k, v in over.items() if v})
    pols = policies or list(ALL_POLICIES)
    for name in pols:
        if name not in ALL_POLICIES:
            raise UsageError(f"policy {name!r} is not one of {', '.join(ALL_POLICIES)}")
    cmd = command or f"parlab project serving --results {root}"
    procs: list[ReplicaProcess] = []
    extra: list[Document] = []
    profile = None
    try:
        if p.replicas:
            urls = list(p.replicas)
        else:
            con.print(f"starting {len(p.devices)} {p.model} replicas on {', '.join(p.devices)}")
            procs = rank.start_replicas(p)
            urls = [r.url for r in procs]
        engines = [asyncio.run(rank.identify(u)) for u in urls]
        con.print(
            "replicas: " + "; ".join(f"{e['url']} {e['engine']} {e['version']}" for e in engines)
        )
        if engines[0]["engine"] == "parlab":
            profile = asyncio.run(post_json(urls[0] + "/engine/profile"))
            profile.update(asyncio.run(loop_probe(urls[0], p, profile)))
            con.print(_profile_line(profile))
        docs = asyncio.run(run_policies(urls, engines, p, pols, profile, con, cmd))
        if failover and len(procs) >= 2:
            extra.append(asyncio.run(run_failover(procs, p, cmd, con)))
    finally:
        for r in procs:
            r.stop()
    failed = sum(d.status != "ok" for d in docs)
    failed += sum(d.metric("requests_unaccounted") != 0 for d in extra)
    if kv_transfer and profile is not None:
        toks = ",".join(map(str, p.kv_tokens))
        kv = rank.measure_kv(
            model=p.model, dtype=p.dtype, tokens=list(p.kv_tokens), iters=5, timeout_s=120,
            command=f"parlab serve kv-transfer --model {p.model} --tensor-dtype "
            f"{TENSOR_DTYPE_OF[p.dtype]} "
            f"--tokens {toks} --iters 5",
        )  # fmt: skip
        extra.append(kv)
        if kv.status == "ok":
            con.print(f"KV transfer ({kv.evidence_level}): fitted bandwidth "
                      f"{kv.metric('kv_transfer_bandwidth')} GB/s")  # fmt: skip
            extra.append(disagg(profile, kv, p, len(urls), cmd))
        else:
            failed += 1
    for d in docs + extra:
        documents.write(d, root)
    con.print(f"report: {write_report(root, docs, extra)}")
    return failed


def demo_step(results: Path, console: Console) -> None:
    """CPU-sized serving project for ``parlab demo``."""
    p = replace(get_preset("cpu"), num_prompts=24, rate=8.0, kv_tokens=(16, 256))
    n = run_project(
        results,
        preset=p,
        policies=["round_robin", "least_outstanding", "cache_aware"],
        console=console,
        command=f"parlab project serving --results {results} "
        "--policies round_robin,least_outstanding,cache_aware --num-prompts 24",
    )
    if n:
        raise RuntimeError(f"{n} serving part(s) failed")
