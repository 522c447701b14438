"""A plan as an ``analytic`` decision document, its candidate table (CSV) and Pareto plot (PNG).

The document (project by the top choice: MoE models -> PAR-MOE-EXPERT, a
top choice using tp, pp or cp -> PAR-MODEL-INTERNAL, else PAR-TRAINING-STATE;
task T6, role ``decision``, evidence ``analytic``) carries the top choice as
its ``layout`` and its predictions as ``metrics``; ``decision.rejected`` lists
the next admitted candidates (``slower``) and up to five examples of each
rejection kind; the full table of every candidate is the ``candidates``
artifact. Nothing crosses a wire.
"""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from pathlib import Path
from typing import Any

from parlab.contract import Decision, Document, Metric, new_run_id, now_iso, write_result
from parlab.plan.request import PlanResult, Verdict
from parlab.plan.summary import Summary
from parlab.plan.throughput import Throughput

EXAMPLES_PER_KIND = 5
GIB = 2**30
NEXT_ADMITTED = 9


def project_for(result: PlanResult) -> str:
    """The project a plan belongs to (see the module docstring)."""
    if result.request.spec.moe is not None:
        return "PAR-MOE-EXPERT"
    top = result.top
    if top is not None and (top.cand.tp > 1 or top.cand.pp > 1 or top.cand.cp > 1):
        return "PAR-MODEL-INTERNAL"
    return "PAR-TRAINING-STATE"


def candidates_csv(result: PlanResult) -> str:
    """Every candidate, admitted (ranked) then rejected, one row each."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(
        [
            "rank",
            "name",
            "admitted",
            "kind",
            "reason",
            "pp",
            "dp",
            "cp",
            "tp",
            "ep",
            "strategy",
            "micro_batch",
            "microbatches",
            "recompute",
            "schedule",
            "vpp",
            "peak_bytes",
            "step_s",
            "compute_s",
            "comm_exposed_s",
            "bubble_s",
            "tokens_per_s_per_gpu",
            "mfu",
        ]
    )
    rows: list[tuple[int | str, Verdict]] = [(i + 1, v) for i, v in enumerate(result.ranked)]
    rows += [("", v) for v in result.rejected]
    for rank, v in rows:
        c, e = v.cand, v.estimate
        w.writerow(
            [
                rank,
                c.name,
                v.admitted,
                v.kind,
                v.reason,
                c.pp,
                c.dp,
                c.cp,
                c.tp,
                c.ep,
                c.strategy,
                c.micro_batch,
                c.microbatches,
                c.recompute,
                c.schedule,
                c.vpp,
                "" if v.peak_bytes is None else int(v.peak_bytes),
                "" if e is None else f"{e.step_s:.6g}",
                "" if e is None else f"{e.compute_s:.6g}",
                "" if e is None else f"{e.comm_exposed_s:.6g}",
                "" if e is None else f"{e.bubble_s:.6g}",
                "" if v.tokens_per_s_per_gpu is None else f"{v.tokens_per_s_per_gpu:.6g}",
                "" if v.mfu is None else f"{v.mfu:.4f}",
            ]
        )
    return buf.getvalue()


def pareto_png(result: PlanResult, path: Path) -> Path:
    """Throughput against peak memory of every admitted candidate, the front highlighted."""
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    fig, ax = plt.subplots(figsize=(7.0, 4.0))
    xs = [v.peak_bytes / GIB for v in result.ranked if v.peak_bytes is not None]
    ys = [v.tokens_per_s_per_gpu for v in result.ranked]
    ax.scatter(xs, ys, s=8, color="#9ca3af", label=f"admitted ({len(xs)})")
    fx = [v.peak_bytes / GIB for v in result.pareto if v.peak_bytes is not None]
    fy = [v.tokens_per_s_per_gpu for v in result.pareto]
    ax.plot(fx, fy, "o-", color="#6b7280", ms=4, label=f"Pareto front ({len(fx)})")
    if result.top is not None and result.top.peak_bytes is not None:
        ax.scatter(
            [result.top.peak_bytes / GIB],
            [result.top.tokens_per_s_per_gpu],
            s=60,
            color="#b91c1c",
            zorder=3,
            label=f"top: {result.top.cand.name}",
        )
    usable = result.request.usable_memory / GIB
    ax.axvline(usable, ls="--", color="#b91c1c", lw=1)
    ax.set_xlabel("predicted peak memory per GPU (GiB)")
    ax.set_ylabel("predicted tokens/s per GPU")
    req = result.request
    ax.set_title(
        f"{req.spec.name} on {req.cluster.count} x {req.cluster.gpu.name}  [analytic]", fontsize=10
    )
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plan_document(
    result: PlanResult,
    *,
    command: str,
    environment: dict[str, Any],
    project: str | None = None,
    rests_on: list[str] | None = None,
    summary: Summary | None = None,
    checked: Verdict | None = None,
) -> Document:
    """The analytic decision document of a plan (not yet written); ``summary`` its answers,
    band and ties (``parlab.plan.summary``), ``checked`` the layout the user asked about."""
    req = result.request
    top = result.top
    reason, layout = _choice(result)
    return Document(
        run_id=new_run_id(f"plan-{req.spec.name}"),
        created=now_iso(),
        project=project or project_for(result),
        task="T6",
        role="decision",
        evidence_level="analytic",
        command=command,
        environment=environment,
        workload=_workload(result, summary, checked),
        layout=layout,
        metrics=_metrics(result, summary),
        decision=Decision(
            chosen=top.cand.name if top else None,
            rejected=_rejected(result),
            rests_on=list(rests_on or []),
            reason=reason,
        ),
        notes=_notes(result),
    )


def _metrics(result: PlanResult, summary: Summary | None) -> dict[str, Metric]:
    """The search's counts, the top choice's predictions and the training budget's cost."""
    top = result.top
    metrics: dict[str, Metric] = {
        "candidates_total": Metric(value=len(result.ranked) + len(result.rejected), unit="count"),
        "candidates_admitted": Metric(value=len(result.ranked), unit="count"),
        "pareto_size": Metric(value=len(result.pareto), unit="count"),
        "search_time": Metric(value=result.elapsed_s, unit="s"),
        "flops_per_token": Metric(value=result.flops_per_token, unit="FLOP"),
    }
    for kind, n in sorted(result.rejected_by_kind().items()):
        metrics[f"rejected.{kind}"] = Metric(value=n, unit="count")
    if top is not None:
        e = top.estimate
        assert e is not None
        metrics.update(
            {
                "step_time": Metric(value=e.step_s, unit="s"),
                "tokens_per_s_per_gpu": Metric(value=top.tokens_per_s_per_gpu, unit="tokens/s"),
                "mfu": Metric(value=top.mfu, unit="fraction"),
                "peak_memory": Metric(value=top.peak_bytes, unit="B"),
                "memory_headroom": Metric(value=top.headroom_bytes, unit="B"),
                "compute_time": Metric(value=e.compute_s, unit="s"),
                "comm_exposed_time": Metric(value=e.comm_exposed_s, unit="s"),
                "bubble_time": Metric(value=e.bubble_s, unit="s"),
            }
        )
    if summary is not None and summary.cost is not None:
        for k, v in summary.cost.to_json().items():
            if v is not None:
                unit = {"time_to_train_s": "s", "gpu_hours": "GPU-h", "cost": "currency",
                        "energy_kwh": "kWh"}[k]  # fmt: skip
                metrics[k] = Metric(value=v, unit=unit)
    return metrics


def _rejected(result: PlanResult) -> list[dict[str, str]]:
    """``decision.rejected``: the next admitted candidates (``slower``), then up to
    ``EXAMPLES_PER_KIND`` rejected candidates of each kind."""
    top = result.top
    rejected: list[dict[str, str]] = []
    if top is not None:
        for v in result.ranked[1 : 1 + NEXT_ADMITTED]:
            assert v.tokens_per_s_per_gpu is not None and top.tokens_per_s_per_gpu
            rel = v.tokens_per_s_per_gpu / top.tokens_per_s_per_gpu - 1
            rejected.append(
                {
                    "candidate": v.cand.name,
                    "kind": "slower",
                    "reason": f"predicted {v.tokens_per_s_per_gpu:,.0f} tokens/s per GPU "
                    f"({100 * rel:+.1f} %), peak {v.peak_bytes / GIB:.1f} GiB",  # type: ignore[operator]
                }
            )
    seen: dict[str, int] = {}
    for v in result.rejected:
        if seen.get(v.kind, 0) < EXAMPLES_PER_KIND:
            seen[v.kind] = seen.get(v.kind, 0) + 1
            rejected.append({"candidate": v.cand.name, "kind": v.kind, "reason": v.reason})
    return rejected


def _choice(result: PlanResult) -> tuple[str, dict[str, Any]]:
    """(the decision's reason, the document's layout): the top choice's, or none admitted."""
    req = result.request
    top = result.top
    world = req.cluster.count
    if top is None:
        reason = f"no candidate is admitted: all {len(result.rejected)} rejected"
        return reason, {"world_size": world, "strategy": None}
    reason = (
        f"highest predicted tokens/s per GPU of {len(result.ranked)} admitted candidates "
        f"({len(result.rejected)} rejected): {top.tokens_per_s_per_gpu:,.0f} tokens/s, "
        f"MFU {100 * (top.mfu or 0):.1f} %, peak {top.peak_bytes / GIB:.1f} GiB "  # type: ignore[operator]
        f"of {req.usable_memory / GIB:.1f} GiB"
    )
    layout = {
        "world_size": world,
        "mesh": top.cand.degrees,
        "strategy": top.cand.strategy,
        "knobs": top.cand.to_json(),
    }
    return reason, layout


def _workload(
    result: PlanResult, summary: Summary | None, checked: Verdict | None
) -> dict[str, Any]:
    """What was planned: the request, the space searched, the top and Pareto candidates."""
    req = result.request
    return {
        "kind": "plan",
        "model": req.spec.to_json(),
        "global_batch": req.global_batch,
        "seq": req.seq,
        "cluster": req.cluster.to_json(),
        "compute": _compute_json(result),
        "dtype": req.dtype,
        "optimizer": req.optimizer,
        "overlap": req.overlap,
        "memory_reserve": req.memory_reserve,
        "max_exposed_comm": req.max_exposed_comm,
        "space": {
            "micro_batches": list(req.micro_batches),
            "strategies": list(req.strategies),
            "recompute": list(req.recompute),
            "schedules": list(req.schedules),
        },
        "ranked_top": [v.to_json() for v in result.ranked[:10]],
        "pareto": [v.to_json() for v in result.pareto[:20]],
        "summary": None if summary is None else summary.to_json(),
        "checked_layout": None if checked is None else checked.to_json(),
    }


def _notes(result: PlanResult) -> list[str]:
    """The plan's assumptions, then how the search went and what the document lists."""
    counts = ", ".join(f"{k} {n}" for k, n in sorted(result.rejected_by_kind().items()))
    return [
        *result.notes,
        f"searched {len(result.ranked) + len(result.rejected)} candidates in "
        f"{result.elapsed_s:.2f} s ({result.ledger_calls} ledger calls); rejected: "
        f"{counts or 'none'}",
        f"decision.rejected lists the next {NEXT_ADMITTED} admitted candidates and up to "
        f"{EXAMPLES_PER_KIND} examples of each rejection kind; the candidates artifact has all",
    ]


def _compute_json(result: PlanResult) -> dict[str, Any]:
    """How the plan priced compute: one MFU, or a compute model and what it rests on."""
    c = result.request.compute
    if isinstance(c, Throughput):
        return {"kind": "mfu", "mfu": c.mfu, "peak_flops": c.peak_flops, "source": c.source,
                "assumed": c.assumed}  # fmt: skip
    line = result.notes[0] if result.notes else ""
    return {"kind": getattr(c, "kind", "built-in"), "describe": line}


def write_plan(doc: Document, result: PlanResult, results: Path) -> Path:
    """Write the candidate CSV and the Pareto PNG beside the document, then the document."""
    folder = Path(results) / doc.project / doc.run_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "candidates.csv").write_text(candidates_csv(result))
    artifacts = {"candidates": f"{doc.run_id}/candidates.csv"}
    if result.ranked:
        pareto_png(result, folder / "pareto.png")
        artifacts["pareto"] = f"{doc.run_id}/pareto.png"
    return write_result(replace(doc, artifacts=artifacts), results)
