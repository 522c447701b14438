"""The collectives benchmark rank function: every op, every size, checked then timed.

``sweep_rank(ctx, **plan)`` runs on every rank (through torchrun, or through
the test suite's fork helper). For each (op, size) it

1. allocates the buffers and fills the inputs with exact patterns
   (``parlab.comm.case``), runs the op once, and counts wrong elements
   against the exact expected values (the check iteration is outside the
   timed loop, as nccl-tests' ``-c 1``);
2. runs ``warmup`` untimed iterations, then ``iters`` timed iterations:

   * on GPUs (NCCL) the timed loop is bracketed by CUDA events with no host
     synchronisation inside; events between equal chunks of the loop give up
     to ``SAMPLES`` samples for the spread. With ``graph`` the loop is
     captured once in a CUDA graph and the graph is replayed ``SAMPLES``
     times, so small messages measure NCCL rather than Python launch
     overhead (nccl-tests' ``-G``);
   * on CPU (gloo, whose ops return when complete) every iteration is timed
     with ``perf_counter``;
3. takes the slowest rank: one ``all_reduce(MAX)`` over the whole world of
   ``[mean, sample_1, ...]`` (the time per op on each rank), and sums
   ``#wrong`` with one ``all_reduce(SUM)``; the per-rank means come from one
   ``all_gather``. These reductions run after the timed loop, never inside.

What crosses the wire in the timed loop is only the op under test, on the
group along ``axis`` of the ``Topology`` (the whole world when no axis is
given); every group along that axis runs at the same time, as they would in
a real job.

``via`` picks who issues the op in the check and the timed loop:

* ``torch`` (default): torch.distributed's c10d API (``dist.all_reduce``,
  ``dist.all_gather_into_tensor``, ... ``dist.batch_isend_irecv``), what
  training code calls;
* ``nccl`` (GPUs only): NCCL itself through ctypes (``parlab.comm.nccl_direct``):
  one ``DirectComm`` per group, made once before the first op (its unique id
  is broadcast over the torch group), then ``ncclAllReduce``,
  ``ncclAllGather``, ``ncclReduceScatter``, ``ncclBroadcast``, ``ncclReduce``
  on the current stream, the ring exchange and the all-to-all as one
  ``ncclGroupStart``/``End`` of ``ncclSend``/``ncclRecv`` (as nccl-tests'
  sendrecv and alltoall). Same buffers, patterns, checks, warm-up and CUDA
  event timing; barrier has no NCCL call and is not run. The difference in
  time per op between the two paths is c10d's cost per call. The
  bookkeeping (barriers, the slowest-rank reductions) stays on torch.

Rank 0 appends one JSON line per (op, size) to ``progress_path`` as soon as
it is measured, so the driver can show progress and keep what was measured
if the run is interrupted. Every rank returns ``{rank, device, host, records, nccl_direct}``
(the records on rank 0 only; ``nccl_direct``: the library and version under
``via="nccl"``).
"""

from __future__ import annotations

import json
import socket
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from parlab.comm import nccl_direct
from parlab.comm import ops as O
from parlab.comm.case import Case
from parlab.runtime.context import RankContext
from parlab.topology import Topology

SAMPLES = 5
"""Timing samples per (op, size) on GPUs: chunks of the timed loop, or graph replays."""
VIAS = ("torch", "nccl")
"""Who issues the op under test: torch's c10d API, or NCCL directly (GPUs only)."""


def _group(ctx: RankContext, mesh: dict[str, int] | None, axis: str | None) -> Any:
    if not axis:
        return dist.group.WORLD
    topo = Topology(world_size=ctx.world_size, **(mesh or {}))
    device_mesh = topo.build_mesh(ctx.device.type)
    return device_mesh.get_group(axis)


def _time_gpu(fn: Callable[[], None], iters: int, graph: bool, group: Any) -> list[float]:
    """Per-op seconds for each sample: [mean, s_1, ..., s_k] on this rank."""
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    if graph:
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # the communicator and any lazy state exist before capture
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            for _ in range(iters):
                fn()
        g.replay()  # warm the graph itself
        torch.cuda.synchronize()
        dist.barrier(group=group)
        torch.cuda.synchronize()
        marks = [ev() for _ in range(SAMPLES + 1)]
        marks[0].record()
        for k in range(SAMPLES):
            g.replay()
            marks[k + 1].record()
        torch.cuda.synchronize()
        per = [marks[k].elapsed_time(marks[k + 1]) / 1e3 / iters for k in range(SAMPLES)]
        del g
        return [statistics.fmean(per), *per]
    k = min(SAMPLES, iters)
    bounds = [round(i * iters / k) for i in range(k + 1)]
    dist.barrier(group=group)
    torch.cuda.synchronize()
    marks = [ev() for _ in range(k + 1)]
    marks[0].record()
    for j in range(k):
        for _ in range(bounds[j + 1] - bounds[j]):
            fn()
        marks[j + 1].record()
    torch.cuda.synchronize()
    per = [
        marks[j].elapsed_time(marks[j + 1]) / 1e3 / (bounds[j + 1] - bounds[j]) for j in range(k)
    ]
    total = marks[0].elapsed_time(marks[k]) / 1e3 / iters
    return [total, *per]


def _time_host(fn: Callable[[], None], iters: int, group: Any, cuda: bool) -> list[float]:
    """Per-op seconds: [mean, t_1, ..., t_iters], each op timed on the host."""
    dist.barrier(group=group)
    per = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        per.append(time.perf_counter() - t0)
    return [statistics.fmean(per), *per]


def _slowest(ctx: RankContext, times: list[float]) -> tuple[list[float], list[float]]:
    """Element-wise MAX of ``times`` over every rank, and every rank's mean."""
    t = torch.tensor(times, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    means = torch.zeros(ctx.world_size, dtype=torch.float64, device=ctx.device)
    dist.all_gather_into_tensor(means, t.new_tensor([times[0]]))
    return t.tolist(), means.tolist()


def _record(
    op: str,
    requested: int,
    nbytes: int,
    n: int,
    elem: int,
    dtype: torch.dtype,
    timed: list[float],
    means: list[float],
    wrong: int | None,
    inplace: bool,
    graph: bool,
    method: str,
    via: str = "torch",
) -> dict[str, Any]:
    mean, samples = timed[0], timed[1:]
    algbw = nbytes / mean if mean > 0 and nbytes else 0.0
    return {
        "op": op,
        "requested_bytes": requested,
        "size": nbytes,
        "count": O.count_of(op, nbytes, n, elem) if op != "barrier" else 0,
        "type": O.dtype_name(dtype),
        "redop": "sum" if O.SPECS[op].reduces else "none",
        "root": 0 if op in ("broadcast", "reduce") else -1,
        "inplace": inplace
        if O.SPECS[op].inplace == "optional"
        else O.SPECS[op].inplace == "always",
        "graph": graph,
        "method": method,
        "via": via,
        "time_s": mean,
        "time_median_s": statistics.median(samples),
        "time_min_s": min(samples),
        "time_max_s": max(samples),
        "samples": len(samples),
        "time_per_rank_s": means,
        "algbw": algbw,
        "busbw": algbw * O.busbw_factor(op, n),
        "wrong": wrong,
        "group_size": n,
    }


def _measure_barrier(
    ctx: RankContext, group: Any, warmup: int, iters: int
) -> tuple[list[float], list[float]]:
    """``dist.barrier`` timed on the host: the slowest rank's times and every rank's mean."""
    for _ in range(warmup):
        dist.barrier(group=group)
    timed = _time_host(lambda: dist.barrier(group=group), iters, group, ctx.is_cuda)
    return _slowest(ctx, timed)


def _measure(
    ctx: RankContext, case: Case, warmup: int, iters: int, graph: bool
) -> tuple[list[float], list[float], int | None, str]:
    """Check ``case`` once, warm it up, time it: (slowest times, rank means, #wrong over all
    ranks or None, timing method)."""
    wrong = case.check()
    ctx.sync()
    for _ in range(warmup):
        case.fn()
    if ctx.is_cuda:
        timed = _time_gpu(case.fn, iters, graph, case.group)
        method = "cuda-graph" if graph else "cuda-events"
    else:
        timed = _time_host(case.fn, iters, case.group, cuda=False)
        method = "perf_counter"
    slow, means = _slowest(ctx, timed)
    total_wrong = None
    if wrong is not None or not case.pattern.exact:
        w = torch.tensor([wrong if wrong is not None else -1], dtype=torch.int64, device=ctx.device)
        dist.all_reduce(w)
        total_wrong = int(w.item()) if case.pattern.exact else None
    return slow, means, total_wrong, method


def sweep_rank(
    ctx: RankContext,
    *,
    ops: list[str],
    sizes: list[int],
    dtype: str = "float",
    warmup: int = 5,
    iters: int = 20,
    inplace: bool = False,
    graph: bool = False,
    via: str = "torch",
    mesh: dict[str, int] | None = None,
    axis: str | None = None,
    progress_path: str | None = None,
) -> dict[str, Any]:
    """Measure every (op, size): see the module docstring."""
    if via not in VIAS:
        raise ValueError(f"via={via!r}: use one of {', '.join(VIAS)}")
    # torch 2.13 renames the tensor forms (all_gather_single, ...); the old names are what
    # every torch parlab supports, so keep them and silence the notice
    warnings.filterwarnings(
        "ignore", message=r".*is deprecated\. Please use", category=FutureWarning
    )
    tdtype = O.parse_dtype(dtype)
    group = _group(ctx, mesh, axis)
    n = dist.get_world_size(group)
    elem = torch.empty((), dtype=tdtype).element_size()
    records: list[dict[str, Any]] = []
    comm = None
    if via == "nccl":
        # looked up when called, not at import: the CPU tests put a stand-in there
        comm = nccl_direct.DirectComm(group, device=ctx.device)
    progress = open(progress_path, "a") if progress_path and ctx.rank == 0 else None  # noqa: SIM115
    try:
        for op in ops:
            if op == "barrier" and comm is not None:
                continue  # NCCL has no barrier call: the sweep notes it
            if op == "barrier":
                slow, means = _measure_barrier(ctx, group, warmup, iters)
                rec = _record(op, 0, 0, n, elem, tdtype, slow, means, 0, False, False, "host")
                records.append(rec)
                _emit(progress, rec)
                continue
            if op == "send_recv" and n < 2:
                continue
            for requested, nbytes in O.op_sizes(op, sizes, n, elem):
                case = Case(op, nbytes, tdtype, inplace, group, ctx.device, comm)
                slow, means, wrong, method = _measure(ctx, case, warmup, iters, graph)
                rec = _record(op, requested, nbytes, n, elem, tdtype, slow, means, wrong,
                              inplace, graph, method, via)  # fmt: skip
                records.append(rec)
                _emit(progress, rec)
                del case
    finally:
        if progress is not None:
            progress.close()
    direct = None
    if comm is not None:  # not after an error: destroying waits for work a dead peer never ends
        ctx.sync()
        direct = {"library": comm.lib.path, "version": ".".join(map(str, comm.version))}
        comm.close()
    device = torch.cuda.get_device_name(ctx.device) if ctx.is_cuda else "cpu"
    return {
        "rank": ctx.rank,
        "device": device,
        "host": socket.gethostname(),
        "group_size": n,
        "records": records if ctx.rank == 0 else None,
        "nccl_direct": direct,
    }


def _emit(progress: Any, rec: dict[str, Any]) -> None:
    if progress is not None:
        progress.write(json.dumps(rec) + "\n")
        progress.flush()
