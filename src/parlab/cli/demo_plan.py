"""``parlab demo``'s last steps: plan and decide over what the demo ran, then the report.

``plan_decide_step`` plans the workload the lab's GPU evidence trains (the
1.3B model, sequence 4096, micro-batch 2 on each of 2 GPUs: global batch 4;
``scripts/gpu/training.sh``) for the lab's GPU machine (2 x H200, one node)
with the planner's built-in compute model (as ``parlab plan`` prices it) -- an
``analytic`` decision document a GPU run can be checked against -- then runs ``decide`` on every project the demo wrote two
or more runs for (the demo's own CPU runs: ``cpu-mechanism`` decisions). ``report_step`` renders the whole results
folder and prints where the report is. Nothing crosses a wire here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parlab.contract import read_results
from parlab.hardware.env import snapshot
from parlab.models import get_spec
from parlab.plan.compute import BuiltinCompute
from parlab.plan.decide import decide, eligible_projects
from parlab.plan.document import plan_document, write_plan
from parlab.plan.planner import plan
from parlab.plan.request import PlanRequest
from parlab.plan.space import make_cluster
from parlab.report import build_report

DEMO_CLUSTER = "2xH200"
"""The lab's GPU machine: the cluster the demo plans for."""


DEMO_WORKLOAD = ("1.3b", 4, 4096)
"""(model, global batch, sequence) of the GPU training evidence."""


def plan_decide_step(results: Path, console: Any) -> None:
    """Plan the demo's workload on 2 x H200, then decide each project with runs to compare."""
    model, gb, seq = DEMO_WORKLOAD
    cluster = make_cluster(gpus=DEMO_CLUSTER, gpus_per_node=2)
    spec = get_spec(model)
    req = PlanRequest(
        spec=spec,
        cluster=cluster,
        global_batch=gb,
        seq=seq,
        compute=BuiltinCompute(spec=spec, gpu=cluster.gpu),
    )
    result = plan(req)
    command = (
        f"parlab plan --model {model} --gpus {DEMO_CLUSTER} --gpus-per-node 2 "
        f"--global-batch {gb} --seq {seq} --results {results}"
    )
    doc = plan_document(result, command=command, environment=snapshot(probe_links=False))
    path = write_plan(doc, result, results)
    top = result.top
    console.print(
        f"plan \\[analytic] {model} on {DEMO_CLUSTER}: {len(result.ranked)} admitted, "
        f"{len(result.rejected)} rejected in {result.elapsed_s:.2f} s; top: "
        + (
            f"{top.cand.name} ({top.tokens_per_s_per_gpu:,.0f} tokens/s per GPU predicted)"
            if top
            else "none"
        )
    )
    console.print(f"wrote {path}")
    entries, _ = read_results(results)
    for project in eligible_projects(entries):
        try:
            out = decide(
                results, project=project, command=f"parlab decide {results} --project {project}"
            )
        except ValueError as exc:  # nothing comparable to decide on: say so, go on
            console.print(f"decide {project}: nothing to decide ({exc})")
            continue
        dec = out.doc.decision
        assert dec is not None
        console.print(
            f"decide {project} \\[{out.doc.evidence_level}]: chosen {dec.chosen or 'none'}; "
            f"{len(dec.rejected)} rejected; {len(out.incomparable)} incomparable"
        )


def report_step(results: Path, console: Any) -> None:
    """Render the results folder; print the report's paths."""
    out = build_report(results)
    console.print(
        f"report of {out.documents} document(s), {out.figures} figure(s): {out.html} "
        f"(Markdown: {out.markdown})"
    )
