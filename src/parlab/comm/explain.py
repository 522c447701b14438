"""The T1 table: for each strategy of a layout, its collectives, their payload, frequency and cost.

Analytic: no process group. The rows (collective, mesh axis, group size,
payload, calls per step, phase, sync point or overlapped) come from the
analytic core's wire table, ``parlab.ledger.traffic.traffic``: nothing here
re-derives a payload. Each row gets a predicted time per call and per step:

- from a calibration (``parlab.comm.calibration.load_calibration``): the
  fitted alpha-beta of that op, at the row's group size (other group sizes
  through the ring coefficients of ``parlab.comm.model``), labelled with the
  calibration's run id and evidence level;
- else from the catalog's intra-node link bandwidth of the GPU (this
  machine's, or ``--gpus``): a bandwidth-only lower bound (no latency term),
  labelled ``catalog-link``; every axis is assumed to sit on that link (one
  node);
- else unknown, never guessed.

The document: project PAR-COLLECTIVES, task T1, evidence ``analytic``;
``workload.wire_table`` holds the rows, ``predictions`` the time per step of
each row and in total, ``metrics`` the bytes per step (computed, not
measured).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from parlab.comm import model
from parlab.comm.calibration import Calibration, load_calibration
from parlab.contract import Document, Metric, Prediction, new_run_id, now_iso
from parlab.errors import UsageError
from parlab.hardware import catalog
from parlab.hardware import env as env_mod
from parlab.ledger.traffic import traffic
from parlab.models.catalog import get_spec
from parlab.topology import Topology
from parlab.units import format_bytes, format_seconds, parse_degrees

if TYPE_CHECKING:
    from parlab.ledger.traffic import WireItem

OP_OF = {
    "all-reduce": "all_reduce",
    "all-gather": "all_gather",
    "reduce-scatter": "reduce_scatter",
    "all-to-all": "all_to_all",
    "send-recv": "send_recv",
    "broadcast": "broadcast",
}
"""The wire table's collective names -> ``parlab.comm.ops`` names."""

LAYOUT_AXES = ("pp", "dp", "cp", "tp", "ep")


def parse_layout(text: str) -> Topology:
    """``dp=8,tp=2`` (axes pp, dp, cp, tp, ep) -> a ``Topology`` (``parlab.units.parse_degrees``)."""
    return Topology.from_degrees(**parse_degrees(text, LAYOUT_AXES, "--layout"))


def _catalog_link(gpu: str | None) -> tuple[model.Link | None, str]:
    if gpu is None:
        gpus = env_mod.snapshot(probe_links=False)["hardware"]["gpus"]
        if not gpus:
            return None, "no GPU here and no --gpus: time unknown"
        gpu = gpus[0]["name"]
    spec = catalog.lookup(gpu)
    if spec is None:
        return None, f"GPU {gpu!r} not in the catalog: time unknown"
    link = model.Link.from_bandwidth(spec.link_bw, None, f"catalog {spec.name} {spec.link}")
    return link, (
        f"catalog-link: {spec.name} {spec.link} {spec.link_bw / 1e9:.0f} GB/s per direction, "
        "bandwidth only (no latency term), every axis on that link"
    )


def predict_row(
    op: str, payload: int, n: int, cal: Calibration | None, link: model.Link | None
) -> tuple[float | None, str]:
    """Seconds for one call and the label of what predicted it."""
    if cal is not None:
        t = cal.predict(op, payload, n)
        if t is not None:
            return t, "calibration"
        if op == "all_to_all":  # the even and uneven sweeps fit the same op
            t = cal.predict("all_to_all_uneven", payload, n)
            if t is not None:
                return t, "calibration"
    if link is not None:
        return model.collective_time(op, payload, n, link), "catalog-link"
    return None, "unknown"


def explain_document(
    *,
    model_name: str,
    layout: str,
    strategy: str | None,
    micro_batch: int,
    seq: int | None,
    calibration: Path | None,
    command: str,
    gpu: str | None = None,
    microbatches: int = 1,
    sp: bool = False,
    shard_size: int | None = None,
    dtype: str = "bf16-mixed",
) -> Document:
    """The T1 table for ``model_name`` on ``layout`` (see the module docstring)."""
    spec = get_spec(model_name)
    topo = parse_layout(layout)
    strategy = strategy or "ddp"
    if micro_batch < 1:
        raise UsageError(f"--micro-batch {micro_batch} must be at least 1")
    if microbatches < 1:
        raise UsageError(f"--micro-batches {microbatches} must be at least 1")
    items = traffic(
        spec,
        topo,
        strategy,
        micro_batch=micro_batch,
        seq_len=seq,
        dtype=dtype,
        microbatches=microbatches,
        sp=sp,
        shard_size=shard_size,
    )
    cal = load_calibration(calibration) if calibration is not None else None
    rows, predictions, link_label = _predict_rows(items, cal, gpu)
    return Document(
        run_id=new_run_id("collectives-explain"),
        created=now_iso(),
        project="PAR-COLLECTIVES",
        task="T1",
        role="baseline",
        evidence_level="analytic",
        command=command,
        environment=env_mod.snapshot(probe_links=False),
        workload={
            "kind": "collectives-explain",
            "model": spec.name,
            "micro_batch": micro_batch,
            "seq_len": seq or spec.max_seq_len,
            "microbatches": microbatches,
            "dtype": dtype,
            "calibration": cal.run_id if cal else None,
            "wire_table": rows,
        },
        layout={
            **topo.to_json(),
            "strategy": strategy,
            "sequence_parallel": sp,
            "shard_size": shard_size,
        },
        metrics={
            "bytes_per_step": Metric(value=sum(r["total_bytes"] for r in rows), unit="B"),
            "collective_calls_per_step": Metric(
                value=sum(r["count_per_step"] for r in rows), unit="count"
            ),
        },
        predictions=predictions,
        notes=_notes(topo, rows, cal, link_label),
    )


def _predict_rows(
    items: list[WireItem], cal: Calibration | None, gpu: str | None
) -> tuple[list[dict[str, Any]], dict[str, Prediction], str]:
    """Each wire-table row with its predicted time per call and per step, the predictions
    (per row and in total), and the label of the catalog link used where the calibration is
    silent."""
    link, link_label = (None, "") if cal is not None else _catalog_link(gpu)
    rows: list[dict[str, Any]] = []
    predictions: dict[str, Prediction] = {}
    for it in items:
        op = OP_OF.get(it.collective)
        if op is None:
            raise AssertionError(f"wire table collective {it.collective!r} has no op")
        t, how = predict_row(op, it.payload_bytes, it.group_size, cal, link)
        if how == "unknown" and cal is not None:
            # the calibration lacks this op: fall back to the catalog link, labelled
            link, link_label = _catalog_link(gpu)
            t, how = predict_row(op, it.payload_bytes, it.group_size, None, link)
        row = {**it.to_json(), "op": op, "time_per_call_s": t, "predicted_by": how}
        row["time_per_step_s"] = None if t is None else t * it.count_per_step
        rows.append(row)
        key = f"{it.source}.{op}@{it.axis}.{it.phase}.{format_bytes(it.payload_bytes).replace(' ', '')}"
        predictions[key] = Prediction(
            value=row["time_per_step_s"], unit="s", model=_model_label(how, cal, link)
        )
    total = _sum(r["time_per_step_s"] for r in rows)
    blocking = _sum(r["time_per_step_s"] for r in rows if r["blocking"])
    label = _model_label(
        "calibration" if cal else ("catalog-link" if link else "unknown"), cal, link
    )
    predictions["comm_time_per_step"] = Prediction(value=total, unit="s", model=label)
    predictions["blocking_comm_time_per_step"] = Prediction(value=blocking, unit="s", model=label)
    return rows, predictions, link_label


def _notes(
    topo: Topology, rows: list[dict[str, Any]], cal: Calibration | None, link_label: str
) -> list[str]:
    notes = [
        "rows from parlab.ledger.traffic (the analytic wire table); payload as nccl-tests counts size",
        "time per step = calls per step x predicted time per call, summed without overlap; "
        "'blocking' rows are sync points on the critical path",
    ]
    if topo.pp > 1:
        notes.append("rows for a rank of pipeline stage 0 (the ledger's wire table per stage)")
    if cal is not None:
        notes.append(
            f"predicted from calibration {cal.run_id} ({cal.evidence_level}, fitted at n = "
            f"{cal.group_size} on {', '.join(sorted(set(cal.devices))) or cal.backend}); "
            "other group sizes through the ring coefficients"
        )
    if any(r["predicted_by"] == "catalog-link" for r in rows):
        notes.append(link_label)
    if any(r["predicted_by"] == "unknown" for r in rows):
        notes.append(f"some times unknown: {link_label or 'no calibration for that op'}")
    return notes


def _sum(values: Any) -> float | None:
    vals = list(values)
    return None if any(v is None for v in vals) else float(sum(vals))


def _model_label(how: str, cal: Calibration | None, link: model.Link | None) -> str:
    if how == "calibration" and cal is not None:
        return cal.label
    if how == "catalog-link" and link is not None:
        return f"alpha-beta:{link.source} (bandwidth only)"
    return "none"


def format_explain(doc: Document, console: Console) -> None:
    """Print the T1 table: one row per collective, grouped by strategy."""
    w = doc.workload
    lay = doc.layout
    mesh = ", ".join(f"{k}={v}" for k, v in lay["mesh"].items() if v > 1) or "single rank"
    t = Table(
        title=f"T1 {w['model']} on {mesh} ({lay['strategy']}, micro-batch {w['micro_batch']}, "
        f"seq {w['seq_len']}): what crosses the wire per step, per rank",
        title_justify="left",
    )
    for c in ("strategy", "collective", "axis", "n", "payload", "per step", "phase", "sync",
              "time/call", "time/step", "from"):  # fmt: skip
        t.add_column(c, justify="right" if c in ("n", "payload", "per step") else "left")
    for r in w["wire_table"]:
        t.add_row(
            r["source"],
            r["collective"],
            r["axis"],
            str(r["group_size"]),
            format_bytes(r["payload_bytes"]),
            str(r["count_per_step"]),
            r["phase"],
            "blocking" if r["blocking"] else "overlaps",
            "unknown" if r["time_per_call_s"] is None else format_seconds(r["time_per_call_s"]),
            "unknown" if r["time_per_step_s"] is None else format_seconds(r["time_per_step_s"]),
            r["predicted_by"],
        )
    console.print(t)
    if not w["wire_table"]:
        console.print("nothing crosses the wire: every axis has degree 1")
    p = doc.predictions
    tot, blk = p["comm_time_per_step"].value, p["blocking_comm_time_per_step"].value
    console.print(
        f"bytes per step {format_bytes(doc.metric('bytes_per_step') or 0)}; "
        f"comm time per step {'unknown' if tot is None else format_seconds(tot)} "
        f"(blocking {'unknown' if blk is None else format_seconds(blk)}), "
        f"model: {p['comm_time_per_step'].model}"
    )
    for note in doc.notes:
        console.print(f"note: {note}", markup=False)
