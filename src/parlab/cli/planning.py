"""``parlab plan``'s body: build the request from the options, search (or check one layout),
print the answers first, write the document."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from parlab import contract
from parlab.cli.common import console, print_json, reproduce_command, results_dir
from parlab.comm.calibration import load_calibration
from parlab.comm.explain import parse_layout
from parlab.errors import UsageError
from parlab.hardware.env import snapshot
from parlab.models import get_spec
from parlab.plan.admission import evaluate
from parlab.plan.compute import BuiltinCompute
from parlab.plan.cost import Budget
from parlab.plan.document import plan_document, write_plan
from parlab.plan.fit.calibrate import collectives_calibration, lab_roofline
from parlab.plan.fit.lab import LabCompute
from parlab.plan.fit.shape_probe import gemm_shape_calibration
from parlab.plan.planner import plan
from parlab.plan.request import PlanRequest, PlanResult, Verdict
from parlab.plan.space import Candidate, make_cluster, schedules_for
from parlab.plan.summary import Summary, summarize
from parlab.plan.throughput import assumed_throughput, measured_throughput

DEFAULT_TOKENS_PER_STEP = 4 * 1024**2
"""The default global batch in tokens (4 Mi, as Llama 2 and GPT-3 175B trained)."""


def _csv(text: str | None, cast: type = str) -> tuple:  # type: ignore[type-arg]
    if text is None:
        return ()
    try:
        return tuple(cast(x.strip()) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"cannot parse list {text!r}: write comma-separated values") from None


def _compute(o: dict[str, Any], spec: Any, cluster: Any, rests_on: list[str]) -> Any:
    """The compute model the options ask for: --mfu, --measured, --roofline, or the built-in."""
    peak = cluster.gpu.peak("bf16")
    if o["mfu"] is not None:
        return assumed_throughput(o["mfu"], peak, cluster.gpu.name)
    if o["measured"] is not None:
        mdoc = contract.read_document(o["measured"])
        rests_on.append(mdoc.run_id)
        return measured_throughput(mdoc, peak or 0.0)
    if o["roofline"] is not None:
        roof, fitted_on = lab_roofline(o["roofline"], calibration=cluster.calibration)
        rests_on.extend(fitted_on)
        shapes = gemm_shape_calibration(o["roofline"])
        if shapes is not None:
            rests_on.extend(shapes.run_id.split(" + "))
        return LabCompute(roofline_fit=roof, shapes=shapes)
    return BuiltinCompute(spec=spec, gpu=cluster.gpu)


def build_request(o: dict[str, Any], rests_on: list[str]) -> PlanRequest:
    """The plan request of the command's options."""
    if o["project"] is not None and o["project"] not in contract.PROJECTS:
        raise UsageError(
            f"unknown project {o['project']!r}: use one of {', '.join(contract.PROJECTS)}"
        )
    spec = get_spec(o["model"])
    env_doc = None
    if o["env"] is not None:
        env_doc = contract.read_document(o["env"])
        rests_on.append(env_doc.run_id)
    cal = None
    if o["calibration"] is not None:
        cal = load_calibration(o["calibration"])
    if cal is None and o["roofline"] is not None:
        cal = collectives_calibration(o["roofline"])
    if cal is not None:
        rests_on.append(cal.run_id)
    cluster = make_cluster(
        gpus=o["gpus"],
        gpus_per_node=o["gpus_per_node"],
        env_doc=env_doc if o["gpus"] is None else None,
        calibration=cal,
        inter_node_bw=o["inter_node_bw"] * 1e9 if o["inter_node_bw"] else None,
    )
    seq = o["seq"] or min(4096, spec.max_seq_len)
    global_batch = o["global_batch"] or max(1, DEFAULT_TOKENS_PER_STEP // seq)
    return PlanRequest(
        spec=spec,
        cluster=cluster,
        global_batch=global_batch,
        seq=seq,
        compute=_compute(o, spec, cluster, rests_on),
        micro_batches=_csv(o["micro_batch"], int),
        strategies=_csv(o["strategy"]),
        recompute=_csv(o["recompute"]),
        schedules=_csv(o["schedule"]),
        dtype=o["dtype"],
        optimizer=o["optimizer"],
        overlap=o["overlap"],
        memory_reserve=o["memory_reserve"],
        max_exposed_comm=o["max_exposed_comm"],
    )


def layout_candidates(req: PlanRequest, text: str, vpp: int | None) -> list[Candidate]:
    """Every candidate of one ``--layout`` over the knobs the options leave open."""
    topo = parse_layout(text)
    deg = {a: getattr(topo, a) for a in ("pp", "dp", "cp", "tp", "ep")}
    prod = deg["pp"] * deg["dp"] * deg["cp"] * deg["tp"]
    if prod != req.cluster.count:
        raise UsageError(
            f"--layout {text}: pp x dp x cp x tp = {prod}, not the {req.cluster.count} GPUs of "
            "--gpus: give degrees whose product is the GPU count"
        )

    out = []
    for sched, v in schedules_for(deg["pp"], req.spec.layers):
        if (sched != "-" and sched not in req.schedules) or (vpp is not None and v != vpp):
            continue
        for strategy in req.strategies:
            for mb in req.micro_batches:
                m = max(1, req.global_batch // (deg["dp"] * mb))
                for rc in req.recompute:
                    knobs = dict(strategy=strategy, micro_batch=mb, microbatches=m, recompute=rc)
                    out.append(Candidate(**deg, **knobs, schedule=sched, vpp=v))
    if not out:
        raise UsageError(f"--layout {text}: no schedule matches --schedule and --vpp {vpp}")
    return out


def run_plan(o: dict[str, Any]) -> None:
    """The whole command (see ``parlab plan --help``)."""
    rests_on: list[str] = []
    req = build_request(o, rests_on)
    budget = Budget(tokens=o["tokens"], gpu_hour_price=o["gpu_hour_price"])
    result = plan(req)
    summary = summarize(result, budget)
    checked = None
    if o["layout"] is not None:
        checked = _check_layout(req, result, o["layout"], o["vpp"])
    doc = plan_document(
        result,
        command=reproduce_command(),
        environment=snapshot(probe_links=False, light=True),
        project=o["project"],
        rests_on=rests_on,
        summary=summary,
        checked=checked,
    )
    path = write_plan(doc, result, results_dir(o["results"]))
    if o["as_json"]:
        print_json({"document": str(path), **doc.to_json()})
    else:
        print_plan(result, summary, path, o["top"], checked)
    if not result.ranked:
        raise typer.Exit(1)  # a valid answer (nothing fits), written, but no plan to run


def _check_layout(req: PlanRequest, result: PlanResult, text: str, vpp: int | None) -> Verdict:
    """The best verdict of one layout over its open knobs (admitted first, fastest first)."""
    verdicts = [evaluate(req, c) for c in layout_candidates(req, text, vpp)]
    admitted = [v for v in verdicts if v.admitted]
    if admitted:
        return max(admitted, key=lambda v: v.tokens_per_s_per_gpu or 0.0)
    timed = [v for v in verdicts if v.estimate is not None]
    return max(timed, key=lambda v: v.tokens_per_s_per_gpu or 0.0) if timed else verdicts[0]


def rank_of(result: PlanResult, v: Verdict) -> int | None:
    """Where ``v`` ranks among the admitted (1 = top), or None when it is not admitted."""
    if not v.admitted:
        return None
    faster = sum(
        (r.tokens_per_s_per_gpu or 0) > (v.tokens_per_s_per_gpu or 0) for r in result.ranked
    )
    return faster + 1


def print_plan(
    result: PlanResult, summary: Summary, path: Path, top: int, checked: Verdict | None
) -> None:
    req = result.request
    c = req.cluster
    band = summary.band
    console.rule(
        f"plan \\[analytic]: {req.spec.name} on {c.count} x {c.gpu.name} "
        f"({c.gpus_per_node} per node), global batch {req.global_batch} x {req.seq} tokens"
    )
    for line in summary.answers:
        console.print(escape(line))
    if checked is not None:
        _print_checked(result, checked, summary)
    fmt = band.fmt if band is not None else (lambda x: f"{x:,.3g}")
    t = Table(title=f"top {min(top, len(result.ranked))} of {len(result.ranked)} admitted")
    for col in ("#", "candidate", "step s", "compute", "exposed comm", "bubble", "tokens/s/GPU",
                "MFU %", "peak GiB", "headroom GiB"):  # fmt: skip
        t.add_column(col, overflow="fold")
    front = {id(v) for v in result.pareto}
    ties = {id(v) for v in summary.ties}
    for i, v in enumerate(result.ranked[:top], 1):
        e = v.estimate
        mark = ("*" if id(v) in front else "") + ("=" if id(v) in ties and i > 1 else "")
        t.add_row(
            f"{i}{mark}", v.cand.name, fmt(e.step_s), fmt(e.compute_s), fmt(e.comm_exposed_s),
            fmt(e.bubble_s), fmt(v.tokens_per_s_per_gpu), f"{100 * (v.mfu or 0):.0f}",
            f"{v.peak_bytes / 2**30:.0f}", f"{v.headroom_bytes / 2**30:.0f}",
        )  # fmt: skip
    console.print(t)
    console.print(
        "* on the Pareto front of throughput against peak memory; = a tie with the top choice "
        + (f"(inside its +/- {100 * band.rel:.0f} % band)" if band else "")
    )
    if len(summary.ties) > 1:
        console.print(f"[bold]Ties[/bold] ({len(summary.ties) - 1} inside the band), apart by:")
        for v in summary.ties[1:6]:
            console.print(escape(f"  {v.cand.name}: {summary.apart[v.cand.name]}"))
    _print_top(result)
    _print_rejected(result)
    console.print(escape(
        "Pareto front: " + "; ".join(
            f"{v.cand.name} ({fmt(v.tokens_per_s_per_gpu)} tok/s, {v.peak_bytes / 2**30:.0f} GiB)"
            for v in result.pareto[:6]
        )
    ))  # fmt: skip
    for n in result.notes:
        console.print(escape(f"- {n}"))
    if band is not None:
        console.print(escape(f"- error band: +/- {100 * band.rel:.0f} %, {band.measured_on}"))
    else:
        console.print("- error band: none measured for this kind of prediction yet")
    console.print(
        f"searched {len(result.ranked) + len(result.rejected)} candidates in "
        f"{result.elapsed_s:.2f} s; document: {path}"
    )


def _print_checked(result: PlanResult, v: Verdict, summary: Summary) -> None:
    band = summary.band
    fmt = band.fmt if band is not None else (lambda x: f"{x:,.3g}")
    rank = rank_of(result, v)
    if v.admitted:
        console.print(escape(
            f"Your layout: {v.cand.name} is admitted, rank {rank} of {len(result.ranked)}: "
            f"{fmt(v.tokens_per_s_per_gpu)} tokens/s per GPU, {100 * (v.mfu or 0):.0f} % MFU, "
            f"peak {v.peak_bytes / 2**30:.0f} GiB"
        ))  # fmt: skip
    else:
        speed = (
            f" (it would run at {fmt(v.tokens_per_s_per_gpu)} tokens/s per GPU)"
            if v.tokens_per_s_per_gpu
            else ""
        )
        console.print(
            escape(f"Your layout: {v.cand.name} is rejected [{v.kind}]: {v.reason}{speed}")
        )


def _print_top(result: PlanResult) -> None:
    best = result.top
    if best is None:
        console.print("[red]no candidate is admitted[/red]")
        return
    e = best.estimate
    console.print(f"[bold]Top choice: {escape(best.cand.name)}[/bold]")
    console.print(escape(
        f"  communication: {e.comm_blocking_s:.3g} s blocking + {e.comm_overlappable_s:.3g} s "
        "overlappable -> " + f"{e.comm_exposed_s:.3g} s exposed; largest: "
        + "; ".join(f"{d} {s:.3g} s" for d, s in e.top_items)
    ))  # fmt: skip
    console.print(
        f"  bubble {e.bubble_s:.3g} s (pp {best.cand.pp}, {best.cand.microbatches} micro-batches, "
        f"v {best.cand.vpp}; stage {e.stage} sets the pace)"
    )


def _print_rejected(result: PlanResult) -> None:
    console.print(f"rejected {len(result.rejected)}:")
    shown: dict[str, int] = {}
    for v in result.rejected:
        if shown.get(v.kind, 0) < 2:
            shown[v.kind] = shown.get(v.kind, 0) + 1
            console.print(escape(f"  [{v.kind}] {v.cand.name}: {v.reason}"))
    console.print(
        "  totals: " + ", ".join(f"{k} {n}" for k, n in sorted(result.rejected_by_kind().items()))
    )
