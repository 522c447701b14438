"""Hand-built Chrome traces with known answers, in the shape torch.profiler writes them.

For tests (overlap 100 % when communication sits inside compute, 0 % when
it does not, ...) and for the analysis-speed benchmark (a trace of any size,
written as a stream). A GPU trace has, per step, a ``ProfilerStep#N`` CPU
span, one ``cudaLaunchKernel`` runtime event per kernel (inside the step's CPU
window) and the kernel itself, tied by ``correlation``, as Kineto writes
them; a CPU trace has ``cpu_op`` compute spans and ``gloo:*`` transfers on a
second thread. Times are microseconds.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO


@dataclass(frozen=True, kw_only=True)
class Span:
    """One kernel (GPU traces) or one CPU op / gloo transfer (CPU traces)."""

    kind: str
    """``compute``, ``comm`` or ``memory``."""
    start: float
    """Start, microseconds from the step's start."""
    dur: float
    """Duration, microseconds."""
    name: str | None = None
    """Event name; a default per kind when None."""
    stream: int = 7
    """GPU stream (the event's tid)."""
    args: dict[str, Any] = field(default_factory=dict)
    """Extra event args (e.g. ``Collective name``, ``In msg nelems``, ``dtype``)."""


_DEFAULT_GPU = {
    "compute": "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn",
    "comm": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "memory": "Memcpy DtoD (Device -> Device)",
}


def _event(
    cat: str,
    name: str,
    ts: float,
    dur: float,
    args: dict[str, Any],
    *,
    pid: int = 100,
    tid: int = 100,
) -> dict[str, Any]:
    """One complete (``"ph": "X"``) event, its keys in Kineto's order."""
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def trace_doc(
    events: list[dict[str, Any]],
    *,
    rank: int,
    world_size: int,
    run_id: str | None = "synthetic",
    gpu: bool = True,
    base_ns: int = 1_700_000_000_000_000_000,
) -> dict[str, Any]:
    """A whole trace document (metadata first, as Kineto writes it)."""
    doc: dict[str, Any] = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}] if gpu else [],
        "distributedInfo": {
            "backend": "nccl" if gpu else "gloo",
            "rank": rank,
            "world_size": world_size,
        },
    }
    if run_id is not None:
        doc["parlab"] = {"run_id": run_id, "rank": rank, "world_size": world_size}
    doc["baseTimeNanoseconds"] = base_ns
    doc["traceEvents"] = events
    doc["traceName"] = f"rank{rank}"
    return doc


def gpu_events(
    steps: list[list[Span]], *, step_us: float = 1000.0, t0: float = 1.0e6, lag_us: float = 0.0
) -> list[dict[str, Any]]:
    """Events of a GPU trace: step ``k`` covers CPU time ``[t0 + k*step_us, +step_us)``.

    Kernel times are ``t0 + k*step_us + lag_us + span.start``: ``lag_us`` moves
    the GPU behind the CPU (a kernel may run in the next step's CPU window and
    still belongs to the step that launched it).
    """
    out: list[dict[str, Any]] = []
    corr = 1
    for k, spans in enumerate(steps):
        base = t0 + k * step_us
        out.append(_event("user_annotation", f"ProfilerStep#{k + 1}", base, step_us, {}))
        for i, sp in enumerate(spans):
            launch = base + 1.0 + i * 0.01
            out.append(
                _event("cuda_runtime", "cudaLaunchKernel", launch, 0.005, {"correlation": corr})
            )
            cat = "gpu_memcpy" if sp.kind == "memory" else "kernel"
            args = {"correlation": corr, "stream": sp.stream, "device": 0, **sp.args}
            name = sp.name or _DEFAULT_GPU[sp.kind]
            ts = base + lag_us + sp.start
            out.append(_event(cat, name, ts, sp.dur, args, pid=0, tid=sp.stream))
            corr += 1
    return out


def cpu_events(
    steps: list[list[Span]], *, step_us: float = 1000.0, t0: float = 1.0e6
) -> list[dict[str, Any]]:
    """Events of a CPU (gloo) trace: compute spans are ``cpu_op`` on the main thread,
    comm spans ``gloo:<name>`` on a gloo thread (``Input Dims``/``Input type`` from args)."""
    out: list[dict[str, Any]] = []
    for k, spans in enumerate(steps):
        base = t0 + k * step_us
        out.append(_event("user_annotation", f"ProfilerStep#{k + 1}", base, step_us, {}))
        for sp in spans:
            comm = sp.kind == "comm"
            cat = "user_annotation" if comm else "cpu_op"
            name = sp.name or ("gloo:all_reduce" if comm else "aten::mm")
            tid = 101 if comm else 100
            out.append(_event(cat, name, base + sp.start, sp.dur, dict(sp.args), tid=tid))
    return out


def write_trace(path: str | Path, doc: dict[str, Any]) -> Path:
    """Write a trace document (gzip when the name ends in ``.gz``), indented like Kineto."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=2)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


_KERNEL_TMPL = """  {{
    "ph": "X", "cat": "kernel", "name": "{name}", "pid": 0, "tid": {stream},
    "ts": {ts:.3f}, "dur": {dur:.3f},
    "args": {{
      "External id": {ext}, "queued": 0, "device": 0, "context": 1, "stream": {stream}, "correlation": {corr}, "registers per thread": 128, "shared memory": 49152, "blocks per SM": 2.5, "warps per SM": 10.0, "grid": [264, 1, 1], "block": [128, 1, 1], "est. achieved occupancy %": 25{extra}
    }}
  }},
"""
_LAUNCH_TMPL = """  {{
    "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 100,
    "ts": {ts:.3f}, "dur": 4.120,
    "args": {{
      "External id": {ext}, "cbid": 211, "correlation": {corr}
    }}
  }},
"""
_OP_TMPL = """  {{
    "ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 100,
    "ts": {ts:.3f}, "dur": 6.500,
    "args": {{
      "External id": {ext}, "Record function id": 0, "Input Dims": [[4096, 2048], [2048, 5632]], "Input type": ["c10::BFloat16", "c10::BFloat16"], "Ev Idx": {ext}
    }}
  }},
"""


def write_big_trace(
    out: TextIO, *, target_bytes: int, rank: int, world_size: int, run_id: str = "bench"
) -> dict[str, int]:
    """Stream a GPU trace of about ``target_bytes`` to ``out``; return what it holds.

    Each step: 200 compute kernels and 20 all-reduce kernels on a second stream
    (each comm kernel half-covered by compute), every kernel with its launch
    event and a CPU op: about 900 bytes per kernel, like real Kineto output.
    """
    head = trace_doc([], rank=rank, world_size=world_size, run_id=run_id)
    head.pop("traceEvents")
    head.pop("traceName")
    text = json.dumps(head, indent=2)[:-2] + ',\n  "traceEvents": [\n'
    out.write(text)
    written = len(text)
    step = 0
    kernels = 0
    corr = 1
    step_us = 10_000.0
    comp_name = _DEFAULT_GPU["compute"]
    comm_name = _DEFAULT_GPU["comm"]
    comm_extra = ', "Collective name": "allreduce", "In msg nelems": 6553600, "Out msg nelems": 6553600, "Group size": 2, "dtype": "Float"'
    while written < target_bytes:
        base = 1.0e6 + step * step_us
        parts = [
            f'  {{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "pid": 100, "tid": 100, "ts": {base:.3f}, "dur": {step_us:.3f}, "args": {{}}}},\n'
        ]
        for i in range(220):
            comm = i % 11 == 10
            ts_launch = base + 5 + i * 40.0
            ts_k = base + 100 + i * 40.0
            parts.append(_OP_TMPL.format(ts=ts_launch - 1, ext=corr))
            parts.append(_LAUNCH_TMPL.format(ts=ts_launch, ext=corr, corr=corr))
            parts.append(
                _KERNEL_TMPL.format(
                    name=comm_name if comm else comp_name,
                    stream=20 if comm else 7,
                    ts=ts_k - 20 if comm else ts_k,
                    dur=40.0 if comm else 38.0,
                    ext=corr,
                    corr=corr,
                    extra=comm_extra if comm else "",
                )
            )
            corr += 1
            kernels += 1
        chunk = "".join(parts)
        out.write(chunk)
        written += len(chunk)
        step += 1
    tail = (
        '  {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": '
        f'{1.0e6 + step * step_us:.3f}}}\n  ],\n  "traceName": "rank{rank}"\n}}\n'
    )
    out.write(tail)
    return {"bytes": written + len(tail), "steps": step, "kernels": kernels}
