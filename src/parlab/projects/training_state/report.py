"""The training-state report's blocks, from contract documents alone: runs, state bytes, figures."""

from __future__ import annotations

import math
from typing import Any

from parlab.contract import Document
from parlab.dtypes import document_dtype
from parlab.projects.figure import figure, pyplot
from parlab.projects.training_state.config import MASTER_ITEMS, STATE_ITEMS
from parlab.report.blocks import Block, Bullets, Heading, Image, Para, Table
from parlab.report.format import fmt_error, fmt_value, prediction_error

TITLE = "Training state: DDP, ZeRO-1/2/3, FSDP"
FIGURES = {
    "memory": "training-state-memory",
    "throughput": "training-state-throughput",
    "predicted": "training-state-predicted-vs-measured",
}
"""Each figure's short name and its file stem."""
READING = [
    "State bytes: counted on every rank from the real tensors (each storage once) after "
    "the last step's update; the table shows the largest rank.",
    "Peak memory: the CUDA allocator's high-water mark on GPUs; tracked tensor bytes on "
    "CPU (gloo runs), where the ledger's peak is a rough guide only.",
    "Comm bytes/step: every collective the metered step issued (payload as nccl-tests "
    "counts it); comm time: those collectives replayed alone, one after another -- the "
    "cost if nothing overlapped, not the exposed time.",
    "Selective recompute here keeps matmul and attention outputs and recomputes the rest "
    "(torchtitan's op-level policy).",
    "Errors are the prediction's: (predicted - measured) / measured.",
]


def run_label(doc: Document) -> str:
    """``strategy[+knobs] preset``: what tells two runs of the set apart."""
    knobs = doc.layout.get("knobs", {})
    extra = ""
    if knobs.get("compile"):
        extra += "+compile"
    if knobs.get("recompute", "none") != "none":
        extra += f"+{knobs['recompute']}-recompute"
    if not knobs.get("reshard_after_forward", True) and "fsdp" in doc.layout["strategy"]:
        extra += "+no-reshard"
    if document_dtype(doc) == "bf16-params" and not doc.layout["strategy"].startswith("deepspeed"):
        extra += "+bf16-params"
    return f"{doc.layout['strategy']}{extra} {doc.workload.get('preset', '')}".strip()


def _predicted(d: Document, name: str) -> float | None:
    p = d.predictions.get(name)
    return None if p is None else p.value


def _cell(d: Document, name: str, unit: str) -> str:
    return fmt_value(d.metric(name), unit)


def _runs(docs: list[Document]) -> Table:
    rows = []
    for d in docs:
        if d.status != "ok":
            f = d.failure
            failed = f"failed ({f.kind if f else '?'}): {f.message if f else ''}"
            peak = fmt_value(_predicted(d, "peak_memory"), "B")
            rows.append((run_label(d), "failure", str(d.layout["world_size"]), failed, "", "",
                "", peak, "", "", "", "", d.run_id))  # fmt: skip
            continue
        err = prediction_error(_predicted(d, "peak_memory"), d.metric("peak_memory"))
        rows.append((run_label(d), d.role, str(d.layout["world_size"]),
            _cell(d, "tokens_per_s_per_gpu", "tokens/s"), _cell(d, "step_time", "s"),
            _cell(d, "mfu", "fraction"), _cell(d, "peak_memory", "B"),
            fmt_value(_predicted(d, "peak_memory"), "B"), fmt_error(err),
            _cell(d, "comm_bytes_per_step", "B"),
            fmt_value(_predicted(d, "comm_bytes_per_step"), "B"), _cell(d, "comm_time", "s"),
            d.run_id))  # fmt: skip
    head = ("run", "role", "ranks", "tokens/s/GPU", "step time", "MFU", "peak memory (max rank)",
        "ledger peak", "peak error", "comm bytes/step", "ledger comm", "comm time", "document")  # fmt: skip
    return Table(headers=head, rows=tuple(rows))


def _state(ok: list[Document]) -> Table:
    rows = []
    for d in ok:
        for item in STATE_ITEMS + MASTER_ITEMS:
            measured = d.metric(f"state_bytes.{item}")
            predicted = _predicted(d, f"state_bytes.{item}")
            if measured is None and predicted is None:  # the master items of a run that keeps none
                continue
            err = fmt_error(prediction_error(predicted, measured))
            rows.append(
                (run_label(d), item, fmt_value(measured, "B"), fmt_value(predicted, "B"), err)
            )
    return Table(headers=("strategy", "item", "measured", "predicted", "error"), rows=tuple(rows))


def _memory_figure(ok: list[Document], names: list[str], level: str | None) -> Image:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    bottom = [0.0] * len(ok)
    for item in STATE_ITEMS + MASTER_ITEMS:
        vals = [(d.metric(f"state_bytes.{item}") or 0) / 2**20 for d in ok]
        if not any(vals):
            continue
        ax.bar(names, vals, bottom=bottom, label=item)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    peaks = [(d.metric("peak_memory") or 0) / 2**20 for d in ok]
    ax.plot(names, peaks, "k_", markersize=30, label="peak (measured)")
    pp = [_predicted(d, "peak_memory") for d in ok]
    if any(p is not None for p in pp):
        ax.plot(names, [(p or math.nan) / 2**20 for p in pp], "rx", label="peak (ledger)")
    ax.set_ylabel("MiB per rank (max rank)")
    ax.tick_params(axis="x", rotation=30)
    ax.set_title("Per-rank memory by state item")
    ax.legend(fontsize=8)
    return figure(
        fig,
        key=FIGURES["memory"],
        title="memory",
        level=level,
        caption="state bytes per item (bars), measured and ledger peaks",
    )


def _throughput_figure(ok: list[Document], names: list[str], level: str | None) -> Image:
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    a1.bar(names, [d.metric("tokens_per_s_per_gpu") or 0 for d in ok])
    a1.set_ylabel("tokens/s per GPU")
    a1.set_title("Throughput")
    a2.bar(names, [(d.metric("comm_time") or 0) * 1e3 for d in ok])
    a2.set_ylabel("ms per step (replayed alone)")
    a2.set_title("Communication time")
    for a in (a1, a2):
        a.tick_params(axis="x", rotation=30)
    return figure(
        fig,
        key=FIGURES["throughput"],
        title="throughput",
        level=level,
        caption="tokens/s per GPU and the metered step's comm replayed alone",
    )


def _predicted_figure(ok: list[Document], level: str | None) -> Image:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 5))
    for d in ok:
        for name, mark in (("peak_memory", "o"), ("comm_bytes_per_step", "s")):
            p, mv = _predicted(d, name), d.metric(name)
            if p and mv:
                ax.scatter(p / 2**20, mv / 2**20, marker=mark)
                ax.annotate(f"{run_label(d)}:{name[:4]}", (p / 2**20, mv / 2**20), fontsize=7)
    lim = ax.get_xlim()
    ax.plot(lim, lim, "k--", lw=0.8)
    ax.set_xlabel("predicted (MiB)")
    ax.set_ylabel("measured (MiB)")
    ax.set_title("Predicted vs measured (o peak, s comm/step)")
    return figure(
        fig,
        key=FIGURES["predicted"],
        title="predicted",
        level=level,
        caption="the ledger's peak and comm bytes against the measured",
    )


def blocks(docs: list[Document]) -> list[Block]:
    """The report: every run, its state bytes against the ledger, three figures, how to read."""
    ok = [d for d in docs if d.status == "ok"]
    levels = sorted({d.evidence_level for d in docs})
    level = levels[0] if len(levels) == 1 else None
    out: list[Block] = [
        Heading(depth=1, text=TITLE),
        Para(
            parts=(
                f"Evidence level(s): {', '.join(levels)}. Each row is one contract document; "
                "predictions come from the ledger, measurements from the meters.",
            )
        ),
        _runs(ok + [d for d in docs if d.status != "ok"]),
        Heading(depth=2, text="Per-rank state bytes by item (rank 0 / max), measured vs ledger"),
        _state(ok),
    ]
    if ok:
        names = [run_label(d) for d in ok]
        out += [
            _memory_figure(ok, names, level),
            _throughput_figure(ok, names, level),
            _predicted_figure(ok, level),
        ]
    seen: set[str] = set()
    notes: list[str] = []
    for d in docs:
        for n in d.notes:
            if n.startswith(("no ", "comm not metered", "mfu unknown")) and n not in seen:
                seen.add(n)
                notes.append(f"{run_label(d)}: {n}")
    out += [
        Heading(depth=2, text="How to read it"),
        Bullets(items=tuple((n,) for n in READING + notes)),
    ]
    return out


def figure_paths(paths: dict[str, Any]) -> dict[str, Any]:
    """``write_markdown``'s paths by the figures' short names (and ``report``)."""
    return {short: paths[key] for short, key in FIGURES.items() if key in paths} | {
        "report": paths["report"]
    }
