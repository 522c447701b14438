"""The sweep driver: validate, launch the ranks, follow progress, build the T1 document.

``run_sweep(spec, command=...)`` launches ``parlab.comm.bench:sweep_rank`` on
``spec.nproc`` ranks through torchrun (NCCL on GPUs, gloo on CPU). Rank 0
appends each measurement to a progress file as it is made; a thread here
reads it and calls ``on_record`` (the CLI's progress bar). If the user presses
Ctrl-C, the launcher stops the ranks and everything measured so far is still
turned into a document, marked partial in its notes.

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

import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parlab.comm import ops as O
from parlab.comm.bench import VIAS
from parlab.comm.calibration import SWEEP_KIND
from parlab.comm.model import link_peak
from parlab.contract import Document, Failure, Metric, new_run_id, now_iso, write_result
from parlab.errors import UsageError
from parlab.hardware import env as env_mod
from parlab.runtime.launch import LaunchConfig, launch
from parlab.topology import AXES, Topology
from parlab.units import parse_degrees

ENTRY = "parlab.comm.bench:sweep_rank"
GRAPH_ENV = (("NCCL_GRAPH_MIXING_SUPPORT", "0"),)
"""What ``--graph`` sweeps set on the ranks unless the environment already does. NCCL's
graph-mixing support (on by default) fences every captured collective with NCCL-internal
events so that graphs can run beside eager NCCL calls; the sweep never overlaps the two (it
synchronises the device between replays and its eager bookkeeping), and on 2xH200 the
support tripled a small all_reduce's time per op in a replayed graph (about 15 us against
5 us; benchmarks/collectives_small_probe.py). nccl-tests' ``-G`` runs nothing beside its
graphs either."""
FR_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
"""torch's flight recorder (on by default since torch 2.6) records every collective before
issuing it: bookkeeping that is not the collective. Sweeps turn it off
(``TORCH_FR_BUFFER_SIZE=0``) unless either name is set. On 2xH200 it made no measurable
difference to the small all_reduce (mean 38.1 us per op off, 40.5 us on;
benchmarks/collectives_vs_nccl_tests.py results)."""


def rank_env(graph: bool, environ: dict[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """The environment defaults a sweep's ranks get (``LaunchConfig.env_defaults``)."""
    environ = dict(os.environ) if environ is None else environ
    out: list[tuple[str, str]] = []
    if not any(k in environ for k in FR_ENV):
        out.append((FR_ENV[0], "0"))
    if graph:
        out.extend(GRAPH_ENV)
    return tuple(out)


def parse_mesh(text: str | None) -> dict[str, int] | None:
    """``dp=2,tp=4`` -> ``{"dp": 2, "tp": 4}`` (``parlab.units.parse_degrees``)."""
    return parse_degrees(text, AXES, "--mesh", "dp=2,tp=4") if text else None


@dataclass(frozen=True, kw_only=True)
class SweepSpec:
    """What to measure: nccl-tests' options plus parlab's mesh axis and launcher."""

    ops: tuple[str, ...]
    """Ops in run order (``parlab.comm.ops.OPS`` names)."""
    minbytes: int = 8
    """Smallest size (nccl-tests -b)."""
    maxbytes: int = 1 << 20
    """Largest size (nccl-tests -e)."""
    stepfactor: int = 2
    """Multiplicative step between sizes (nccl-tests -f)."""
    dtype: str = "float"
    """Element type (nccl-tests -d)."""
    warmup: int = 5
    """Untimed iterations per size (nccl-tests -w)."""
    iters: int = 20
    """Timed iterations per size (nccl-tests -n)."""
    inplace: bool = False
    """In-place buffers for the ops that have both forms (all_gather, reduce_scatter)."""
    graph: bool = False
    """Capture each timed loop in a CUDA graph and time its replays (nccl-tests -G); GPUs only."""
    via: str = "torch"
    """Who issues the ops: ``torch`` (c10d) or ``nccl`` (NCCL through ctypes; GPUs only)."""
    mesh: dict[str, int] | None = None
    """Mesh degrees (``Topology`` axes) when measuring a sub-group."""
    axis: str | None = None
    """The mesh axis whose groups run the collectives (None: the whole world)."""
    nproc: int = 2
    """Ranks (torchrun --nproc-per-node)."""
    backend: str = "auto"
    """``auto``, ``nccl`` or ``gloo``."""
    timeout_s: float = 300.0
    """Process-group timeout, seconds."""

    def __post_init__(self) -> None:
        if not self.ops:
            raise UsageError("no ops to measure: pass --op all or a list")
        O.size_range(self.minbytes, self.maxbytes, self.stepfactor)
        O.parse_dtype(self.dtype)
        if self.warmup < 0:
            raise UsageError(f"-w/--warmup-iters {self.warmup} is negative: use 0 or more")
        if self.iters < 1:
            raise UsageError(f"-n/--iters {self.iters} must be at least 1")
        if self.nproc < 1:
            raise UsageError(f"--nproc {self.nproc} is below 1: run at least one rank")
        if self.via not in VIAS:
            raise UsageError(f"--via {self.via!r} is not one of {', '.join(VIAS)}: pick one")
        if self.via == "nccl" and set(self.ops) == {"barrier"}:
            raise UsageError(
                "--op barrier has no NCCL call to issue directly: measure it with --via torch"
            )
        if self.axis is not None and not self.mesh:
            raise UsageError(f"--axis {self.axis} needs --mesh (e.g. --mesh dp=2,tp=4)")
        if self.mesh:
            Topology(world_size=self.nproc, **self.mesh)  # degrees must multiply to nproc
            if self.axis is None:
                raise UsageError("--mesh needs --axis naming the axis to measure (e.g. --axis tp)")
            if self.axis not in self.mesh:
                raise UsageError(
                    f"--axis {self.axis} is not in --mesh {self.mesh_text}: "
                    f"use one of {', '.join(self.mesh)}"
                )
            if self.mesh[self.axis] < 2:
                raise UsageError(
                    f"axis {self.axis} has degree 1: nothing crosses the wire; pick an axis of 2+"
                )

    @property
    def mesh_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in (self.mesh or {}).items())

    @property
    def group_size(self) -> int:
        """n, the ranks of each group the collectives run over."""
        return self.mesh[self.axis] if self.mesh and self.axis else self.nproc

    @property
    def sizes(self) -> list[int]:
        return O.size_range(self.minbytes, self.maxbytes, self.stepfactor)

    def plan(self) -> list[tuple[str, int, int]]:
        """``(op, requested, rounded)`` for every measurement the ranks will make, in order."""
        elem = O.parse_dtype(self.dtype).itemsize
        n = self.group_size
        out = []
        for op in self.ops:
            if op == "barrier":
                if self.via == "torch":  # NCCL has no barrier call: not run with --via nccl
                    out.append((op, 0, 0))
                continue
            if op == "send_recv" and n < 2:
                continue
            out.extend((op, s, r) for s, r in O.op_sizes(op, self.sizes, n, elem))
        return out


@dataclass
class SweepOutcome:
    """What a sweep produced."""

    doc: Document
    records: list[dict[str, Any]]
    interrupted: bool = False
    devices: list[str] = field(default_factory=list)


def _follow(path: Path, stop: threading.Event, on_record: Callable[[dict], None]) -> None:
    pos = 0
    while True:
        done = stop.is_set()
        try:
            with open(path) as f:
                f.seek(pos)
                while True:
                    line = f.readline()
                    if not line.endswith("\n"):
                        break
                    pos += len(line.encode())
                    on_record(json.loads(line))
        except FileNotFoundError:
            pass
        if done:
            return
        stop.wait(0.1)


def _read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


def resolve_backend(spec: SweepSpec) -> str:
    backend = LaunchConfig(nproc=spec.nproc, backend=spec.backend).resolved_backend()
    O.check_backend_dtype(backend, O.parse_dtype(spec.dtype), list(spec.ops))
    if spec.graph and backend != "nccl":
        raise UsageError(
            "--graph captures CUDA graphs and needs GPUs with NCCL: drop --graph on CPU/gloo runs"
        )
    if spec.via == "nccl" and backend != "nccl":
        raise UsageError(
            "--via nccl calls NCCL directly and needs GPUs with NCCL: use --via torch on "
            "CPU/gloo runs"
        )
    if spec.via == "nccl":
        from parlab.comm.nccl_library import check_library_env

        check_library_env()
    return backend


def run_sweep(
    spec: SweepSpec,
    *,
    command: str,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> SweepOutcome:
    """Launch the sweep; return its document (not yet written) even when interrupted."""
    backend = resolve_backend(spec)
    snap = env_mod.snapshot()
    interrupted = False
    with tempfile.TemporaryDirectory(prefix="parlab-sweep-") as tmp:
        progress = Path(tmp) / "progress.jsonl"
        stop = threading.Event()
        follower = None
        if on_record is not None:
            follower = threading.Thread(
                target=_follow, args=(progress, stop, on_record), daemon=True
            )
            follower.start()
        kwargs = {
            "ops": list(spec.ops),
            "sizes": spec.sizes,
            "dtype": spec.dtype,
            "warmup": spec.warmup,
            "iters": spec.iters,
            "inplace": spec.inplace,
            "graph": spec.graph,
            "via": spec.via,
            "mesh": spec.mesh,
            "axis": spec.axis,
            "progress_path": str(progress),
        }
        res = None
        try:
            res = launch(
                ENTRY,
                kwargs,
                LaunchConfig(
                    nproc=spec.nproc,
                    backend=backend,
                    timeout_s=spec.timeout_s,
                    env_defaults=rank_env(spec.graph),
                ),
            )
        except KeyboardInterrupt:
            interrupted = True
        finally:
            stop.set()
            if follower is not None:
                follower.join(timeout=5)
        direct = None
        if res is not None and res.ok:
            records = res.results[0]["records"]
            devices = [r["device"] for r in res.results]
            direct = res.results[0].get("nccl_direct")
        else:
            records = _read_records(progress)
            devices = []
    doc = build_document(
        spec,
        records,
        backend=backend,
        environment=snap,
        devices=devices,
        command=command,
        failure=None if (res is None or res.ok) else res.failure,
        interrupted=interrupted,
        nccl_direct=direct,
    )
    return SweepOutcome(doc=doc, records=records, interrupted=interrupted, devices=devices)


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
    n = spec.group_size
    link_bw, link_src = link_peak(environment, _group_ranks(spec) if backend == "nccl" else None)
    if backend != "nccl":
        link_bw, link_src = None, "gloo CPU ranks: no link peak"
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
    planned = spec.plan()
    metrics["measurements"] = Metric(value=len(records), unit="count")
    notes = [
        "time = mean per op over the timed iterations on the slowest rank (MAX over ranks); "
        "busbw = algbw x nccl-tests factor (all_reduce 2(n-1)/n; all_gather, reduce_scatter, "
        "all_to_all (n-1)/n; broadcast, reduce, send_recv 1)",
        "results checked on one untimed iteration with exact integer patterns; "
        "#wrong counts differing elements over all ranks",
        "all_reduce, broadcast and reduce are in place (torch's API); all_to_all and "
        "send_recv out of place; --inplace applies to all_gather and reduce_scatter",
    ]
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
    layout: dict[str, Any] = {
        "world_size": spec.nproc,
        "mesh": dict(spec.mesh) if spec.mesh else {"world": spec.nproc},
        "axis": spec.axis,
        "group_size": n,
        "strategy": None,
        "backend": backend,
        "via": spec.via,
    }
    workload = {
        "kind": SWEEP_KIND,
        "collectives": {
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
        },
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


def write_sweep(doc: Document, results: Path) -> Path:
    """Write the plot beside the document, then the document; return the document's path."""
    from parlab.comm.report import plot_busbw

    folder = Path(results) / doc.project
    name = f"{doc.run_id}.busbw.png"
    rows = doc.workload.get("measurements") or []
    artifacts = dict(doc.artifacts)
    if any(r["op"] != "barrier" for r in rows):
        os.makedirs(folder, exist_ok=True)
        plot_busbw(doc, folder / name)
        artifacts["busbw_plot"] = name
    from dataclasses import replace

    return write_result(replace(doc, artifacts=artifacts), results)
