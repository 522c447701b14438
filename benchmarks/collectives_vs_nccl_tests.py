"""``parlab collectives`` against NVIDIA's nccl-tests on the same machine (issue 4's targets).

What it compares (reads documents only; measures nothing itself):

- busbw at 64 MiB and above, per op, from the newest ``real-nccl`` sweep
  document in RESULTS (the slowest rank's mean time per op over the timed
  loop, CUDA events around the loop, busbw with nccl-tests' factors), against
  nccl-tests' out-of-place busbw at the same size. Target: within 3 %.
- small all_reduce (8 B - 256 KiB) time per op, without and with CUDA graphs
  (``--graph``, as nccl-tests' ``-G``). Target: within 20 % of nccl-tests.

Each comparison is made per path: ``via=torch`` (the ops issued through torch's c10d,
what training pays; documents written before ``--via`` existed are this path) and
``via=nccl`` (``parlab collectives --via nccl``: NCCL called directly through ctypes, as
nccl-tests calls it). Where both paths measured the small all_reduce, the last section
prints c10d's cost per call: the torch path's time minus the direct path's, size by size
(the newest sweep of each path, same graph setting).

Where the nccl-tests numbers come from, in order:

1. nccl-tests logs passed with ``--nccl-tests LOG`` (the ``*_perf`` stdout;
   ``scripts/gpu/collectives.sh`` writes them when nccl-tests is on the
   machine): measured on the same machine, compared size by size;
2. otherwise the external reference figures issue 4 quotes for the 2xH200
   machine with NVLS off (all_reduce busbw ~330 GB/s at 1 GiB, ~344 GB/s at
   4 GiB; small all_reduce ~21 us per op without graphs, ~5.5-8 us with).
   These are printed as an *external reference*, never as a parlab
   measurement; ops without a reference show "no reference".

    .venv/bin/python benchmarks/collectives_vs_nccl_tests.py RESULTS [--nccl-tests LOG ...]
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

from parlab.contract import Document, read_results

EXTERNAL = "external reference (nccl-tests, 2xH200, NVLS off, as quoted in issue 4)"
EXTERNAL_BUSBW = {("all_reduce", 1 << 30): 330e9, ("all_reduce", 4 << 30): 344e9}
EXTERNAL_SMALL_US = {False: (21.0, 21.0), True: (5.5, 8.0)}
BIG = 64 << 20
SMALL_MAX = 256 << 10
LAYOUTS = {
    "-t 1 -g 2": "one thread launches on both GPUs",
    "-t 2 -g 1": "one thread per GPU, as parlab's one process per GPU",
}

_NT_OPS = {
    "all_reduce_perf": "all_reduce",
    "all_gather_perf": "all_gather",
    "reduce_scatter_perf": "reduce_scatter",
    "alltoall_perf": "all_to_all",
    "broadcast_perf": "broadcast",
    "reduce_perf": "reduce",
    "sendrecv_perf": "send_recv",
}
_ROW = re.compile(
    r"^\s*(\d+)\s+(\d+)\s+\S+\s+\S+\s+-?\d+\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+(\S+)"
)


def parse_nccl_tests(
    path: Path,
) -> tuple[str | None, bool, str, dict[int, tuple[float, float]]]:
    """(op, graph, layout, {size: (time_us, busbw B/s)}) from one nccl-tests stdout
    (out-of-place columns). ``layout``: how its process drove the GPUs -- ``-g 2`` (one
    thread launches on both GPUs) or ``-t 2 -g 1`` (a thread per GPU, as one process per
    GPU drives it; parlab's ranks are one process per GPU)."""
    text = path.read_text(errors="replace")
    op = next((o for b, o in _NT_OPS.items() if b in text or b in path.name), None)
    m = re.search(r"graph:\s*(\d+)", text)
    graph = bool(m and int(m.group(1)))
    lay = re.search(r"nThread\s+(\d+)\s+nGpus\s+(\d+)", text)
    layout = f"-t {lay.group(1)} -g {lay.group(2)}" if lay else "?"
    it = re.search(r"warmup iters:\s*\d+\s+iters:\s*(\d+)", text)
    if it and it.group(1) != "20":  # nccl-tests' default: unmarked
        layout += f" -n {it.group(1)}"
    rows = {}
    for line in text.splitlines():
        r = _ROW.match(line)
        if r:
            rows[int(r.group(1))] = (float(r.group(3)), float(r.group(5)) * 1e9)
    return op, graph, layout, rows


FAULT_VARS = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_ALGO", "NCCL_PROTO", "NCCL_P2P_LEVEL")
"""Variables that force NCCL off its normal path: sweeps run with them (the doctor's
reproductions of a slow link) are not measurements of the machine's normal speed."""


def faults(doc: Document) -> list[str]:
    """The ``FAULT_VARS`` set in ``doc``'s environment, as ``NAME=value``."""
    env = doc.environment.get("variables") or {}
    return [f"{k}={env[k]}" for k in FAULT_VARS if k in env]


def newest_sweeps(results: Path, level: str = "real-nccl") -> list[Document]:
    """Sweeps at ``level`` without forced NCCL paths, oldest first (by creation time)."""
    entries, _ = read_results(results)
    docs = [
        e.doc
        for e in entries
        if e.doc.evidence_level == level and e.doc.workload.get("kind") == "collectives-sweep"
    ]
    for d in docs:
        if faults(d):
            print(f"# left out {d.run_id}: run with {' '.join(faults(d))}")
    return sorted((d for d in docs if not faults(d)), key=lambda d: d.created)


def fr_setting(doc: Document) -> str:
    """The flight recorder's buffer the ranks ran with (parlab's sweeps turn it off)."""
    env = doc.environment.get("variables") or {}
    for k in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        if k in env:
            return f"{k}={env[k]}"
    for n in doc.notes:
        if "TORCH_FR_BUFFER_SIZE=0" in n:
            return "TORCH_FR_BUFFER_SIZE=0 (parlab's default)"
    return "torch's default (flight recorder on)"


def rows_of(doc: Document, op: str) -> dict[int, dict]:
    return {r["size"]: r for r in doc.workload["measurements"] if r["op"] == op}


VIAS = ("torch", "nccl")
"""The paths a sweep can issue its ops through (``parlab collectives --via``)."""


def via_of(doc: Document) -> str:
    """Who issued the sweep's ops: ``torch`` (c10d; every sweep before ``--via``) or ``nccl``."""
    return doc.workload["collectives"].get("via", "torch")


def _small_sweeps(docs: list[Document], graph: bool, via: str) -> list[Document]:
    return [
        d
        for d in docs
        if d.workload["collectives"]["graph"] == graph
        and via_of(d) == via
        and any(
            r["op"] == "all_reduce" and r["size"] <= SMALL_MAX for r in d.workload["measurements"]
        )
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--nccl-tests", type=Path, nargs="*", default=[])
    args = ap.parse_args()
    docs = newest_sweeps(args.results)
    if not docs:
        docs = newest_sweeps(args.results, "cpu-mechanism")
        if not docs:
            print(f"no collectives sweep under {args.results}: run scripts/gpu/collectives.sh")
            return
        print("# DRY RUN: no real-nccl sweep, showing cpu-mechanism documents; the targets")
        print("# (nccl-tests on 2xH200) apply to real-nccl sweeps only")
    sw = docs[-1].environment.get("software", {})
    devices = docs[-1].workload.get("devices") or []
    print(
        f"# torch {sw.get('torch')}  CUDA {sw.get('cuda')}  NCCL {sw.get('nccl')}  "
        f"devices {', '.join(devices) or '?'}"
    )
    # nccl-tests' figures per process layout, each compared on its own
    refs: dict[str, dict[tuple[str, bool], dict[int, tuple[float, float]]]] = {}
    for log in args.nccl_tests:
        op, graph, layout, rows = parse_nccl_tests(log)
        if op and rows:
            refs.setdefault(layout, {}).setdefault((op, graph), {}).update(rows)
    for layout, nt in refs.items() or [("", {})]:
        if layout:
            base = " ".join(layout.split()[:4])
            print(f"\n# ==== reference: nccl-tests {layout} ({LAYOUTS.get(base, '')})")
        _compare(docs, nt)


def _compare(docs: list[Document], nt: dict) -> None:
    """Every comparison against one set of nccl-tests figures (empty: the external ones)."""
    big = [  # the fp32 sweep (nccl-tests' default type), not a bf16 one
        d
        for d in docs
        if not d.workload["collectives"]["graph"]
        and d.workload["collectives"]["maxbytes"] >= BIG
        and d.workload["collectives"]["dtype"] == "float"
    ]
    print("\n## busbw at 64 MiB and above (target: within 3 % of nccl-tests)")
    print(f"{'op':<18} {'size':>12} {'parlab GB/s':>12} {'ref GB/s':>9} {'ratio':>6}  reference")
    for via in VIAS:
        of_path = [d for d in big if via_of(d) == via]
        if not of_path:
            if via != "torch":
                print(f"# via={via}: no sweep at 64 MiB and above")
            continue
        # the sweep of the most ops (the full one), the newest among equals
        doc = max(of_path, key=lambda d: (len(d.workload["collectives"]["ops"]), d.created))
        _big_rows(doc, nt)
    print("\n## small all_reduce, 8 B - 256 KiB: time per op (target: within 20 % of nccl-tests)")
    for graph in (False, True):
        for via in VIAS:
            cands = _small_sweeps(docs, graph, via)
            if not cands:
                if via == "torch" or not graph:
                    print(f"graph={int(graph)}  via={via}: no sweep")
                continue
            for doc in cands:  # every one, oldest first: the environments differ
                _small_row(doc, graph, nt)
    print("\n## c10d's cost per call: the torch path's time minus NCCL called directly")
    for graph in (False, True):
        _c10d_row(docs, graph)


def _big_rows(doc: Document, nt: dict) -> None:
    """One large-message sweep's rows against nccl-tests' busbw (printed)."""
    print(
        f"# parlab: {doc.run_id} (dtype {doc.workload['collectives']['dtype']}"
        + (f", via {via_of(doc)}" if via_of(doc) != "torch" else "")
        + ")"
    )
    for op in dict.fromkeys(r["op"] for r in doc.workload["measurements"]):
        for size, r in sorted(rows_of(doc, op).items()):
            if size < BIG:
                continue
            ref, src = None, "no reference"
            if (op, False) in nt and size in nt[(op, False)]:
                ref, src = nt[(op, False)][size][1], "nccl-tests log"
            elif (op, size) in EXTERNAL_BUSBW:
                ref, src = EXTERNAL_BUSBW[(op, size)], EXTERNAL
            ratio = f"{r['busbw'] / ref:6.3f}" if ref else "     -"
            mark = "" if not ref else ("  ok" if r["busbw"] >= 0.97 * ref else "  BELOW")
            ref_text = f"{ref / 1e9:9.1f}" if ref else f"{'-':>9}"
            print(f"{op:<18} {size:>12} {r['busbw'] / 1e9:12.1f} {ref_text} {ratio}  {src}{mark}")


def _c10d_row(docs: list[Document], graph: bool) -> None:
    """The newest torch-path and direct small all_reduce sweeps, size by size (printed)."""
    t, d = _small_sweeps(docs, graph, "torch"), _small_sweeps(docs, graph, "nccl")
    if not t or not d:
        print(f"graph={int(graph)}: needs a via=torch and a via=nccl sweep of the small sizes")
        return
    tr, dr = rows_of(t[-1], "all_reduce"), rows_of(d[-1], "all_reduce")
    sizes = sorted(s for s in tr.keys() & dr.keys() if s <= SMALL_MAX)
    if not sizes:
        print(f"graph={int(graph)}: {t[-1].run_id} and {d[-1].run_id} share no size")
        return
    diff = [(tr[s]["time_s"] - dr[s]["time_s"]) * 1e6 for s in sizes]
    t_us = statistics.fmean(tr[s]["time_s"] * 1e6 for s in sizes)
    d_us = statistics.fmean(dr[s]["time_s"] * 1e6 for s in sizes)
    print(
        f"graph={int(graph)}  torch {t[-1].run_id} mean {t_us:.2f} us - nccl {d[-1].run_id} "
        f"mean {d_us:.2f} us = {statistics.fmean(diff):.2f} us per call over {len(sizes)} "
        f"sizes (min {min(diff):.2f}, max {max(diff):.2f}; {100 * (t_us - d_us) / t_us:.0f}% "
        f"of the torch path's time)"
    )


def _small_row(doc: Document, graph: bool, nt: dict) -> None:
    """One small-message sweep against the nccl-tests reference (a printed row)."""
    small = {s: r for s, r in rows_of(doc, "all_reduce").items() if s <= SMALL_MAX}
    us = [r["time_s"] * 1e6 for r in small.values()]
    mean = statistics.fmean(us)
    if (("all_reduce", graph)) in nt:
        ref_rows = nt[("all_reduce", graph)]
        pairs = [(small[s]["time_s"] * 1e6, ref_rows[s][0]) for s in small if s in ref_rows]
        ratio = statistics.fmean(a / b for a, b in pairs) if pairs else float("nan")
        src = f"nccl-tests log ({len(pairs)} sizes)"
        ok = ratio <= 1.2
    else:
        lo, hi = EXTERNAL_SMALL_US[graph]
        ratio = mean / hi
        src = f"{EXTERNAL}: {lo}-{hi} us" if lo != hi else f"{EXTERNAL}: ~{hi} us"
        ok = mean <= 1.2 * hi
    med = statistics.median(r["time_median_s"] * 1e6 for r in small.values())
    print(
        f"graph={int(graph)}  via={via_of(doc)}  {doc.run_id}: mean {mean:.2f} us over {len(us)} sizes "
        f"(min {min(us):.2f}, max {max(us):.2f}; median of the per-size medians "
        f"{med:.2f}); vs {src}: ratio {ratio:.2f} {'ok' if ok else 'ABOVE'}"
        f"  [{fr_setting(doc)}]"
    )


if __name__ == "__main__":
    main()
