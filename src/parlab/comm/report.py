"""Showing a sweep: the nccl-tests-style table and the busbw-vs-size plot.

Both read the sweep document alone (``workload.measurements``), so either
can be rebuilt from the results folder. The table is headed by the torch,
CUDA and NCCL versions and the devices, with nccl-tests' columns (size,
count, type, redop, root, time, algbw, busbw, #wrong) plus the median, min and
max of the timing samples. GB/s means 1e9 bytes/s, as nccl-tests prints it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parlab.comm import ops as O
from parlab.contract import Document

_HEAD = (
    f"# {'size':>12} {'count':>12} {'type':>9} {'redop':>6} {'root':>5} "
    f"{'time':>9} {'median':>9} {'min':>9} {'max':>9} {'algbw':>8} {'busbw':>8} {'#wrong':>7}\n"
    f"# {'(B)':>12} {'(elements)':>12} {'':>9} {'':>6} {'':>5} "
    f"{'(us)':>9} {'(us)':>9} {'(us)':>9} {'(us)':>9} {'(GB/s)':>8} {'(GB/s)':>8} {'':>7}"
)


def format_row(r: dict[str, Any]) -> str:
    """One measurement as a table line."""
    us = lambda s: f"{s * 1e6:9.2f}"  # noqa: E731
    wrong = "n/a" if r["wrong"] is None else str(r["wrong"])
    return (
        f"  {r['size']:>12} {r['count']:>12} {r['type']:>9} {r['redop']:>6} {r['root']:>5} "
        f"{us(r['time_s'])} {us(r['time_median_s'])} {us(r['time_min_s'])} {us(r['time_max_s'])} "
        f"{r['algbw'] / 1e9:8.2f} {r['busbw'] / 1e9:8.2f} {wrong:>7}"
    )


def header(doc: Document) -> str:
    """Versions, devices and options, as nccl-tests opens its output."""
    sw = doc.environment.get("software", {})
    c = doc.workload.get("collectives", {})
    devices = doc.workload.get("devices") or []
    lines = [
        f"# parlab collectives  torch {sw.get('torch')}  CUDA {sw.get('cuda') or '-'}  "
        f"NCCL {sw.get('nccl') or '-'}  backend {doc.layout.get('backend')}  "
        f"evidence {doc.evidence_level}",
        f"# minBytes {c.get('minbytes')} maxBytes {c.get('maxbytes')} step: {c.get('stepfactor')}"
        f"(factor) warmup iters: {c.get('warmup_iters')} iters: {c.get('iters')} "
        f"validation: 1 graph: {int(bool(c.get('graph')))} "
        f"{'in-place' if c.get('inplace') else 'out-of-place'}  timing: {c.get('timing')}",
        f"# world {doc.layout.get('world_size')}  mesh {doc.layout.get('mesh')}  "
        f"axis {doc.layout.get('axis') or '-'}  group size n = {doc.layout.get('group_size')}",
        "#",
        "# Using devices",
    ]
    if devices:
        lines += [f"#  Rank {i:2d} device {d}" for i, d in enumerate(devices)]
    else:
        lines.append("#  (not reported: the run did not finish)")
    return "\n".join(lines)


def format_table(doc: Document) -> str:
    """The whole printed report of a sweep document."""
    rows = doc.workload.get("measurements") or []
    n = doc.layout.get("group_size")
    out = [header(doc), "#"]
    ops = list(dict.fromkeys(r["op"] for r in rows))
    for op in ops:
        rs = [r for r in rows if r["op"] == op]
        if op == "barrier":
            r = rs[0]
            out.append(
                f"# barrier over {n} ranks: {r['time_s'] * 1e6:.2f} us mean "
                f"(median {r['time_median_s'] * 1e6:.2f}, min {r['time_min_s'] * 1e6:.2f}, "
                f"max {r['time_max_s'] * 1e6:.2f}; host-timed)"
            )
            continue
        spec = O.SPECS[op]
        place = "in place" if rs[0]["inplace"] else "out of place"
        out.append(
            f"# {op}, {place}  (nccl-tests {spec.nccl_tests}; size = {spec.size_meaning}; "
            f"busbw = algbw x {spec.factor} = x{O.busbw_factor(op, n):.3g})"
        )
        out.append(_HEAD)
        out += [format_row(r) for r in rs]
        avg = sum(r["busbw"] for r in rs) / len(rs)
        out.append(f"# Avg bus bandwidth    : {avg / 1e9:.3f} GB/s")
        out.append("#")
    wrong = doc.metric("wrong_total")
    out.append(
        f"# Out of bounds values : {'n/a' if wrong is None else int(wrong)} "
        f"{'OK' if wrong == 0 else 'FAILED' if wrong else ''}".rstrip()
    )
    peak = doc.metric("busbw_peak")
    link = doc.workload.get("link_bw")
    if peak is not None:
        pct = f" = {100 * peak / link:.1f}% of the {link / 1e9:.1f} GB/s link" if link else ""
        out.append(f"# Peak bus bandwidth   : {peak / 1e9:.3f} GB/s{pct}")
    for note in doc.notes:
        out.append(f"# note: {note}")
    return "\n".join(out)


def _size_label(v: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if v >= scale:
            return f"{v / scale:g} {unit}"
    return f"{v:g} B"


def plot_busbw(doc: Document, path: Path) -> Path:
    """busbw against size (log x), one line per op; the link peak as a dashed line."""
    import matplotlib  # lazy: matplotlib
    import matplotlib.ticker  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    rows = [r for r in doc.workload.get("measurements") or [] if r["op"] != "barrier"]
    fig, ax = plt.subplots(figsize=(8, 5))
    for op in dict.fromkeys(r["op"] for r in rows):
        rs = sorted((r for r in rows if r["op"] == op), key=lambda r: r["size"])
        ax.plot([r["size"] for r in rs], [r["busbw"] / 1e9 for r in rs], marker=".", label=op)
    link = doc.workload.get("link_bw")
    if link:
        ax.axhline(
            link / 1e9, linestyle="--", color="grey", label=f"link peak {link / 1e9:.0f} GB/s"
        )
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=4))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: _size_label(v)))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    devices = doc.workload.get("devices") or []
    dev = devices[0] if devices else doc.layout.get("backend")
    c = doc.workload.get("collectives", {})
    ax.set_title(
        f"busbw vs size: {doc.layout.get('group_size')} x {dev}, {c.get('dtype')}, "
        f"{doc.evidence_level}{', CUDA graph' if c.get('graph') else ''}",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
