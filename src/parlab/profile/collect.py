"""One streaming pass over one rank's trace: the spans the analysis needs, in compact arrays.

``scan_trace`` reads the file once (``TraceScanner``) into a ``Collector`` (kernels and copies
with their launches on GPU runs; ATen ops, gloo transfers and c10d ops on CPU runs) and can
write the file's slimmed events (pid = rank, shared clock) as a gzip member of the merged trace.
"""

from __future__ import annotations

import contextlib
import gzip
import json
from array import array
from pathlib import Path
from typing import IO, Any

import numpy as np

from parlab.profile.classify import (
    COMM,
    COMPUTE,
    MEMORY,
    OTHER,
    collective_name,
    is_cpu_comm,
    kernel_kind,
    payload_from_meta,
    payload_from_shapes,
)
from parlab.profile.trace_reader import KINETO_CPU_OP_NOT_COMM, TraceFormatError, TraceScanner

KIND_CODE = {COMPUTE: 0, COMM: 1, MEMORY: 2, OTHER: 3}
"""Span kinds as the collector stores them (``k_kind``)."""
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver")

_enc = json.encoder.encode_basestring  # the C string escaper json.dumps uses


def _slim(
    ev: dict[str, Any], rank: int, shift: float, extra: dict[str, Any] | None, tids: set[Any]
) -> str:
    """One event for the merged trace: pid = rank, shared clock, args trimmed."""
    tid = ev.get("tid", 0)
    tids.add(tid)
    text = (
        f'{{"ph":"X","cat":{_enc(str(ev.get("cat", "")))},"name":{_enc(str(ev.get("name", "")))},'
        f'"pid":{rank},"tid":{json.dumps(tid)},"ts":{float(ev["ts"]) + shift:.3f},'
        f'"dur":{float(ev.get("dur", 0) or 0):.3f}'
    )
    if extra:
        return text + ',"args":' + json.dumps(extra, separators=(",", ":")) + "}"
    return text + "}"


class _Fragment:
    """This rank's part of the merged trace: ``,{event}`` lines in a gzip member."""

    def __init__(self, path: str | Path, rank: int, shift_us: float) -> None:
        self.file: IO[str] = gzip.open(path, "wt", compresslevel=1)  # noqa: SIM115
        self.rank = rank
        self.shift_us = shift_us
        self.tids: set[Any] = set()

    def write(self, ev: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
        self.file.write(",\n" + _slim(ev, self.rank, self.shift_us, extra, self.tids))

    def write_thread_names(self, thread_names: dict[Any, str]) -> None:
        """Name every lane the fragment used: GPU streams, else the trace's thread names."""
        for tid in sorted(self.tids, key=str):
            gpu_stream = isinstance(tid, int) and tid < 1000 and tid not in thread_names
            if gpu_stream:
                tname = f"stream {tid}"
            elif isinstance(tid, str):  # some profilers name streams "stream 7" themselves
                tname = thread_names.get(tid, tid)
            else:
                tname = thread_names.get(tid, f"thread {tid}")
            meta = {"ph": "M", "name": "thread_name", "pid": self.rank, "tid": tid}
            self.file.write(",\n" + json.dumps({**meta, "args": {"name": tname}}))

    def close(self) -> None:
        self.file.close()


def _comm_args(args: dict[str, Any]) -> dict[str, Any] | None:
    if "Collective name" not in args:
        return None
    keep = ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype")
    return {k: args[k] for k in keep if k in args}


def as_numpy(a: array) -> np.ndarray:
    """A collector array as a numpy array of its own (int8 for the ``b`` kind codes)."""
    return np.frombuffer(a, dtype=a.typecode if a.typecode != "b" else np.int8).copy()


class Collector:
    """Spans kept from one pass (compact arrays, not events); payloads -1 where unknown."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, float, float]] = []
        # GPU: kernels and copies
        self.k_ts = array("d")
        self.k_end = array("d")
        self.k_kind = array("b")
        self.k_corr = array("q")
        self.k_coll = array("i")  # index into coll_names for comm kernels, else -1
        self.k_bytes = array("q")  # -1 unknown
        self.k_name = array("i")
        self.runtime: dict[int, float] = {}
        self.comm_meta: dict[int, dict[str, Any]] = {}  # record_param_comms by External id
        self.k_ext = array("q")
        # CPU: ops and gloo/c10d comm
        self.c_ts = array("d")
        self.c_end = array("d")
        self.c_name = array("i")
        self.g_ts = array("d")  # gloo transfers
        self.g_end = array("d")
        self.g_coll = array("i")
        self.g_bytes = array("q")
        self.d_ts = array("d")  # c10d enqueue ops (fallback)
        self.d_end = array("d")
        self.d_coll = array("i")
        self.d_bytes = array("q")
        self.names: dict[str, int] = {}
        self.coll_names: dict[str, int] = {}
        self.thread_names: dict[Any, str] = {}

    def name_id(self, name: str) -> int:
        i = self.names.get(name)
        if i is None:
            i = self.names[name] = len(self.names)
        return i

    def coll_id(self, name: str) -> int:
        i = self.coll_names.get(name)
        if i is None:
            i = self.coll_names[name] = len(self.coll_names)
        return i

    def add(self, ev: dict[str, Any], *, gpu_trace: bool, frag: _Fragment | None) -> None:
        """Keep what one event contributes (and write it to ``frag`` where the merge shows it)."""
        ph = ev.get("ph")
        if ph != "X":
            if ph == "M" and ev.get("name") == "thread_name":
                self.thread_names[ev.get("tid")] = (ev.get("args") or {}).get("name", "")
            return
        cat = ev.get("cat", "")
        name = ev.get("name", "")
        try:
            ts = float(ev["ts"])
            end = ts + float(ev.get("dur", 0) or 0)
        except (KeyError, TypeError, ValueError):
            return
        args = ev.get("args") or {}
        if cat in _GPU_CATS:
            self._add_device(ev, cat, name, ts, end, args, frag)
        elif cat in _RUNTIME_CATS:
            corr = args.get("correlation")
            if corr is not None:
                self.runtime[int(corr)] = ts
        elif cat == "user_annotation" and name.startswith("ProfilerStep#"):
            with contextlib.suppress(ValueError):
                self.steps.append((int(name.split("#", 1)[1]), ts, end))
            if frag is not None:
                frag.write(ev)
        elif cat in ("cpu_op", "user_annotation"):
            self._add_cpu(ev, cat, name, ts, end, args, gpu_trace, frag)

    def _add_device(
        self,
        ev: dict[str, Any],
        cat: str,
        name: str,
        ts: float,
        end: float,
        args: dict[str, Any],
        frag: _Fragment | None,
    ) -> None:
        """A kernel or a copy: its span, kind, launch id and (collectives) name and payload."""
        kind = kernel_kind(name) if cat == "kernel" else MEMORY
        self.k_ts.append(ts)
        self.k_end.append(end)
        self.k_kind.append(KIND_CODE[kind])
        self.k_corr.append(int(args.get("correlation", -1) or -1))
        self.k_ext.append(int(args.get("External id", -1) or -1))
        self.k_name.append(self.name_id(name))
        extra = None
        if kind == COMM:
            cmeta = _comm_args(args)
            cname = collective_name(cmeta["Collective name"] if cmeta else name)
            nbytes = payload_from_meta(cmeta) if cmeta else None
            self.k_coll.append(self.coll_id(cname))
            self.k_bytes.append(-1 if nbytes is None else nbytes)
            extra = {"collective": cname, "bytes": nbytes}
        else:
            self.k_coll.append(-1)
            self.k_bytes.append(-1)
        if frag is not None:
            frag.write(ev, extra)

    def _add_cpu(
        self,
        ev: dict[str, Any],
        cat: str,
        name: str,
        ts: float,
        end: float,
        args: dict[str, Any],
        gpu_trace: bool,
        frag: _Fragment | None,
    ) -> None:
        """A CPU op: collective metadata, a gloo transfer, a c10d op or an ATen op."""
        comm = is_cpu_comm(name)
        if name.startswith("record_param_comms"):
            cmeta = _comm_args(args)
            if cmeta is not None and "External id" in args:
                self.comm_meta[int(args["External id"])] = cmeta
        elif name.startswith("gloo:"):
            cname = collective_name(name)
            nbytes = payload_from_shapes(args)
            self.g_ts.append(ts)
            self.g_end.append(end)
            self.g_coll.append(self.coll_id(cname))
            self.g_bytes.append(-1 if nbytes is None else nbytes)
            if frag is not None:
                frag.write(ev, {"collective": cname, "bytes": nbytes})
            return
        elif name.startswith("c10d::"):
            cname = collective_name(name)
            nbytes = payload_from_shapes(args, largest=True)
            self.d_ts.append(ts)
            self.d_end.append(end)
            self.d_coll.append(self.coll_id(cname))
            self.d_bytes.append(-1 if nbytes is None else nbytes)
        elif cat == "cpu_op" and not comm and name.startswith("aten::"):
            # only ATen ops: wrappers (autograd nodes, custom Functions, DDP's reducer
            # hooks) can hold a thread that waits for a collective
            self.c_ts.append(ts)
            self.c_end.append(end)
            self.c_name.append(self.name_id(name))
        if frag is not None and (not gpu_trace or comm) and cat == "cpu_op":
            frag.write(ev)


def rank_of(meta: dict[str, Any], path: Path) -> int:
    """The trace's global rank (``distributedInfo``, else parlab's metadata)."""
    info = meta.get("distributedInfo") or {}
    parlab_meta = meta.get("parlab") or {}
    for source in (info, parlab_meta):
        if isinstance(source, dict) and isinstance(source.get("rank"), int):
            return int(source["rank"])
    raise TraceFormatError(
        f"{path}: the trace names no rank (no distributedInfo.rank): "
        "capture it with torch.distributed initialised, e.g. through parlab profile run"
    )


def world_of(meta: dict[str, Any]) -> int | None:
    """The world size the trace reports, where it reports one."""
    for source in (meta.get("distributedInfo") or {}, meta.get("parlab") or {}):
        if isinstance(source, dict) and isinstance(source.get("world_size"), int):
            return int(source["world_size"])
    return None


def scan_trace(
    path: Path, *, fragment: str | Path | None, shift_us: float, rank: int | None
) -> tuple[Collector, dict[str, Any], int, int]:
    """Read ``path`` once: its spans, metadata, rank and the number of events read.

    ``fragment``: where to write this rank's merged-trace member (an empty one when the
    trace holds no events). ``TraceFormatError`` names the file when it is not a usable trace.
    """
    scanner = TraceScanner(path)
    col = Collector()
    gpu_trace: bool | None = None
    frag: _Fragment | None = None
    try:
        for ev in scanner.events():
            if gpu_trace is None:
                meta = scanner.meta
                gpu_trace = bool(meta.get("deviceProperties"))
                if gpu_trace:  # GPU runs take compute from kernels: skip the CPU ops unread
                    scanner.skip = KINETO_CPU_OP_NOT_COMM
                if rank is None:
                    rank = rank_of(meta, path)
                if fragment is not None:
                    frag = _Fragment(fragment, rank, shift_us)
            col.add(ev, gpu_trace=gpu_trace, frag=frag)
        if frag is not None:
            frag.write_thread_names(col.thread_names)
    finally:
        if frag is not None:
            frag.close()
    meta = scanner.meta
    if rank is None:
        rank = rank_of(meta, path)
    if fragment is not None and frag is None:
        gzip.open(fragment, "wt").close()
    return col, meta, rank, scanner.events_seen
