"""Small-message all_reduce latency probe: which way of issuing the op closes the gap to nccl-tests.

Why: on 2xH200 (NCCL 2.28.9, torch 2.11) parlab's small all_reduce (8 B - 256 KiB, fp32)
measured ~26 us per op eager (nccl-tests: ~21 us) and ~41 us per op with ``--graph``
(nccl-tests ``-G``: 5.5-8 us). A graph slower than eager points at how the graph is
captured or timed, not at NCCL. This probe times the same all_reduce issued in several
ways, side by side, in one process group, so one GPU run shows which variant is fast.

What crosses the wire: only ``all_reduce(SUM)`` of one fp32 buffer of the given size over
the whole world (every rank), in place, once per timed op. After each (variant, size) one
``all_reduce(MAX)`` of ``[median, min]`` (float64, outside the timed region) gives the
slowest rank's figures; one ``all_reduce`` of the check count gives the wrong-rank count.

How it is timed (per variant and size):

- the buffer is first filled with ``rank + 1``, one op (or one graph replay) is run, and
  the result is checked against the exact sum (``n(n+1)/2``, times ``n^(N-1)`` for a graph
  of N ops); then the buffer is zeroed (sums of zeros stay zero, never overflow);
- ``WARMUP`` untimed ops (or replays), a barrier, a device synchronise;
- ``SAMPLES`` samples, each ~``OPS_PER_SAMPLE`` ops between two CUDA events on the
  current stream (graphs: ``ceil(OPS_PER_SAMPLE / N)`` replays of an N-op graph), no host
  synchronisation inside; on CPU/gloo each sample is timed with ``perf_counter``;
- per rank: the median and the minimum over samples of (sample time / ops in sample);
  reported: the slowest rank's median and min, in microseconds per op;
- beside them, from ``perf_counter`` over all samples: ``issue us`` (host time per op to
  issue the ops or graph replays, up to the last event record) and ``wall us`` (the same up
  to the final device synchronise). ``issue`` close to ``median`` means the host is the
  bottleneck (eager); ``wall`` far from ``median`` means the CUDA events mis-time the run.

Variants (``*`` = GPU/NCCL only; on CPU/gloo they are listed as skipped with the reason):

==========================  ==========================================================
``dist``                    eager ``dist.all_reduce(buf, group=g)`` (what parlab does)
``dist_async``              eager ``dist.all_reduce(..., async_op=True).wait()``
``pg_wait``                 eager ``pg.allreduce([buf], AllreduceOptions(asyncOp=False))
                            .wait()``: the ProcessGroup binding, no c10d Python wrapper
``pg_nowait``               the same with ``asyncOp=True``, no wait per op (the last
                            op's work is waited once at the end of each sample)
``backend_wait``            ``pg._get_backend(device).allreduce(...)`` (ProcessGroupNCCL
                            itself, skipping the dispatcher), ``asyncOp=False`` + wait
``backend_nowait``          the same, ``asyncOp=True``, one wait per sample
``funcol``                  ``wait_tensor(_functional_collectives.all_reduce(buf, "sum",
                            g))`` (out of place: allocates one output per op)
``nccl_direct``*            ``ncclAllReduce`` called directly through ctypes
                            (``parlab.comm.nccl_direct.DirectComm``, one communicator made
                            once for the probe beside torch's) on the current stream: no
                            c10d at all, what nccl-tests does from C
``graph_dist_N{1,20,100}``* parlab's ``--graph``: warm up on a side stream, capture N
                            ``dist.all_reduce`` into one graph with
                            ``capture_error_mode="thread_local"``, replay
``graph_samestream_N100``*  warm-up, capture and replay all on one stream the probe owns
                            (``torch.cuda.graph(g, stream=s)``), the process group
                            warmed up on that same stream first
``graph_pg_N100``*          ``pg.allreduce(asyncOp=False)`` captured (no Python wrapper)
``graph_async_N100``*       ``dist.all_reduce(async_op=True).wait()`` captured: the
                            collective on ProcessGroupNCCL's own stream, fenced to the
                            capture stream by an event record + wait per op
``graph_nccl_direct_N100``* ``nccl_direct`` captured the way ``graph_dist_N100`` is
``graph_global_N100``*      as ``graph_dist_N100`` with the default
                            ``capture_error_mode="global"`` (last: it may fail)
==========================  ==========================================================

Hypotheses the variants test (from torch/NCCL issues and docs):

1. Fork/join per op: with ``async_op=True`` ProcessGroupNCCL runs the collective on its
   own NCCL stream, fenced by an event record on the current stream and a wait back;
   captured, each op adds event nodes and cross-stream edges that nccl-tests' one-stream
   capture does not have. Torch >= 2.7 runs ``async_op=False`` ops on the current stream.
   Compare ``graph_async_N100`` with ``graph_dist_N100`` and ``graph_pg_N100``.
2. NCCL's graph-mixing support (``NCCL_GRAPH_MIXING_SUPPORT=1``, the default) serialises
   captured launches with non-captured ones through NCCL-internal events; NCCL's CUDA graph
   guide says disabling it can improve the performance of graphs. It is read when NCCL
   first needs it, so it needs a fresh process: ``scripts/gpu/collectives_probe.sh`` reruns
   the graph variants with ``NCCL_GRAPH_MIXING_SUPPORT=0``.
3. User-buffer registration at capture (``NCCL_GRAPH_REGISTER=1``, the default) can change
   what NCCL launches for a captured op; rerun in a fresh process with
   ``NCCL_GRAPH_REGISTER=0``.
4. Capture-stream state: the group warmed up on one side stream while ``torch.cuda.graph``
   captures on its own stream (pytorch/pytorch#161104 shows eager warm-up on other
   streams slowing graph replays of even a plain ``x + y``): ``graph_samestream_N100``.
5. Graph size / timing: a graph of N ops amortises the launch of one replay over N; if the
   per-op time falls from N=1 to N=100 the launch dominates, if it stays flat the
   per-node cost does. Ranks' replays start unaligned; with N=100 the skew is amortised.
   NVIDIA/nccl#1883 reports a large gap before the first NCCL op of a graph replay on some
   ranks (NCCL 2.27-2.28): a per-replay cost that N=1 shows and N=100 hides. ``wall us``
   against ``median us`` checks the CUDA-event timing itself.
6. Host cost of the Python wrappers (eager only): ``dist`` vs ``pg_*`` vs ``backend_*``
   vs ``funcol`` shows how much of the 26 us is c10d's Python and dispatcher path.
7. c10d as a whole (eager): ``nccl_direct`` skips every layer of torch.distributed and
   calls NCCL as nccl-tests does; ``dist`` minus ``nccl_direct`` is c10d's cost per call.
   If ``nccl_direct`` is near nccl-tests' time, the gap is c10d; if it is near ``dist``,
   the gap is elsewhere (NCCL's own launch, the machine).

Run (2 ranks; re-launches itself under torchrun when not started by it)::

    python3 benchmarks/collectives_small_probe.py --out OUT_DIR [--tag default] [--only graph]
    scripts/gpu/collectives_probe.sh OUT_DIR     # the GPU run: three environments

Writes ``OUT_DIR/collectives_small_probe-<tag>.json`` (rewritten after every row, so an
interrupted run keeps what was measured) and prints one table row per measurement.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch
import torch.distributed as dist

from parlab.runtime.context import RankContext

SIZES = (8, 1 << 10, 64 << 10, 256 << 10)
"""Message sizes in bytes (fp32 elements: size / 4)."""
SAMPLES = 7
"""Timed samples per (variant, size)."""
OPS_PER_SAMPLE = 100
"""Ops per timed sample (graphs: replays x N rounded up to at least this)."""
WARMUP = 20
"""Untimed ops (graphs: replays) before the samples."""
ENV_KEYS = ("NCCL_", "TORCH_NCCL_", "CUDA_DEVICE_MAX_CONNECTIONS", "TORCH_SYMM_MEM")
"""Environment variables (by prefix) printed and recorded: they change what is measured."""


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One way of issuing the all_reduce."""

    name: str
    """Row label."""
    graph_ops: int
    """Ops captured in one CUDA graph; 0 for eager."""
    gpu_only: bool
    """True where the variant needs CUDA (graphs, stream handling)."""
    what: str
    """One line on how the op is issued."""


VARIANTS: tuple[Variant, ...] = (
    Variant(name="dist", graph_ops=0, gpu_only=False, what="dist.all_reduce(buf, group=g)"),
    Variant(name="dist_async", graph_ops=0, gpu_only=False, what="dist.all_reduce async + wait"),
    Variant(name="pg_wait", graph_ops=0, gpu_only=False, what="pg.allreduce asyncOp=False +wait"),
    Variant(name="pg_nowait", graph_ops=0, gpu_only=False, what="pg.allreduce asyncOp=True"),
    Variant(name="backend_wait", graph_ops=0, gpu_only=False, what="backend.allreduce + wait"),
    Variant(name="backend_nowait", graph_ops=0, gpu_only=False, what="backend.allreduce no wait"),
    Variant(name="funcol", graph_ops=0, gpu_only=False, what="funcol.all_reduce + wait_tensor"),
    Variant(name="nccl_direct", graph_ops=0, gpu_only=True, what="ncclAllReduce via ctypes"),
    Variant(name="graph_dist_N1", graph_ops=1, gpu_only=True, what="parlab --graph, N=1"),
    Variant(name="graph_dist_N20", graph_ops=20, gpu_only=True, what="parlab --graph, N=20"),
    Variant(name="graph_dist_N100", graph_ops=100, gpu_only=True, what="parlab --graph, N=100"),
    Variant(
        name="graph_samestream_N100", graph_ops=100, gpu_only=True, what="one stream throughout"
    ),
    Variant(name="graph_pg_N100", graph_ops=100, gpu_only=True, what="pg.allreduce captured"),
    Variant(name="graph_async_N100", graph_ops=100, gpu_only=True, what="async+wait captured"),
    Variant(
        name="graph_nccl_direct_N100", graph_ops=100, gpu_only=True, what="ncclAllReduce captured"
    ),
    Variant(name="graph_global_N100", graph_ops=100, gpu_only=True, what="capture mode global"),
)
"""Every variant, in the order measured (the riskiest capture last)."""


def _issue(
    name: str, buf: torch.Tensor, group: Any, dev: torch.device, comm: Any = None
) -> tuple[Callable[[], Any], Callable[[], torch.Tensor]]:
    """(issue, result): ``issue()`` runs one all_reduce of ``buf`` the way ``name`` says and
    returns a work to wait on (no-wait variants) or None; ``result()`` is the last output.
    ``comm``: the probe's ``DirectComm`` (the ``nccl_direct`` variants)."""
    pg = group if group is not None else dist.group.WORLD
    base = name.removeprefix("graph_").split("_N")[0]
    same = lambda: buf  # noqa: E731 - in-place variants: the result is the buffer
    if base == "nccl_direct":
        if comm is None:
            raise RuntimeError("no DirectComm: NCCL could not be called directly here")
        return comm.prepare("all_reduce", buf), same

    def opts(async_op: bool) -> Any:
        o = dist.AllreduceOptions()
        o.reduceOp = dist.ReduceOp.SUM
        o.asyncOp = async_op
        return o

    def waited(issue: Callable[[], Any]) -> Callable[[], None]:
        def f() -> None:
            work = issue()
            if work is not None:  # ProcessGroupNCCL returns none for asyncOp=False (torch 2.11)
                work.wait()

        return f

    if base in ("dist", "samestream", "global"):

        def plain() -> None:
            dist.all_reduce(buf, group=pg)

        return plain, same
    if base in ("dist_async", "async"):
        return waited(lambda: dist.all_reduce(buf, group=pg, async_op=True)), same
    sync_o, async_o = opts(False), opts(True)
    if base in ("pg_wait", "pg"):
        return waited(lambda: pg.allreduce([buf], sync_o)), same
    if base == "pg_nowait":
        return (lambda: pg.allreduce([buf], async_o)), same
    backend = pg._get_backend(dev)
    if base == "backend_wait":
        return waited(lambda: backend.allreduce([buf], sync_o)), same
    if base == "backend_nowait":
        return (lambda: backend.allreduce([buf], async_o)), same
    if base == "funcol":
        import torch.distributed._functional_collectives as funcol

        last: list[torch.Tensor] = [buf]

        def f() -> None:
            last[0] = funcol.wait_tensor(funcol.all_reduce(buf, "sum", pg))

        return f, lambda: last[0]
    raise AssertionError(f"no variant {name}")


Timing = tuple[list[float], float, float]
"""(per-op seconds of each sample, host seconds per op to issue, wall seconds per op)."""


def _samples_eager(fn: Callable[[], Any], cuda: bool, group: Any) -> Timing:
    """Sample times per op; ops returning a work are waited once per sample."""
    works: list[Any] = []

    def run(k: int) -> None:
        for _ in range(k):
            w = fn()
            if w is not None:
                works.append(w)
        # no-wait variants: NCCL runs in order on one stream, so the last work covers the
        # sample; gloo may complete out of order, so every work is waited there
        for w in works[-1:] if cuda else works:
            w.wait()
        works.clear()

    run(WARMUP)
    dist.barrier(group=group)
    out = []
    if cuda:
        torch.cuda.synchronize()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(SAMPLES + 1)]
        t0 = time.perf_counter()
        ev[0].record()
        for s in range(SAMPLES):
            run(OPS_PER_SAMPLE)
            ev[s + 1].record()
        t_issue = time.perf_counter()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        out = [ev[s].elapsed_time(ev[s + 1]) / 1e3 / OPS_PER_SAMPLE for s in range(SAMPLES)]
    else:
        t0 = time.perf_counter()
        for _ in range(SAMPLES):
            ts = time.perf_counter()
            run(OPS_PER_SAMPLE)
            out.append((time.perf_counter() - ts) / OPS_PER_SAMPLE)
        t_issue = t1 = time.perf_counter()
    ops = SAMPLES * OPS_PER_SAMPLE
    return out, (t_issue - t0) / ops, (t1 - t0) / ops


def _capture(v: Variant, fn: Callable[[], Any]) -> tuple[Any, torch.cuda.Stream | None]:
    """Capture ``v.graph_ops`` calls of ``fn`` into a CUDA graph the way ``v`` says."""
    g = torch.cuda.CUDAGraph()
    if v.name.startswith("graph_samestream"):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()  # the group and NCCL's state are warmed up on the capture stream itself
            s.synchronize()
            with torch.cuda.graph(g, stream=s, capture_error_mode="thread_local"):
                for _ in range(v.graph_ops):
                    fn()
        torch.cuda.current_stream().wait_stream(s)
        return g, s
    side = torch.cuda.Stream()  # parlab's way (src/parlab/comm/bench.py _time_gpu)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    mode = "global" if v.name.startswith("graph_global") else "thread_local"
    with torch.cuda.graph(g, capture_error_mode=mode):
        for _ in range(v.graph_ops):
            fn()
    return g, None


def _samples_graph(g: Any, n_ops: int, group: Any) -> Timing:
    """Per-op seconds of each sample of ``ceil(OPS_PER_SAMPLE / n_ops)`` replays."""
    reps = max(1, math.ceil(OPS_PER_SAMPLE / n_ops))
    for _ in range(max(1, WARMUP // n_ops)):
        g.replay()
    torch.cuda.synchronize()
    dist.barrier(group=group)
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(SAMPLES + 1)]
    t0 = time.perf_counter()
    ev[0].record()
    for s in range(SAMPLES):
        for _ in range(reps):
            g.replay()
        ev[s + 1].record()
    t_issue = time.perf_counter()
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    ops = SAMPLES * reps * n_ops
    per = [ev[s].elapsed_time(ev[s + 1]) / 1e3 / (reps * n_ops) for s in range(SAMPLES)]
    return per, (t_issue - t0) / ops, (t1 - t0) / ops


def _expected(n: int, rounds: int) -> float | None:
    """The exact value after ``rounds`` in-place all_reduces of rank + 1 (None: beyond fp32)."""
    expect = n * (n + 1) / 2 * float(n) ** (rounds - 1)
    return expect if expect < 1e37 else None


def _check(out: torch.Tensor, n: int, rounds: int) -> int:
    """1 if ``out`` is not the exact sum, else 0 (0 too where the sum is beyond fp32)."""
    expect = _expected(n, rounds)
    return 0 if expect is None else int(not torch.all(out == expect).item())


def _measure(
    ctx: RankContext, v: Variant, nbytes: int, group: Any, comm: Any = None
) -> tuple[Timing, int, str | None]:
    """(timing, wrong flag, None) or (([], 0, 0), 0, error line) on this rank."""
    cuda = ctx.is_cuda
    n = dist.get_world_size(group)
    r = dist.get_rank(group)
    buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=ctx.device)
    try:
        fn, result = _issue(v.name, buf, group, ctx.device, comm)
        if v.graph_ops == 0:
            buf.fill_(r + 1)
            w = fn()
            if w is not None:
                w.wait()
            ctx.sync()
            wrong = _check(result(), n, 1)
            buf.zero_()
            return _samples_eager(fn, cuda, group), wrong, None
        g, _ = _capture(v, fn)
        torch.cuda.synchronize()
        buf.fill_(r + 1)  # the capture's warm-up op ran on zeros; the check needs rank + 1
        g.replay()
        torch.cuda.synchronize()
        wrong = _check(result(), n, v.graph_ops)
        buf.zero_()
        return _samples_graph(g, v.graph_ops, group), wrong, None
    except Exception as e:
        return (
            ([], 0.0, 0.0),
            0,
            f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}",
        )


def _versions(ctx: RankContext) -> dict[str, Any]:
    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:
            nccl = None
    devices = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if ctx.is_cuda
        else [f"CPU ({platform.processor() or platform.machine()})"]
    )
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "backend": ctx.backend,
        "world_size": ctx.world_size,
        "devices": devices,
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_KEYS)},
    }


def probe_rank(
    ctx: RankContext,
    *,
    sizes: list[int] | None = None,
    only: str | None = None,
    out_path: str | None = None,
    tag: str = "default",
    verbose: bool = False,
) -> dict[str, Any]:
    """Run every variant at every size on this rank; the table (identical on every rank).

    ``only``: ``"eager"`` or ``"graph"`` keeps those variants. ``out_path``: rank 0 rewrites
    this JSON file after every row. ``verbose``: rank 0 prints each row as it is measured.
    """
    group = dist.group.WORLD
    variants = [
        v
        for v in VARIANTS
        if only is None or (only == "graph") == (v.graph_ops > 0) or only == "all"
    ]
    if only not in (None, "all", "eager", "graph"):
        raise ValueError(f"only={only!r}: use 'eager', 'graph' or 'all'")
    comm, comm_error = None, None
    if ctx.is_cuda and any("nccl_direct" in v.name for v in variants):
        from parlab.comm.nccl_direct import DirectComm

        try:  # a collective call: every rank gets here together
            comm = DirectComm(group, device=ctx.device)
        except Exception as e:
            comm_error = f"DirectComm: {type(e).__name__}: {str(e).splitlines()[0][:140]}"
    table: dict[str, Any] = {
        "probe": "collectives_small_probe",
        "tag": tag,
        "evidence": "real-nccl" if ctx.backend == "nccl" else "cpu-mechanism",
        "method": (
            f"all_reduce SUM fp32 in place over {ctx.world_size} ranks; {SAMPLES} samples of "
            f">= {OPS_PER_SAMPLE} ops after {WARMUP} warm-up; "
            + ("CUDA events on the current stream" if ctx.is_cuda else "perf_counter")
            + "; per rank the median and min over samples of time per op; the slowest rank's"
        ),
        "environment": _versions(ctx),
        "started": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "rows": [],
    }
    if verbose and ctx.rank == 0:
        e = table["environment"]
        print(
            f"torch {e['torch']}  CUDA {e['cuda'] or '-'}  NCCL {e['nccl'] or '-'}  "
            f"python {e['python']}  on {e['host']}: {', '.join(e['devices'])} "
            f"({ctx.backend}, {ctx.world_size} ranks)"
        )
        print("env: " + (" ".join(f"{k}={v}" for k, v in e["env"].items()) or "(none set)"))
        print(f"method: {table['method']}  [tag {tag}]")
        print(
            f"{'variant':<24}{'size':>8}{'median us':>11}{'min us':>9}{'issue us':>10}"
            f"{'wall us':>9}{'check':>7}  note"
        )
    for v in variants:
        for nbytes in sizes or SIZES:
            row: dict[str, Any] = {
                "variant": v.name,
                "what": v.what,
                "bytes": nbytes,
                "graph_ops": v.graph_ops,
                "median_us": None,
                "min_us": None,
                "issue_us": None,
                "wall_us": None,
                "samples": 0,
                "wrong_ranks": None,
                "checked": False,
                "skipped": None,
                "error": None,
            }
            if v.gpu_only and not ctx.is_cuda:
                row["skipped"] = (
                    "needs CUDA and NCCL (ncclAllReduce through ctypes); this run is on gloo CPU"
                    if "nccl_direct" in v.name
                    else "needs CUDA (graph capture / streams); this run is on gloo CPU"
                )
            else:
                (per, issue, wall), wrong, err = _measure(ctx, v, nbytes, group, comm)
                if "nccl_direct" in v.name and comm_error:
                    err = comm_error
                med = statistics.median(per) if per else -1.0
                mn = min(per) if per else -1.0
                # the slowest rank's times, the number of ranks that failed or were wrong
                tmax = torch.tensor([med, mn, issue, wall], dtype=torch.float64, device=ctx.device)
                tsum = torch.tensor(
                    [float(wrong), float(err is not None)], dtype=torch.float64, device=ctx.device
                )
                dist.all_reduce(tmax, op=dist.ReduceOp.MAX, group=group)
                dist.all_reduce(tsum, op=dist.ReduceOp.SUM, group=group)
                med, mn, issue, wall = tmax.tolist()
                nwrong, nerr = tsum.tolist()
                if nerr:
                    row["error"] = err or f"failed on {int(nerr)} rank(s)"
                else:
                    row.update(
                        median_us=med * 1e6,
                        min_us=mn * 1e6,
                        issue_us=issue * 1e6,
                        wall_us=wall * 1e6,
                        samples=len(per),
                        wrong_ranks=int(nwrong),
                        checked=_expected(ctx.world_size, max(1, v.graph_ops)) is not None,
                    )
            table["rows"].append(row)
            if ctx.rank == 0:
                first = nbytes == (sizes or SIZES)[0]
                if verbose and (first or not row["skipped"]):  # a skip is printed once
                    print(_format_row(row), flush=True)
                if out_path:
                    _write(table, Path(out_path))
    if comm is not None:
        torch.cuda.synchronize()
        table["environment"]["nccl_direct"] = {
            "library": comm.lib.path,
            "version": ".".join(map(str, comm.version)),
        }
        comm.close()
    return table


def _format_row(row: dict[str, Any]) -> str:
    size = f"{row['bytes'] >> 10}KiB" if row["bytes"] >= 1024 else f"{row['bytes']}B"
    head = f"{row['variant']:<24}{size:>8}"
    dashes = f"{'-':>11}{'-':>9}{'-':>10}{'-':>9}{'-':>7}"
    if row["skipped"]:
        return f"{row['variant']:<24}{'all':>8}{dashes}  {row['skipped']}"
    if row["error"]:
        return f"{head}{dashes}  {row['error']}"
    ok = "ok" if row["wrong_ranks"] == 0 else f"{row['wrong_ranks']} bad"
    times = "".join(
        f"{row[k]:>{w}.2f}"
        for k, w in (("median_us", 11), ("min_us", 9), ("issue_us", 10), ("wall_us", 9))
    )
    return f"{head}{times}{ok:>7}  {row['what']}"


def _write(table: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=1) + "\n")
    tmp.replace(path)


def summary(table: dict[str, Any]) -> list[str]:
    """Per size: the fastest measured variant against parlab's eager and graph ways, and
    c10d's cost per call (``dist`` minus ``nccl_direct``) where both were measured."""
    lines = []
    rows = [r for r in table["rows"] if r["median_us"] is not None]
    for nbytes in sorted({r["bytes"] for r in rows}):
        at = {r["variant"]: r["median_us"] for r in rows if r["bytes"] == nbytes}
        best = min(at, key=at.__getitem__)
        ref = ", ".join(
            f"{k} {at[k]:.2f}" for k in ("dist", "graph_dist_N100", "nccl_direct") if k in at
        )
        c10d = (
            f"; c10d per call (dist - nccl_direct) {at['dist'] - at['nccl_direct']:.2f} us"
            if "dist" in at and "nccl_direct" in at
            else ""
        )
        lines.append(f"{nbytes:>7} B: fastest {best} {at[best]:.2f} us/op ({ref}){c10d}")
    return lines


def _torchrun_main(a: argparse.Namespace) -> int:
    global SAMPLES, OPS_PER_SAMPLE, WARMUP
    SAMPLES, OPS_PER_SAMPLE, WARMUP = a.samples, a.ops_per_sample, a.warmup
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    else:
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
    backend = "nccl" if cuda else "gloo"
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    kw: dict[str, Any] = {"device_id": dev} if cuda else {}
    dist.init_process_group(backend, timeout=_dt.timedelta(seconds=120), **kw)
    ctx = RankContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        backend=backend,
        device=dev,
        timeout_s=120.0,
    )
    sizes = [int(s) for s in a.sizes.split(",")] if a.sizes else None
    out = Path(a.out) / f"collectives_small_probe-{a.tag}.json"
    try:
        table = probe_rank(
            ctx, sizes=sizes, only=a.only, out_path=str(out), tag=a.tag, verbose=True
        )
        if ctx.rank == 0:
            print("\n".join(["summary:", *summary(table)]))
            print(f"table written to {out}")
    except KeyboardInterrupt:
        if ctx.rank == 0:
            print(f"interrupted: the rows measured so far are in {out}")
        return 130
    finally:
        dist.destroy_process_group()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for collectives_small_probe-<tag>.json")
    ap.add_argument("--tag", default="default", help="label of this environment (file name)")
    ap.add_argument("--only", choices=["all", "eager", "graph"], default="all")
    ap.add_argument("--sizes", default=None, help="comma-separated bytes (default 8,1K,64K,256K)")
    ap.add_argument("--nproc", type=int, default=2, help="ranks when not started by torchrun")
    ap.add_argument("--samples", type=int, default=SAMPLES, help="timed samples per row")
    ap.add_argument("--ops-per-sample", type=int, default=OPS_PER_SAMPLE, help="ops per sample")
    ap.add_argument("--warmup", type=int, default=WARMUP, help="untimed ops first")
    a = ap.parse_args()
    if min(a.samples, a.ops_per_sample) < 1 or a.warmup < 0:
        ap.error("--samples and --ops-per-sample must be at least 1, --warmup at least 0")
    if a.sizes and any(not s.isdigit() or int(s) < 4 for s in a.sizes.split(",")):
        ap.error(f"--sizes {a.sizes!r}: give comma-separated byte counts >= 4, e.g. 8,1024")
    if "RANK" in os.environ:
        return _torchrun_main(a)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={a.nproc}",
        __file__,
        # the ranks' own arguments (torchrun's parser would take an abbreviated --nproc)
        *["--out", a.out, "--tag", a.tag, "--only", a.only, "--samples", str(a.samples)],
        *["--ops-per-sample", str(a.ops_per_sample), "--warmup", str(a.warmup)],
        *(["--sizes", a.sizes] if a.sizes else []),
    ]
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
