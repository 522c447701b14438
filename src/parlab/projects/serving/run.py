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

Steps 3 and 4 live in ``policies.py`` and ``failover.py``; this module runs them in order.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from parlab.contract import Document, write_result
from parlab.dtypes import TENSOR_DTYPE_OF
from parlab.errors import UsageError
from parlab.projects.serving import documents, rank
from parlab.projects.serving.config import ALL_POLICIES, Preset, get_preset
from parlab.projects.serving.failover import run_failover
from parlab.projects.serving.policies import bench_config, run_policies
from parlab.projects.serving.report import write_report
from parlab.serve import bench, datasets, sim
from parlab.serve.policy import PolicyConfig
from parlab.serve.procs import ReplicaProcess, get_json, post_json
from parlab.serve.router import Router, RouterConfig


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
        await bench.arun(bench_config(url, max_concurrency=conc, seed=conc), ds)
    loop = sim.fit_loop(await get_json(url + "/engine/log"), sim.ReplicaProfile.from_json(profile))
    await post_json(url + "/engine/reset")
    router = Router(RouterConfig(replicas=(url,), policy=PolicyConfig(name="round_robin")))
    await router.start()
    try:
        lone = datasets.synthetic(num_prompts=8, input_len=32, output_len=1, seed=7)
        res = await bench.arun(bench_config(router.url, max_concurrency=1, seed=1), lone)
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
        write_result(d, root)
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
