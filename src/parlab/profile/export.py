"""What a person opens: the merged multi-rank trace and the timeline PNG of one step.

Merged trace: one gzipped Chrome trace, a process per rank (pid = rank,
named ``rank R``) and a thread per GPU stream or CPU thread, timestamps on
the shared clock; it opens in Perfetto (ui.perfetto.dev) and chrome://tracing.
It is written as concatenated gzip members -- a header, each rank's fragment
(written by the analysis pass, so no trace is read twice), a footer -- which
gzip readers decompress as one stream. Only the events that matter for the
timeline are kept (GPU kernels and copies, step marks and communication ops;
every CPU op on CPU runs), with their arguments trimmed.

Timeline PNG: one step, two lanes per rank (compute, communication; and
copies where there are any), and a line over each rank for its step window.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

from parlab.profile.profiles import RankProfile, RunProfile


def write_merged_trace(run: RunProfile, fragments_dir: Path, out: Path) -> Path:
    """Concatenate the ranks' fragments into one gzipped Chrome trace at ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    header: list[dict[str, Any]] = []
    for r in run.ranks:
        header.append(
            {"ph": "M", "name": "process_name", "pid": r.rank, "args": {"name": f"rank {r.rank}"}}
        )
        header.append(
            {"ph": "M", "name": "process_sort_index", "pid": r.rank, "args": {"sort_index": r.rank}}
        )
    head = (
        '{"displayTimeUnit": "ms", "otherData": '
        + json.dumps({"source": "parlab profile", "run_id": run.run_id, "folder": run.folder})
        + ', "traceEvents": [\n'
        + ",\n".join(json.dumps(h) for h in header)
    )
    with open(tmp, "wb") as f:
        f.write(gzip.compress(head.encode(), compresslevel=6))
        for r in run.ranks:
            frag = fragments_dir / f"rank{r.rank}.frag.gz"
            if frag.exists():
                with open(frag, "rb") as src:
                    shutil.copyfileobj(src, f, 1 << 20)
        f.write(gzip.compress(b"\n]}\n"))
    tmp.replace(out)
    return out


def pick_step(run: RunProfile) -> int | None:
    """The step to draw: the one whose mean window is the median (a typical step)."""
    windows: dict[int, list[float]] = {}
    for r in run.ranks:
        for s in r.steps:
            windows.setdefault(s.step, []).append(s.window_s)
    if not windows:
        return None
    ordered = sorted(windows, key=lambda k: (sum(windows[k]) / len(windows[k]), k))
    return ordered[len(ordered) // 2]


def write_timeline_png(
    run: RunProfile, out: Path, *, step: int | None = None, title: str = ""
) -> Path | None:
    """Draw one step's compute and communication lanes per rank; ``None`` when no step has spans."""
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    step = pick_step(run) if step is None else step
    if step is None:
        return None
    rows: list[tuple[RankProfile, dict[str, list[list[float]]]]] = [
        (r, r.lanes[step]) for r in run.ranks if step in r.lanes
    ]
    if not rows:
        return None
    t0 = min(lanes["window"][0][0] for _, lanes in rows)
    colors = {"compute": "#4C72B0", "comm": "#DD8452", "memory": "#55A868"}
    has_mem = any(lanes["memory"] for _, lanes in rows)
    lane_names = ["compute", "comm"] + (["memory"] if has_mem else [])
    fig_h = 1.0 + 0.45 * len(rows) * len(lane_names)
    fig, ax = plt.subplots(figsize=(12, fig_h))
    yticks, ylabels = [], []
    y = 0.0
    for r, lanes in reversed(rows):
        for lane in reversed(lane_names):
            spans = [((s - t0) / 1e3, (e - s) / 1e3) for s, e in lanes[lane]]
            ax.broken_barh(spans, (y, 0.8), facecolors=colors[lane], linewidth=0)
            yticks.append(y + 0.4)
            ylabels.append(f"rank {r.rank} {lane}")
            y += 1.0
        w0, w1 = lanes["window"][0]
        ax.plot([(w0 - t0) / 1e3, (w1 - t0) / 1e3], [y - 0.05, y - 0.05], color="grey", lw=0.8)
        y += 0.4
    ax.set_yticks(yticks)
    ax.set_yticklabels(ylabels)
    ax.set_xlabel("time in step (ms)")
    device = run.ranks[0].device
    ax.set_title(title or f"step {step}: compute and communication per rank ({device})")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write_sweep_png(
    out: Path,
    *,
    labels: list[str],
    series: dict[str, list[float | None]],
    title: str,
    ylabel: str,
    xlabel: str,
) -> Path:
    """A bar chart of one figure per configuration of a preset sweep (e.g. exposed comm per bucket size)."""
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib
    import numpy as np  # lazy: numpy

    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(labels) + 2), 4))
    x = np.arange(len(labels))
    width = 0.8 / max(1, len(series))
    for i, (name, vals) in enumerate(series.items()):
        ys = [float("nan") if v is None else v for v in vals]
        ax.bar(x + (i - (len(series) - 1) / 2) * width, ys, width, label=name)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=15)
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
