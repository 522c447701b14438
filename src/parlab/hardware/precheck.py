"""``parlab env``: the environment precheck (evidence level ``env-precheck``).

Snapshot the machine, then run one short sanity all-reduce across every local
GPU through NCCL (or across 2 gloo ranks on a machine without GPUs), launched
through torchrun like every other parlab run. Rank r contributes a tensor
filled with r + 1; every element of the result must equal n(n+1)/2 exactly.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from parlab.contract import Document, Failure, Metric, new_run_id, now_iso
from parlab.hardware import env as env_mod
from parlab.runtime.context import RankContext
from parlab.runtime.launch import LaunchConfig, launch


def sanity_allreduce(ctx: RankContext, numel: int = 1 << 20, iters: int = 5) -> dict[str, Any]:
    """Rank function: all-reduce ``numel`` fp32 values, check the exact sum, time it."""
    x = torch.full((numel,), float(ctx.rank + 1), dtype=torch.float32, device=ctx.device)
    expected = ctx.world_size * (ctx.world_size + 1) / 2
    dist.all_reduce(x)  # warm-up, and the checked result
    wrong = int((x != expected).sum().item())
    ctx.sync()
    times = []
    for _ in range(iters):
        y = torch.ones(numel, dtype=torch.float32, device=ctx.device)
        dist.barrier()
        ctx.sync()
        t0 = time.perf_counter()
        dist.all_reduce(y)
        ctx.sync()
        times.append(time.perf_counter() - t0)
    name = torch.cuda.get_device_name(ctx.device) if ctx.is_cuda else "cpu"
    return {
        "rank": ctx.rank,
        "wrong": wrong,
        "time_s": sorted(times)[len(times) // 2],
        "device": name,
    }


def run_precheck(*, command: str, nproc: int | None = None, timeout_s: float = 60.0) -> Document:
    """Snapshot plus sanity all-reduce; the ``env-precheck`` document (not yet written)."""
    snap = env_mod.snapshot()
    n_gpu = snap["hardware"]["gpu_count"]
    backend = "nccl" if n_gpu >= 1 and torch.distributed.is_nccl_available() else "gloo"
    if nproc is None:
        nproc = n_gpu if backend == "nccl" else 2
    numel = 1 << 20
    res = launch(
        "parlab.hardware.precheck:sanity_allreduce",
        {"numel": numel},
        LaunchConfig(nproc=nproc, backend=backend, timeout_s=timeout_s),
    )
    notes = []
    if n_gpu == 0:
        notes.append("no GPU found: the sanity all-reduce ran on gloo CPU ranks")
    metrics: dict[str, Metric] = {"gpu_count": Metric(value=n_gpu, unit="count")}
    inter = snap["hardware"]["interconnect"] or {}
    bw = inter.get("per_direction_bw")
    if bw:
        peer = [v for i, row in enumerate(bw) for j, v in enumerate(row) if i != j and v]
        metrics["link_bw_per_direction"] = Metric(value=max(peer) if peer else None, unit="B/s")
    failure = None
    if res.ok:
        wrong = [r["wrong"] for r in res.results]
        times = [r["time_s"] for r in res.results]
        metrics["sanity_allreduce_ok"] = Metric(value=1.0 if sum(wrong) == 0 else 0.0, unit="bool")
        metrics["sanity_allreduce_wrong"] = Metric(value=sum(wrong), unit="count", per_rank=wrong)
        metrics["sanity_allreduce_time"] = Metric(value=max(times), unit="s", per_rank=times)
        if sum(wrong):
            failure = Failure(
                kind="crash", message=f"sanity all-reduce gave {sum(wrong)} wrong values"
            )
    else:
        failure = res.failure
    return Document(
        run_id=new_run_id("env-precheck"),
        created=now_iso(),
        project="PAR-ENV",
        task="T1",
        role="baseline" if failure is None else "failure",
        evidence_level="env-precheck",
        command=command,
        environment=snap,
        workload={"sanity_allreduce": {"numel": numel, "dtype": "float32", "iters": 5}},
        layout={
            "world_size": nproc,
            "mesh": {"world": nproc},
            "strategy": None,
            "backend": backend,
        },
        metrics=metrics,
        status="ok" if failure is None else "failed",
        failure=failure,
        notes=notes,
    )
