"""The sweep driver: validate, launch the ranks, follow progress, build the T1 document.

``run_sweep(spec, command=...)`` launches ``parlab.comm.bench:sweep_rank`` on
``spec.nproc`` ranks through torchrun (NCCL on GPUs, gloo on CPU). Rank 0
appends each measurement to a progress file as it is made; a thread here
reads it and calls ``on_record`` (the CLI's progress bar). If the user presses
Ctrl-C, the launcher stops the ranks and everything measured so far is still
turned into a document, marked partial in its notes.

The document it builds is ``parlab.comm.sweep.document``'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from parlab.comm import ops as O
from parlab.comm.nccl_library import check_library_env
from parlab.comm.report import plot_busbw
from parlab.comm.sweep.document import build_document
from parlab.comm.sweep.spec import SweepSpec, rank_env
from parlab.contract import Document, write_result
from parlab.errors import UsageError
from parlab.hardware import env as env_mod
from parlab.runtime.launch import LaunchConfig, launch

ENTRY = "parlab.comm.bench:sweep_rank"


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


def write_sweep(doc: Document, results: Path) -> Path:
    """Write the plot beside the document, then the document; return the document's path."""
    folder = Path(results) / doc.project
    name = f"{doc.run_id}.busbw.png"
    rows = doc.workload.get("measurements") or []
    artifacts = dict(doc.artifacts)
    if any(r["op"] != "barrier" for r in rows):
        os.makedirs(folder, exist_ok=True)
        plot_busbw(doc, folder / name)
        artifacts["busbw_plot"] = name

    return write_result(replace(doc, artifacts=artifacts), results)
