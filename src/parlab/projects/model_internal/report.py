"""The model-internal report's blocks, from the documents: runs, per-axis communication,
the pipeline bubble and schedule grids, losses against one rank, CP memory, layouts."""

from __future__ import annotations

from parlab.contract import Document
from parlab.layout import describe, shape_of
from parlab.models import get_spec
from parlab.parallel.pipeline_schedules import SCHEDULES, build, format_grid, formula
from parlab.projects.model_internal.config import RunConfig
from parlab.report.blocks import Block, Bullets, Heading, Para, Table
from parlab.report.format import fmt_value

TITLE = "PAR-MODEL-INTERNAL: tensor, sequence, pipeline and context parallelism"


def _cell(d: Document, name: str) -> str:
    m = d.metrics.get(name)
    return fmt_value(m.value, m.unit) if m else "-"


def _pred(d: Document, name: str) -> str:
    p = d.predictions.get(name)
    return fmt_value(p.value, p.unit) if p else "-"


def _intro(docs: list[Document]) -> list[Block]:
    levels = sorted({d.evidence_level for d in docs})
    env = docs[0].environment if docs else {}
    gpus = (env.get("hardware") or {}).get("gpus") or []
    devices = f"{len(gpus)} x {gpus[0]['name']}" if gpus else "CPU (gloo ranks)"
    torch_version = (env.get("software") or {}).get("torch", "?")
    return [
        Heading(depth=1, text=TITLE),
        Para(parts=(f"Evidence: {', '.join(levels)}. Devices: {devices}; torch {torch_version}.",)),
        Para(
            parts=(
                "Every run trains the reference model on the same seeded synthetic global "
                "batch; each candidate is compared with one rank running the same global batch "
                "(scaling efficiency = t1 / (n x tn)). Predictions are the ledger's and the "
                "bubble formula's, made before the run.",
            )
        ),
    ]


def _runs(docs: list[Document]) -> list[Block]:
    rows = []
    for d in docs:
        lay = d.layout
        mesh = " x ".join(f"{a}{lay['mesh'][a]}" for a in ("pp", "cp", "tp") if lay["mesh"][a] > 1)
        if lay.get("implementation") == "torch":
            mesh += " (torch)"
        status = "ok" if d.failure is None else f"failed ({d.failure.kind})"
        rows.append((lay["strategy"], d.role, mesh or "1 rank",
            f"{d.workload['global_batch']}x{d.workload['seq']}", status, _cell(d, "step_time"),
            _cell(d, "tokens_per_s_per_gpu"), _cell(d, "mfu"), _cell(d, "scaling_efficiency"),
            _cell(d, "peak_memory"), f"{_cell(d, 'param_bytes')} / {_pred(d, 'param_bytes')}",
            f"{_cell(d, 'activation_bytes')} / {_pred(d, 'activation_bytes')}"))  # fmt: skip
    head = ("run", "role", "mesh", "batch x seq", "status", "step time", "tokens/s/GPU", "MFU",
        "scaling eff.", "peak mem", "params (measured / ledger)",
        "activations (measured / ledger)")  # fmt: skip
    return [Heading(depth=2, text="Runs"), Table(headers=head, rows=tuple(rows))]


def _comm(docs: list[Document]) -> list[Block]:
    rows = []
    for d in docs:
        for axis in ("tp", "cp", "pp"):
            if f"comm_bytes_per_step.{axis}" not in d.metrics:
                continue
            ops = ", ".join(
                f"{k.split('.', 1)[1]} {fmt_value(m.value, 'B')}"
                for k, m in d.metrics.items()
                if k.startswith(f"comm_op_bytes.{axis}.")
            )
            rows.append((d.layout["strategy"], axis, _cell(d, f"comm_count_per_step.{axis}"),
                _cell(d, f"comm_bytes_per_step.{axis}"), _pred(d, f"comm_bytes_per_step.{axis}"),
                _cell(d, f"comm_time.{axis}"), ops))  # fmt: skip
    head = ("run", "axis", "calls", "bytes", "ledger bytes", "time (replayed alone)", "by op")
    return [
        Heading(depth=2, text="Communication per axis (metered step, per rank, max over ranks)"),
        Table(headers=head, rows=tuple(rows)),
    ]


def _bubble(docs: list[Document]) -> list[Block]:
    pp_docs = [d for d in docs if d.layout["mesh"]["pp"] > 1]
    if not pp_docs:
        return []
    rows, grids = [], []
    for d in pp_docs:
        p, m = d.layout["mesh"]["pp"], d.workload["microbatches"]
        sched, vpp = d.layout["pp_schedule"], d.layout.get("vpp", 1)
        known = sched in SCHEDULES  # torch's own schedule: no parlab formula, no grid
        f = formula(sched, p, m, vpp) if known else None
        rows.append((d.layout["strategy"], f"p={p}, m={m}", _cell(d, "pp_bubble"),
            _cell(d, "pp_idle_mean"), "-" if f is None else fmt_value(f["of_step"], "fraction")))  # fmt: skip
        if known:
            grids += [
                Heading(depth=3, text=f"{sched} schedule, p={p}, m={m} (step x rank)"),
                Para(parts=(format_grid(build(sched, p, m, vpp)),), code=True),
            ]
    head = ("run", "p, m", "bubble (busiest stage)", "idle, mean of stages", "(p-1)/(v*m+p-1)")
    return [Heading(depth=2, text="Pipeline bubble"), Table(headers=head, rows=tuple(rows)), *grids]


def _losses(docs: list[Document]) -> list[Block]:
    singles = {
        (d.workload["global_batch"], d.workload["seq"]): d
        for d in docs
        if d.role != "candidate" and d.failure is None
    }
    rows = []
    for d in docs:
        if d.role != "candidate" or d.failure is not None:
            continue
        one = singles.get((d.workload["global_batch"], d.workload["seq"]))
        mine, ref = d.workload.get("losses") or [], (one.workload.get("losses") if one else [])
        pairs = [(a, b) for a, b in zip(mine, ref or [], strict=False) if a is not None and b]
        diff = max((abs(a - b) for a, b in pairs), default=None)
        torch_impl = " (torch)" if d.layout.get("implementation") == "torch" else ""
        rows.append(
            (
                d.layout["strategy"] + torch_impl,
                " ".join(f"{x:.4f}" for x in mine if x is not None),
                " ".join(f"{x:.4f}" for x in (ref or []) if x is not None),
                "-" if diff is None else f"{diff:.2e}",
            )
        )
    return [
        Heading(depth=2, text="Same model, same numbers: losses against the one-rank run"),
        Para(
            parts=(
                "Every step's loss of each run beside the one-rank run of the same global "
                "batch (same seed, same data, AdamW): parlab's layouts and torch's own "
                "implementations must all train the same model.",
            )
        ),
        Table(headers=("run", "losses", "one-rank losses", "max abs difference"), rows=tuple(rows)),
    ]


def _cp_memory(docs: list[Document], pairs: list[tuple[RunConfig, RunConfig]]) -> list[Block]:
    by = {d.layout["strategy"]: d for d in docs}
    cp_pairs = [(b, c) for b, c in pairs if c.cp > 1 and c.name in by]
    if not cp_pairs:
        return []
    rows = []
    for b, c in cp_pairs:
        one = by.get(b.name)
        if one is None:  # shared with another pair of the same workload
            one = next(
                (d for d in docs if d.role != "candidate" and d.workload["seq"] == c.seq), None
            )
        one_peak = "-"
        if one is not None:
            one_peak = (
                _cell(one, "peak_memory") if one.failure is None else f"failed ({one.failure.kind})"
            )
        d = by[c.name]
        rows.append((c.name, str(c.seq), one_peak, _cell(d, "peak_memory"),
            _cell(d, "memory_saved_vs_single"), _pred(d, "peak_memory")))  # fmt: skip
    head = ("run", "seq", "1 rank peak", "CP2 peak per rank", "saved per rank", "ledger CP2 peak")
    return [
        Heading(depth=2, text="Context parallel: memory per rank"),
        Table(headers=head, rows=tuple(rows)),
    ]


def _layouts(docs: list[Document], pairs: list[tuple[RunConfig, RunConfig]]) -> list[Block]:
    ran = {d.layout["strategy"] for d in docs}
    out: list[Block] = [Heading(depth=2, text="Layouts")]
    for _, cand in pairs:
        if cand.name not in ran:
            continue
        lay = describe(
            world=cand.nproc,
            degrees={"tp": cand.tp, "pp": cand.pp, "cp": cand.cp},
            shape=shape_of(get_spec(cand.model)),
            seq=cand.seq,
            sequence_parallel=cand.sp,
            vpp=cand.vpp,
        )
        rows = tuple(
            (
                str(h["rank"]),
                " ".join(f"{a}{h['coords'][a]}" for a in ("pp", "cp", "tp")),
                ",".join(f"{a}-{b}" for a, b in h["layers"]),
                "{}-{}".format(*h["heads"]),
                "{}-{}".format(*h["kv_heads"]),
                "{}-{}".format(*h["ffn_columns"]),
                "{}-{}".format(*h["vocab_rows"]),
                ",".join(map(str, h.get("seq_chunks", []))) or "all",
            )
            for h in lay["holdings"]
        )
        bad = [r for r in lay["constraints"] if not r["ok"]]
        head = ("rank", "coords", "layers", "heads", "KV heads", "FFN cols", "vocab rows", "chunks")
        out += [
            Heading(depth=3, text=cand.name),
            Table(headers=head, rows=rows),
            Para(parts=(f"constraints: {len(lay['constraints'])} rows, {len(bad)} failing",)),
        ]
    return out


def blocks(docs: list[Document], pairs: list[tuple[RunConfig, RunConfig]]) -> list[Block]:
    """The whole report, in reading order; ``pairs``: the set's (baseline, candidate) pairs."""
    notes = [f"{d.layout['strategy']}: {n}" for d in docs for n in d.notes]
    return [
        *_intro(docs),
        *_runs(docs),
        *_comm(docs),
        *_bubble(docs),
        *_losses(docs),
        *_cp_memory(docs, pairs),
        *_layouts(docs, pairs),
        Heading(depth=2, text="Notes"),
        Bullets(items=tuple((n,) for n in notes)),
    ]
