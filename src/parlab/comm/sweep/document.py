"""The T1 collectives-sweep document, built from the ranks' records.

The document (project PAR-COLLECTIVES, task T1; evidence ``real-nccl`` on
NCCL, ``cpu-mechanism`` on gloo):

- ``workload.measurements``: one row per (op, size), the printed table:
  ``op, size, count, type, redop, root, inplace, graph, method, via, time_s`` (mean
  per op, slowest rank), ``time_median_s, time_min_s, time_max_s`` (over the
  samples), ``time_per_rank_s``, ``algbw, busbw`` (bytes/s), ``wrong``,
  ``group_size``, ``requested_bytes`` (before rounding);
- ``metrics``: ``busbw_peak`` (B/s, the highest busbw of any row: the asset
  table's headline), and per op ``<op>.busbw_peak`` (B/s),
  ``<op>.busbw_peak_size`` (B), ``<op>.busbw_pct_of_link`` (%, None when the
  link peak is unknown), ``<op>.latency`` (s, mean time at its smallest
  size), ``<op>.wrong`` (count); ``barrier.latency`` (s); ``wrong_total``;
- ``artifacts.busbw_plot``: the busbw-vs-size PNG beside the document.

``via`` (``workload.collectives.via``, ``layout.via``, every row's ``via``) says who
issued the ops: ``torch`` (c10d, the default) or ``nccl`` (NCCL called directly through
ctypes, ``parlab.comm.nccl_direct``; GPUs only; ``workload.nccl_direct`` names the
library and its version). Both are ``real-nccl``; the same sizes measured both ways give
c10d's cost per call as the difference.
"""

from __future__ import annotations

import os
from typing import Any

from parlab.comm import ops as O
from parlab.comm.calibration import SWEEP_KIND
from parlab.comm.model import link_peak
from parlab.comm.sweep.spec import FR_ENV, GRAPH_ENV, SweepSpec, rank_env
from parlab.contract import Document, Failure, Metric, new_run_id, now_iso
from parlab.topology import Topology


def _group_ranks(spec: SweepSpec) -> list[int]:
    if spec.mesh and spec.axis:
        return Topology(world_size=spec.nproc, **spec.mesh).groups(spec.axis)[0]
    return list(range(spec.nproc))


def build_document(
    spec: SweepSpec,
    records: list[dict[str, Any]],
    *,
    backend: str,
    environment: dict[str, Any],
    devices: list[str],
    command: str,
    failure: Failure | None = None,
    interrupted: bool = False,
    nccl_direct: dict[str, Any] | None = None,
) -> Document:
    """The T1 sweep document for ``records`` (see the module docstring).

    ``nccl_direct``: the library path and version the ranks loaded for ``--via nccl``."""
    link_bw, link_src = link_peak(environment, _group_ranks(spec) if backend == "nccl" else None)
    if backend != "nccl":
        link_bw, link_src = None, "gloo CPU ranks: no link peak"
    metrics = _metrics(spec, records, link_bw)
    notes = [
        *_method_notes(spec, nccl_direct),
        *_run_notes(spec, records, failure, interrupted, link_bw, link_src),
        *_backend_notes(spec, backend, environment),
    ]
    layout: dict[str, Any] = {
        "world_size": spec.nproc,
        "mesh": dict(spec.mesh) if spec.mesh else {"world": spec.nproc},
        "axis": spec.axis,
        "group_size": spec.group_size,
        "strategy": None,
        "backend": backend,
        "via": spec.via,
    }
    workload = {
        "kind": SWEEP_KIND,
        "collectives": _collectives(spec, backend),
        "devices": devices,
        "link_bw": link_bw,
        "link_bw_source": link_src,
        "nccl_direct": nccl_direct,
        "partial": interrupted or failure is not None,
        "measurements": records,
    }
    status = "ok" if failure is None else "failed"
    return Document(
        run_id=new_run_id("collectives"),
        created=now_iso(),
        project="PAR-COLLECTIVES",
        task="T1",
        role="baseline" if failure is None else "failure",
        evidence_level="real-nccl" if backend == "nccl" else "cpu-mechanism",
        command=command,
        environment=environment,
        workload=workload,
        layout=layout,
        metrics=metrics,
        status=status,
        failure=failure,
        notes=notes,
    )


def _metrics(
    spec: SweepSpec, records: list[dict[str, Any]], link_bw: float | None
) -> dict[str, Metric]:
    """The headline busbw, each op's peak, latency and #wrong, and the totals."""
    metrics: dict[str, Metric] = {}
    sized = [r for r in records if r["op"] != "barrier"]
    if sized:
        metrics["busbw_peak"] = Metric(value=max(r["busbw"] for r in sized), unit="B/s")
    wrong_total: int | None = 0
    for op in spec.ops:
        rows = [r for r in records if r["op"] == op]
        if not rows:
            continue
        wrongs = [r["wrong"] for r in rows]
        op_wrong = None if any(w is None for w in wrongs) else sum(wrongs)
        wrong_total = None if op_wrong is None or wrong_total is None else wrong_total + op_wrong
        if op == "barrier":
            metrics["barrier.latency"] = Metric(value=rows[0]["time_s"], unit="s")
            continue
        best = max(rows, key=lambda r: r["busbw"])
        metrics[f"{op}.busbw_peak"] = Metric(value=best["busbw"], unit="B/s")
        metrics[f"{op}.busbw_peak_size"] = Metric(value=best["size"], unit="B")
        metrics[f"{op}.busbw_pct_of_link"] = Metric(
            value=100.0 * best["busbw"] / link_bw if link_bw else None, unit="%"
        )
        metrics[f"{op}.latency"] = Metric(
            value=min(rows, key=lambda r: r["size"])["time_s"], unit="s"
        )
        metrics[f"{op}.wrong"] = Metric(value=op_wrong, unit="count")
    metrics["wrong_total"] = Metric(value=wrong_total, unit="count")
    metrics["measurements"] = Metric(value=len(records), unit="count")
    return metrics


def _method_notes(spec: SweepSpec, nccl_direct: dict[str, Any] | None) -> list[str]:
    """How time, busbw and #wrong are defined; the sizes rounded or skipped; who issued the ops."""
    n = spec.group_size
    notes = [
        "time = mean per op over the timed iterations on the slowest rank (MAX over ranks); "
        "busbw = algbw x nccl-tests factor (all_reduce 2(n-1)/n; all_gather, reduce_scatter, "
        "all_to_all (n-1)/n; broadcast, reduce, send_recv 1)",
        "results checked on one untimed iteration with exact integer patterns; "
        "#wrong counts differing elements over all ranks",
        "all_reduce, broadcast and reduce are in place (torch's API); all_to_all and "
        "send_recv out of place; --inplace applies to all_gather and reduce_scatter",
    ]
    planned = spec.plan()
    rounded = sorted({(op, req, got) for op, req, got in planned if op != "barrier" and req != got})
    if rounded:
        ex = ", ".join(f"{op} {req}->{got} B" for op, req, got in rounded[:4])
        notes.append(
            f"{len(rounded)} size(s) rounded down to a multiple of n x element size "
            f"(n(n+1)/2 x for all_to_all_uneven), as nccl-tests does: {ex}"
            + (" ..." if len(rounded) > 4 else "")
        )
    elem = O.parse_dtype(spec.dtype).itemsize
    skipped = sorted(
        {
            op
            for op in spec.ops
            for s in spec.sizes
            if op != "barrier" and O.round_size(op, s, n, elem) == 0
        }
    )
    if skipped:
        notes.append(f"sizes below one element per rank were skipped for {', '.join(skipped)}")
    if "send_recv" in spec.ops and n < 2:
        notes.append("send_recv needs 2 or more ranks: skipped")
    if spec.via == "nccl":
        lib = nccl_direct or {}
        notes.append(
            "issued by NCCL called directly (ctypes: ncclAllReduce, ncclAllGather, "
            "ncclReduceScatter, ncclBroadcast, ncclReduce; send_recv and all_to_all as grouped "
            "ncclSend/ncclRecv), not through torch's c10d: no work objects, events or watchdog "
            f"per op; NCCL {lib.get('version', '?')} from {lib.get('library', '?')}; "
            "a --via torch sweep of the same sizes gives c10d's cost per call as the difference"
        )
        if "barrier" in spec.ops:
            notes.append("barrier has no NCCL call: not measured with --via nccl (use --via torch)")
    return notes


def _run_notes(
    spec: SweepSpec,
    records: list[dict[str, Any]],
    failure: Failure | None,
    interrupted: bool,
    link_bw: float | None,
    link_src: str,
) -> list[str]:
    """Whether the run is partial, and where the link peak came from."""
    notes = []
    planned = spec.plan()
    if interrupted:
        notes.append(
            f"partial: interrupted (Ctrl-C) after {len(records)} of {len(planned)} measurements"
        )
    elif failure is not None:
        notes.append(f"partial: the run failed after {len(records)} of {len(planned)} measurements")
    if link_bw:
        notes.append(f"link peak {link_bw / 1e9:.1f} GB/s per direction from {link_src}")
    else:
        notes.append(f"link peak unknown ({link_src}): percent of link not computed")
    return notes


def _backend_notes(spec: SweepSpec, backend: str, environment: dict[str, Any]) -> list[str]:
    """The ranks' environment defaults on NCCL; what gloo CPU ranks do and do not prove."""
    notes = []
    if backend == "nccl":
        keys = [*FR_ENV, *(k for k, _ in GRAPH_ENV if spec.graph)]
        given = dict(rank_env(spec.graph))
        shown = [
            f"{k}={os.environ.get(k, given.get(k))}" for k in keys if k in os.environ or k in given
        ]
        notes.append(
            "ranks ran with "
            + " ".join(shown)
            + " (parlab's defaults for a sweep: no flight recorder"
            + (", no NCCL graph mixing under --graph" if spec.graph else "")
            + "; an environment that sets them wins)"
        )
    if backend == "gloo":
        notes.append("gloo CPU ranks: proves the mechanism and the volumes, not GPU speed")
        gpus = (environment.get("hardware") or {}).get("gpu_count") or 0
        if gpus:
            notes.append(
                f"this machine has {gpus} GPU(s) but the run used gloo CPU ranks "
                f"(--nproc {spec.nproc} > GPUs, or --backend gloo)"
            )
    return notes


def _collectives(spec: SweepSpec, backend: str) -> dict[str, Any]:
    """``workload.collectives``: the sweep's options and how it timed."""
    return {
        "ops": list(spec.ops),
        "minbytes": spec.minbytes,
        "maxbytes": spec.maxbytes,
        "stepfactor": spec.stepfactor,
        "dtype": O.dtype_name(O.parse_dtype(spec.dtype)),
        "warmup_iters": spec.warmup,
        "iters": spec.iters,
        "inplace": spec.inplace,
        "graph": spec.graph,
        "via": spec.via,
        "timing": ("cuda-graph replays" if spec.graph else "cuda events around the timed loop")
        + ("; ops issued by NCCL directly (no c10d)" if spec.via == "nccl" else "")
        if backend == "nccl"
        else "perf_counter",
    }
