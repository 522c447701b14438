"""``parlab project serving``: PAR-DISTRIBUTED-INFERENCE end to end.

1. Starts N reference replicas as child processes (CPU: the ``tiny`` model,
   2 replicas; GPU: one replica per GPU), each on 127.0.0.1 with a free port.
2. Profiles replica 0 (``POST /engine/profile``: prefill and decode
   iteration times, prefills with the prefix cache on, decode per graph
   bucket where the replica decodes with CUDA graphs) -- the simulator's
   input, recorded in each policy document (``workload.replica_profile``).
3. For each routing policy: empties every replica's prefix cache, starts the
   router in this process, sends the same seeded shared-prefix workload
   through it (Poisson arrivals), and writes one ``serving-benchmark``
   document with the client's metrics (vLLM definitions), the router's
   per-replica load, estimated cache hits and overhead, and -- as
   ``predictions`` -- what the simulator said for the same arrivals
   (``sim:profile``), so the report shows the simulator's error.
4. Measures the KV-cache transfer between two ranks (NCCL send/recv on two
   GPUs, gloo on CPU) against request length, and feeds the fit to the
   simulator to compare colocated and disaggregated serving (an ``analytic``
   document: it is a simulation resting on the measured numbers).
5. Writes a markdown report comparing the policies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from parlab.contract import Document, Failure, Metric, Prediction, new_run_id, now_iso
from parlab.dtypes import TENSOR_DTYPE_OF

PROJECT = "PAR-DISTRIBUTED-INFERENCE"
ALL_POLICIES = ("round_robin", "random", "least_outstanding", "power_of_two", "cache_aware")


@dataclass(frozen=True, kw_only=True)
class Preset:
    """The sizes of one project run."""

    model: str
    """Reference model name."""
    devices: tuple[str, ...]
    """One replica per device."""
    dtype: str
    """Weights and KV dtype."""
    max_batch: int
    """KV slots per replica."""
    max_len: int
    """Longest prompt + output."""
    num_prompts: int
    """Requests per policy."""
    groups: int
    """Shared-prefix groups."""
    prefix_len: int
    """Shared prefix, tokens."""
    question_len: int
    """Unique part, tokens."""
    output_len: int
    """Output tokens."""
    rate: float
    """Requests/s."""
    kv_tokens: tuple[int, ...]
    """Request lengths for the KV transfer sweep."""
    cache_blocks: int = 4096
    """Prefix-cache capacity per replica, 16-token blocks (small: locality matters)."""
    warmup_prompts: int = 16
    """Requests of a discarded round-robin pass before the measured policies (0: none)."""


def get_preset(name: str) -> Preset:
    if name == "cpu":
        return Preset(
            model="tiny",
            devices=("cpu", "cpu"),
            dtype="float32",
            max_batch=8,
            max_len=1024,
            num_prompts=48,
            groups=8,
            prefix_len=384,
            question_len=32,
            output_len=16,
            rate=8.0,
            kv_tokens=(16, 64, 256, 1024),
            cache_blocks=128,
        )
    if name == "gpu":
        import torch

        n = torch.cuda.device_count()
        if n < 1:
            from parlab.errors import UsageError

            raise UsageError("--preset gpu needs a GPU: use --preset cpu here")
        return Preset(
            model="1.3b",
            devices=tuple(f"cuda:{i}" for i in range(n)),
            dtype="bfloat16",
            max_batch=32,
            max_len=4096,
            num_prompts=48,
            groups=16,
            prefix_len=2048,
            question_len=64,
            output_len=64,
            rate=16.0,
            kv_tokens=(16, 128, 512, 2048, 8192),
            cache_blocks=1024,
        )
    from parlab.errors import UsageError

    raise UsageError(f"--preset {name!r}: use cpu or gpu")


def _env() -> dict[str, Any]:
    from parlab.hardware.env import snapshot

    return snapshot(probe_links=False)


# ----- KV transfer -------------------------------------------------------------------------------


def kv_transfer_document(
    *, model: str, tokens: list[int], dtype: str, iters: int, timeout_s: float, command: str
) -> Document:
    """Launch two ranks, send one request's KV blocks 0 -> 1 per size, write the fit."""
    from parlab.models import get_spec
    from parlab.runtime.launch import LaunchConfig, launch
    from parlab.serve import kvxfer

    if dtype not in kvxfer.DTYPES:
        from parlab.errors import UsageError

        raise UsageError(f"--dtype {dtype!r} is not one of {', '.join(kvxfer.DTYPES)}")
    spec = get_spec(model)
    per_tok = kvxfer.kv_bytes_per_token(spec.layers, spec.n_kv_heads, spec.d_head, dtype)
    kwargs = {
        "tokens": tokens,
        "layers": spec.layers,
        "kv_heads": spec.n_kv_heads,
        "head_dim": spec.d_head,
        "dtype": dtype,
        "iters": iters,
    }
    cfg = LaunchConfig(nproc=2, backend="auto", timeout_s=timeout_s)
    backend = cfg.resolved_backend()
    res = launch("parlab.serve.kvxfer:rank_main", kwargs, cfg)
    level = "real-nccl" if backend == "nccl" else "cpu-mechanism"
    workload = {"model": model, "dtype": dtype, "kv_bytes_per_token": per_tok, **kwargs}
    layout = {"world_size": 2, "strategy": "kv-transfer", "backend": backend, "src": 0, "dst": 1}
    if not res.ok:
        return Document(
            run_id=new_run_id("serve-kvxfer"),
            created=now_iso(),
            project=PROJECT,
            task="T4",
            role="failure",
            evidence_level=level,
            command=command,
            environment=_env(),
            workload=workload,
            layout=layout,
            metrics={},
            status="failed",
            failure=res.failure or Failure(kind="crash", message="KV transfer failed"),
        )
    rows = next(r for r in res.results if r["rank"] == 1)["rows"]
    f = kvxfer.fit(rows)
    wrong = sum(r["wrong"] for r in rows)
    metrics = {
        "kv_transfer_bandwidth": Metric(
            value=None if f["bandwidth"] is None else f["bandwidth"] / 1e9, unit="GB/s"
        ),
        "kv_transfer_algbw_peak": Metric(
            value=max(r["bytes"] / r["time_s"] for r in rows) / 1e9, unit="GB/s"
        ),
        "kv_transfer_base": Metric(value=f["base_s"], unit="s"),
        "kv_bytes_per_token": Metric(value=float(per_tok), unit="B"),
        "kv_transfer_wrong": Metric(value=float(wrong), unit="count"),
    }
    for r in rows:
        metrics[f"kv_transfer_time_{r['tokens']}tok"] = Metric(value=r["time_s"], unit="s")
        metrics[f"kv_transfer_algbw_{r['tokens']}tok"] = Metric(
            value=r["bytes"] / r["time_s"] / 1e9, unit="GB/s"
        )
    ok = wrong == 0
    return Document(
        run_id=new_run_id("serve-kvxfer"),
        created=now_iso(),
        project=PROJECT,
        task="T4",
        role="baseline" if ok else "failure",
        evidence_level=level,
        command=command,
        environment=_env(),
        workload={**workload, "rows": rows},
        layout=layout,
        metrics=metrics,
        status="ok" if ok else "failed",
        failure=None if ok else Failure(kind="crash", message=f"{wrong} KV elements arrived wrong"),
        notes=[
            "time: receiver's dist.recv + device sync after a barrier, mean of the timed "
            "iterations; fit time = base + bytes / bandwidth (least squares)"
        ],
    )


# ----- the policy comparison -----------------------------------------------------------------------


def _replica_metrics(reps: list[dict[str, Any]]) -> dict[str, Metric]:
    """Requests the router sent to each replica (max over replicas) and the failures there."""
    return {
        "replica_load_routed": Metric(
            value=float(max(r["routed"] for r in reps)),
            unit="count",
            per_rank=[float(r["routed"]) for r in reps],
        ),
        "replica_failed": Metric(
            value=float(sum(r["failed"] for r in reps)),
            unit="count",
            per_rank=[float(r["failed"]) for r in reps],
        ),
    }


async def _get_json(url: str) -> dict[str, Any]:
    import aiohttp

    async with (
        aiohttp.ClientSession() as s,
        s.get(url, timeout=aiohttp.ClientTimeout(total=30)) as r,
    ):
        return await r.json()


async def loop_probe(url: str, p: Preset, profile: dict[str, Any]) -> dict[str, Any]:
    """What the idle profile does not see, from a short probe of the replica at ``url`` right
    after it: the serving loop's own cost per iteration (``sim.fit_loop``: the hand-offs to
    the engine thread and back, streaming each token) and a request's path from the client
    through a router and back (``path_s``). Random 32-token prompts, streamed over HTTP from
    this process: 16 tokens each in a closed loop of 2 and then of ``max_batch`` requests at
    once, straight to the replica; then 8 lone requests of one token each through a
    one-replica router, the path being each one's TTFT as the client saw it less its prefill
    iteration as the replica's serving loop saw it (the median). The replica's log and prefix
    cache are reset before and after. The probe shares no prompt, length or rate with the
    measured workload: it prices the serving machinery, not the workload."""
    import statistics

    from parlab.serve import bench, datasets, sim
    from parlab.serve.policy import PolicyConfig
    from parlab.serve.procs import post_json
    from parlab.serve.router import Router, RouterConfig

    def config(base: str, conc: int) -> bench.BenchConfig:
        return bench.BenchConfig(
            base_url=base,
            max_concurrency=conc,
            seed=conc,
            request_timeout_s=60.0,
            max_duration_s=60.0,
            progress=False,
        )

    await post_json(url + "/engine/reset")
    for conc in (2, p.max_batch):
        ds = datasets.synthetic(num_prompts=3 * conc, input_len=32, output_len=16, seed=conc)
        await bench.arun(config(url, conc), ds)
    loop = sim.fit_loop(await _get_json(url + "/engine/log"), sim.ReplicaProfile.from_json(profile))
    await post_json(url + "/engine/reset")
    router = Router(RouterConfig(replicas=(url,), policy=PolicyConfig(name="round_robin")))
    await router.start()
    try:
        lone = datasets.synthetic(num_prompts=8, input_len=32, output_len=1, seed=7)
        res = await bench.arun(config(router.url, 1), lone)
    finally:
        await router.stop()
    pre = [e for e in await _get_json(url + "/engine/log") if e["kind"] == 0]
    await post_json(url + "/engine/reset")
    ok = [o for o in res.outcomes if o.success]
    if len(ok) != len(lone.requests) or len(pre) != len(ok):
        raise RuntimeError(
            f"path probe: {len(ok)} of {len(lone.requests)} lone requests answered, "
            f"{len(pre)} prefill iterations logged"
        )
    paths = [o.ttft - e["wall"] for o, e in zip(ok, pre, strict=True)]
    return {**loop, "path_s": float(max(0.0, statistics.median(paths))), "path_samples": paths}


async def _run_policies(
    urls: list[str],
    p: Preset,
    policies: list[str],
    profile: dict[str, Any],
    root: Path,
    console: Console,
    command: str,
) -> list[Document]:
    from parlab.serve import bench, datasets, sim
    from parlab.serve.policy import PolicyConfig
    from parlab.serve.procs import post_json
    from parlab.serve.router import Router, RouterConfig

    ds = datasets.shared_prefix(
        num_groups=p.groups,
        prompts_per_group=max(1, p.num_prompts // p.groups),
        prefix_len=p.prefix_len,
        question_len=p.question_len,
        output_len=p.output_len,
        seed=0,
    )
    cfg = bench.BenchConfig(
        base_url="http://127.0.0.1:1",  # replaced per policy below
        request_rate=p.rate,
        seed=0,
        request_timeout_s=120.0,
        max_duration_s=300.0,
        progress=False,
    )
    offsets = bench.arrival_offsets(len(ds.requests), rate=p.rate, burstiness=1.0, seed=0)
    work = sim.from_dataset(ds, offsets, block=16)
    prof = sim.ReplicaProfile.from_json(
        profile, max_batch=p.max_batch, block=16, cache_blocks=p.cache_blocks
    )
    if p.warmup_prompts:
        # One discarded pass of the same workload shape (other prompts): without it the first
        # measured policy alone pays the replicas' cold start -- allocator growth, kernel
        # choices, first-seen shapes (on 2xH200 round-robin, always first, showed a p99 TTFT
        # 3-8x the other policies'), and the serving costs fitted on its log carry it too.
        warm = datasets.shared_prefix(
            num_groups=max(1, min(p.groups, p.warmup_prompts)),
            prompts_per_group=max(1, p.warmup_prompts // max(1, min(p.groups, p.warmup_prompts))),
            prefix_len=p.prefix_len,
            question_len=p.question_len,
            output_len=p.output_len,
            seed=1,
        )
        pol = PolicyConfig(name="round_robin", seed=0, tree_blocks=p.cache_blocks)
        router = Router(RouterConfig(replicas=tuple(urls), policy=pol, health_interval_s=0.5))
        await router.start()
        try:
            await bench.arun(bench.BenchConfig(**{**cfg.__dict__, "base_url": router.url}), warm)
        finally:
            await router.stop()
    docs = []
    calibration: tuple[dict[str, Any], str] | None = None
    for name in policies:
        for u in urls:
            await post_json(u + "/engine/reset")
        pol = PolicyConfig(name=name, seed=0, tree_blocks=p.cache_blocks)
        router = Router(RouterConfig(replicas=tuple(urls), policy=pol, health_interval_s=0.5))
        await router.start()
        try:
            run_cfg = bench.BenchConfig(**{**cfg.__dict__, "base_url": router.url})
            res = await bench.arun(run_cfg, ds)
        finally:
            stats = router.stats()
            await router.stop()
        eng = [await _get_json(u + "/engine/stats") for u in urls]
        pred = sim.simulate(work, replicas=len(urls), profile=prof, policy=pol)
        # the same simulation with the iteration costs the replicas showed while serving:
        # fitted on the first policy's run, then used unchanged for the later ones (for
        # those the prediction is out of sample)
        per_replica = [await _get_json(u + "/engine/log") for u in urls]
        logs = [e for log in per_replica for e in log]
        in_run, pred_run = None, None
        if calibration is None:
            with contextlib.suppress(ValueError):  # a run with no decode iteration
                calibration = (sim.fit_profile(logs), name)
        if calibration is not None:
            in_run = calibration[0]
            pred_run = sim.simulate(
                work,
                replicas=len(urls),
                profile=sim.ReplicaProfile.from_json(
                    in_run, max_batch=p.max_batch, block=16, cache_blocks=p.cache_blocks
                ),
                policy=pol,
            )
        reps = stats["replicas"]
        doc = bench.to_document(
            res,
            run_cfg,
            ds,
            command=command,
            role="baseline" if name == policies[0] else "candidate",
            layout={
                "world_size": len(urls),
                "mesh": {"replica": len(urls)},
                "strategy": f"router:{name}",
                "policy": name,
                "replicas": len(urls),
                "model": p.model,
                "devices": list(p.devices),
                "max_batch": p.max_batch,
                "prefix_cache": True,
                "prefix_cache_blocks": p.cache_blocks,
            },
            notes=[
                "predictions: discrete-event simulation (parlab.serve.sim) of the same "
                "arrivals, from replica 0's measured iteration profile",
                *(
                    [
                        f"measured after a discarded round-robin pass of {p.warmup_prompts} "
                        "requests of the same shape (the replicas' cold start)"
                    ]
                    if p.warmup_prompts
                    else []
                ),
            ],
        )
        extra = {
            "router_est_cache_hit_rate": Metric(value=stats["est_cache_hit_rate"], unit="fraction"),
            "router_decision_p99_ms": Metric(value=stats["decision"]["p99_ms"], unit="ms"),
            "router_pre_forward_p99_ms": Metric(value=stats["pre_forward"]["p99_ms"], unit="ms"),
            **_replica_metrics(reps),
            "replica_decode_batch_mean": Metric(
                value=None
                if any(e["decode_mean_batch"] is None for e in eng)
                else max(e["decode_mean_batch"] for e in eng),
                unit="count",
                per_rank=[e["decode_mean_batch"] for e in eng],
            ),
        }
        predictions = {
            k: Prediction(value=pred[k], unit="ms", model="sim:profile")
            for k in ("mean_ttft_ms", "mean_tpot_ms", "p99_ttft_ms", "mean_e2el_ms")
        }
        predictions["cache_hit_rate"] = Prediction(
            value=pred["cache_hit_rate"], unit="fraction", model="sim:profile"
        )
        if pred_run is not None:
            for k in ("mean_ttft_ms", "mean_tpot_ms"):
                predictions[f"{k}@in_run"] = Prediction(
                    value=pred_run[k],
                    unit="ms",
                    model=f"sim:serving-iteration-costs-from-{calibration[1]}"
                    + ("-in-sample" if calibration[1] == name else ""),
                )
        doc = Document(
            **{
                **doc.__dict__,
                "metrics": {**doc.metrics, **extra},
                "predictions": predictions,
                "workload": {
                    **doc.workload,
                    "replica_profile": {k: v for k, v in profile.items() if k != "samples"},
                },
                # every replica's iteration log, one JSON line per iteration (replica, kind 0
                # prefill / 1 decode, batch, tokens, the engine's seconds, the serving loop's
                # wall and gap), for refitting the simulator's costs offline
                "artifacts": {**doc.artifacts, "iteration_log": f"{doc.run_id}.iterations.jsonl"},
            }
        )
        from parlab.cli.common import write

        log_path = root / PROJECT / f"{doc.run_id}.iterations.jsonl"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(
            "".join(
                json.dumps({"replica": i, **e}) + "\n"
                for i, log in enumerate(per_replica)
                for e in log
            )
        )
        write(doc, root, quiet=True)
        s = res.summary
        run_ttft = run_tpot = ""
        if pred_run is not None:
            run_ttft = f" / fit {pred_run['mean_ttft_ms']:.1f}"
            run_tpot = f" / fit {pred_run['mean_tpot_ms']:.2f}"
        console.print(
            f"{name:>18}: {s['completed']}/{len(ds.requests)} ok, {s['request_throughput']:.2f} req/s, "
            f"TTFT mean {s['mean_ttft_ms']:.1f} ms (sim {pred['mean_ttft_ms']:.1f}{run_ttft}), "
            f"TPOT mean {s['mean_tpot_ms']:.2f} ms (sim {pred['mean_tpot_ms']:.2f}{run_tpot}), "
            f"cache hit {s['cache_hit_rate'] or 0:.1%}, load {[r['routed'] for r in reps]}"
        )
        docs.append(doc)
    return docs


async def _run_failover(
    procs: list[Any], p: Preset, root: Path, console: Console, command: str
) -> Document:
    """Round-robin over the replicas; the last one is killed (SIGKILL) a third of the way
    through the arrivals. Its in-flight requests must come back failed, each once; new
    ones must go to the others."""
    from parlab.contract import Metric
    from parlab.serve import bench, datasets
    from parlab.serve.policy import PolicyConfig
    from parlab.serve.procs import post_json
    from parlab.serve.router import Router, RouterConfig

    urls = [r.url for r in procs]
    for u in urls:
        await post_json(u + "/engine/reset")
    ds = datasets.synthetic(
        num_prompts=max(12, p.num_prompts // 2),
        input_len=p.question_len * 4,
        output_len=p.output_len * 4,  # long enough that some are in flight at the kill
        seed=1,
    )
    router = Router(
        RouterConfig(
            replicas=tuple(urls),
            policy=PolicyConfig(name="round_robin"),
            health_interval_s=0.2,
            health_failures=2,
        )
    )
    await router.start()
    cfg = bench.BenchConfig(
        base_url=router.url, request_rate=p.rate, progress=False, request_timeout_s=120.0
    )
    kill_at = len(ds.requests) / p.rate / 3

    async def killer() -> float:
        await asyncio.sleep(kill_at)
        procs[-1].kill()
        return time.perf_counter()

    try:
        res, t_kill = await asyncio.gather(bench.arun(cfg, ds), killer())
    finally:
        stats = router.stats()
        await router.stop()
    s = res.summary
    unaccounted = len(ds.requests) - s["completed"] - s["failed"]
    late = [o for o in res.outcomes if o.start > t_kill + 1.0]
    late_ok = sum(o.success for o in late)
    reps = stats["replicas"]
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
            f"replica {len(urls) - 1} was killed (SIGKILL) {kill_at:.1f} s into the arrivals",
        ],
    )
    extra = {
        "requests_unaccounted": Metric(value=float(unaccounted), unit="count"),
        "requests_after_kill": Metric(value=float(len(late)), unit="count"),
        "requests_after_kill_ok": Metric(value=float(late_ok), unit="count"),
        **_replica_metrics(reps),
        "replica_taken_out": Metric(
            value=float(sum(r["taken_out"] for r in reps)),
            unit="count",
            per_rank=[float(r["taken_out"]) for r in reps],
        ),
    }
    doc = Document(**{**doc.__dict__, "metrics": {**doc.metrics, **extra}})
    from parlab.cli.common import write

    write(doc, root, quiet=True)
    console.print(
        f"{'failover':>18}: {s['completed']} ok, {s['failed']} failed, {unaccounted} "
        f"unaccounted of {len(ds.requests)}; after the kill {late_ok}/{len(late)} ok; "
        f"routed {[r['routed'] for r in reps]}, failed {[r['failed'] for r in reps]}"
    )
    return doc


def disagg_document(
    profile: dict[str, Any], kv: Document, p: Preset, replicas: int, command: str
) -> Document:
    """Colocated vs prefill/decode split in the simulator, from measured profile and transfer."""
    from parlab.serve import sim
    from parlab.serve.policy import PolicyConfig

    n = max(2, replicas)
    # the fitted bandwidth; where the fit has no basis, the best measured one
    bw = (kv.metric("kv_transfer_bandwidth") or kv.metric("kv_transfer_algbw_peak") or 1.0) * 1e9
    base = kv.metric("kv_transfer_base") or 0.0
    per_tok = int(kv.metric("kv_bytes_per_token") or 0)
    prof = sim.ReplicaProfile.from_json(
        profile, max_batch=p.max_batch, block=16, cache_blocks=p.cache_blocks
    )
    # load: about 70% of what n colocated replicas sustain on this workload (decode steps
    # of a full batch at the middle of the output)
    tok_time = prof.prefill_s(p.prefix_len + p.question_len, 0)
    mid = p.prefix_len + p.question_len + p.output_len // 2
    step = prof.decode_step_s(p.max_batch, p.max_batch * mid, mid)
    per_rep = 1.0 / (tok_time + step * p.output_len / p.max_batch)
    rate = 0.7 * n * per_rep
    w = sim.shared_prefix_arrays(
        n=4000,
        groups=max(64, p.groups),
        prefix_len=p.prefix_len,
        question_len=p.question_len,
        output_len=p.output_len,
        rate=rate,
    )
    pol = PolicyConfig(name="least_outstanding")
    col = sim.simulate(w, replicas=n, profile=prof, policy=pol)
    split = sim.Disaggregation(
        prefill_replicas=n // 2,
        decode_replicas=n - n // 2,
        kv_bytes_per_token=per_tok,
        kv_base_s=base,
        kv_bandwidth=bw,
    )
    dis = sim.simulate(w, replicas=n, profile=prof, policy=pol, disagg=split)
    metrics = {}
    for k in ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "request_throughput"):
        unit = "req/s" if k == "request_throughput" else "ms"
        metrics[f"colocated_{k}"] = Metric(value=col[k], unit=unit)
        metrics[f"disaggregated_{k}"] = Metric(value=dis[k], unit=unit)
    return Document(
        run_id=new_run_id("serve-disagg-sim"),
        created=now_iso(),
        project=PROJECT,
        task="T4",
        role="candidate",
        evidence_level="analytic",
        command=command,
        environment=_env(),
        workload={
            "requests": len(w.arrival),
            "rate": rate,
            "prefix_len": p.prefix_len,
            "question_len": p.question_len,
            "output_len": p.output_len,
            "profile": {k: v for k, v in profile.items() if k != "samples"},
            "kv_transfer_run": kv.run_id,
        },
        layout={
            "world_size": n,
            "strategy": "prefill-decode-split",
            "prefill_replicas": n // 2,
            "decode_replicas": n - n // 2,
        },
        metrics=metrics,
        notes=[
            "simulation (parlab.serve.sim) resting on the measured replica profile and the "
            f"measured KV transfer of run {kv.run_id}; no caching across groups assumed beyond "
            "each replica's own prefix cache"
        ],
    )


def write_report(root: Path, docs: list[Document], extra: list[Document]) -> Path:
    """A markdown report comparing the policies, rendered from the documents alone."""
    from parlab.contract import atomic_write_text

    lines = [
        "# Serving: routing policies compared",
        "",
        f"Evidence: {docs[0].evidence_level if docs else '-'}; "
        f"workload {docs[0].workload.get('dataset') if docs else '-'} "
        f"{docs[0].workload.get('dataset_params') if docs else ''}; "
        f"rate {docs[0].workload.get('request_rate') if docs else '-'} req/s.",
        "",
        "| policy | ok/failed | req/s | TTFT mean / p99 ms | TPOT mean / p99 ms | cache hit "
        "(server) | cache hit (router est.) | per-replica load | router p99 ms | sim TTFT / TPOT "
        "error (idle profile) | sim TTFT / TPOT error (serving costs fitted on the first run) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def v(d: Document, k: str, fmt: str = "{:.2f}") -> str:
        x = d.metric(k)
        return "unknown" if x is None else fmt.format(x)

    def err(d: Document, k: str, suffix: str = "") -> str:
        m, pr = d.metric(k), d.predictions.get(k + suffix)
        if m is None or pr is None or pr.value is None or not m:
            return "unknown"
        return f"{(pr.value - m) / m:+.0%}"

    for d in docs:
        load = d.metrics.get("replica_load_routed")
        lines.append(
            f"| {d.layout.get('policy')} | {v(d, 'completed', '{:.0f}')}/{v(d, 'failed', '{:.0f}')} "
            f"| {v(d, 'request_throughput')} | {v(d, 'mean_ttft_ms')} / {v(d, 'p99_ttft_ms')} "
            f"| {v(d, 'mean_tpot_ms')} / {v(d, 'p99_tpot_ms')} | {v(d, 'cache_hit_rate', '{:.1%}')} "
            f"| {v(d, 'router_est_cache_hit_rate', '{:.1%}')} "
            f"| {[int(x or 0) for x in (load.per_rank or [])] if load else '-'} "
            f"| {v(d, 'router_pre_forward_p99_ms', '{:.3f}')} "
            f"| {err(d, 'mean_ttft_ms')} / {err(d, 'mean_tpot_ms')} "
            f"| {err(d, 'mean_ttft_ms', '@in_run')} / {err(d, 'mean_tpot_ms', '@in_run')} |"
        )
    base = next((d for d in docs if d.layout.get("policy") == "round_robin"), None)
    ca = next((d for d in docs if d.layout.get("policy") == "cache_aware"), None)
    if base and ca:
        hb, hc = base.metric("cache_hit_rate"), ca.metric("cache_hit_rate")
        tb, tc = base.metric("mean_ttft_ms"), ca.metric("mean_ttft_ms")
        lines += [
            "",
            f"cache_aware vs round_robin: cache-hit ratio "
            f"{(hc / hb) if hb and hc is not None else float('nan'):.2f}x, "
            f"mean TTFT ratio {(tc / tb) if tb and tc is not None else float('nan'):.2f}x.",
        ]
    for d in extra:
        lines += ["", f"## {d.layout.get('strategy')} ({d.evidence_level}, run {d.run_id})", ""]
        for k, m in d.metrics.items():
            lines.append(f"- {k}: {'unknown' if m.value is None else f'{m.value:.4g}'} {m.unit}")
    lines += ["", "Documents: " + ", ".join(d.run_id for d in docs + extra), ""]
    path = root / PROJECT / f"serving-report-{time.strftime('%Y%m%dT%H%M%S')}.md"
    atomic_write_text(path, "\n".join(lines))
    return path


def run_project(
    root: Path,
    *,
    preset: str | Preset = "cpu",
    policies: list[str] | None = None,
    num_prompts: int | None = None,
    request_rate: float | None = None,
    kv_transfer: bool = True,
    failover: bool = True,
    console: Console | None = None,
    command: str | None = None,
) -> int:
    """Run the project; return the number of failed parts."""
    from dataclasses import replace

    from parlab.errors import UsageError
    from parlab.serve.procs import post_json, spawn_replica, wait_replica

    con = console or Console(stderr=True)
    p = preset if isinstance(preset, Preset) else get_preset(preset)
    if num_prompts is not None:
        p = replace(p, num_prompts=num_prompts)
    if request_rate is not None:
        p = replace(p, rate=request_rate)
    pols = policies or list(ALL_POLICIES)
    for name in pols:
        if name not in ALL_POLICIES:
            raise UsageError(f"policy {name!r} is not one of {', '.join(ALL_POLICIES)}")
    cmd = command or f"parlab project serving --results {root}"
    failed = 0
    procs = []
    pending: list = []
    fo_docs: list[Document] = []
    try:
        con.print(f"starting {len(p.devices)} {p.model} replicas on {', '.join(p.devices)}")
        for dev in p.devices:
            pending.append(
                spawn_replica(
                    [
                        "--model",
                        p.model,
                        "--device",
                        dev,
                        "--tensor-dtype",
                        TENSOR_DTYPE_OF[p.dtype],
                        "--max-batch",
                        str(p.max_batch),
                        "--max-len",
                        str(p.max_len),
                        "--cache-blocks",
                        str(p.cache_blocks),
                    ],
                    threads=1,
                    duration_s=1800,
                )
            )
        procs = [wait_replica(x) for x in pending]
        urls = [r.url for r in procs]
        profile = asyncio.run(post_json(urls[0] + "/engine/profile"))
        profile.update(asyncio.run(loop_probe(urls[0], p, profile)))
        buckets = profile.get("decode_bucket_s") or {}
        con.print(
            "replica profile: prefill {}{:.3f} ms, {:.4f} ms/token{} + {:.4f} ms/cached token; "
            "decode {:.3f} ms + {:.4f} ms/seq".format(
                "max(" if profile.get("prefill_overlap") else "",
                profile["prefill_base_s"] * 1e3,
                profile["prefill_per_token_s"] * 1e3,
                ")" if profile.get("prefill_overlap") else "",
                profile.get("prefill_per_cached_token_s", 0.0) * 1e3,
                profile["decode_base_s"] * 1e3,
                profile["decode_per_seq_s"] * 1e3,
            )
            + f"; serving loop {profile['loop_base_s'] * 1e3:.3f} ms + "
            f"{profile['loop_per_seq_s'] * 1e3:.4f} ms/request an iteration; request path "
            f"{profile['path_s'] * 1e3:.3f} ms"
            + "".join(f"; graph decode at {L} keys {t * 1e3:.2f} ms" for L, t in buckets.items())
            + "".join(
                f"; graph prefill of {q} tokens at {L} keys {t * 1e3:.2f} ms"
                for q, L, t in profile.get("prefill_bucket_s") or []
                if q == L or q == min(x[0] for x in profile["prefill_bucket_s"])
            )
        )
        docs = asyncio.run(_run_policies(urls, p, pols, profile, root, con, cmd))
        failed += sum(d.status != "ok" for d in docs)
        if failover and len(procs) >= 2:
            fo = asyncio.run(_run_failover(procs, p, root, con, cmd))
            failed += fo.metric("requests_unaccounted") != 0
            fo_docs.append(fo)
    finally:
        for r in procs:
            r.stop()
        for x in pending:
            if x[0].poll() is None:
                x[0].kill()
                x[0].wait(5)
    extra: list[Document] = list(fo_docs)
    if kv_transfer:
        from parlab.cli.common import write

        kv = kv_transfer_document(
            model=p.model,
            tokens=list(p.kv_tokens),
            dtype=p.dtype,
            iters=5,
            timeout_s=120,
            command=f"parlab serve kv-transfer --model {p.model} --tensor-dtype "
            f"{TENSOR_DTYPE_OF[p.dtype]} "
            f"--tokens {','.join(map(str, p.kv_tokens))} --iters 5",
        )
        write(kv, root, quiet=True)
        extra.append(kv)
        if kv.status == "ok":
            bw = kv.metric("kv_transfer_bandwidth")
            peak = kv.metric("kv_transfer_algbw_peak") or 0.0
            con.print(
                f"KV transfer ({kv.evidence_level}): fitted bandwidth "
                f"{'unknown' if bw is None else f'{bw:.2f} GB/s'}, best measured {peak:.2f} GB/s"
            )
            dd = disagg_document(profile, kv, p, len(p.devices), cmd)
            write(dd, root, quiet=True)
            extra.append(dd)
        else:
            failed += 1
    report = write_report(root, docs, extra)
    con.print(f"report: {report}")
    con.print(json.dumps({"documents": len(docs) + len(extra)}))
    return failed


def demo_step(results: Path, console: Console) -> None:
    """CPU-sized serving project for ``parlab demo``."""
    n = run_project(
        results,
        preset=replace_demo(),
        policies=["round_robin", "least_outstanding", "cache_aware"],
        console=console,
        command=f"parlab project serving --results {results} "
        "--policies round_robin,least_outstanding,cache_aware --num-prompts 24",
    )
    if n:
        raise RuntimeError(f"{n} serving part(s) failed")


def replace_demo() -> Preset:
    from dataclasses import replace

    return replace(get_preset("cpu"), num_prompts=24, rate=8.0, kv_tokens=(16, 256))
