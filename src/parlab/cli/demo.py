"""``parlab demo``: the whole lab at CPU size, on the embedded default.

Each step of the lab is one ``DemoStep`` below, in T0-T6 order; the demo runs them in turn
against one results folder and ends with the asset table (and, once the report exists, the
report). With no GPU every distributed step runs on gloo CPU ranks. A step that fails is
reported and the demo goes on, exiting non-zero at the end. ``--only NAME`` runs the named
steps; a name that is no step's is refused before anything runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from parlab.cli.demo_plan import plan_decide_step, report_step
from parlab.cli.fit import demo_step as fit_step
from parlab.cli.profile import demo_step as profile_step
from parlab.comm import ops
from parlab.comm.calibration import calibration_document
from parlab.comm.explain import explain_document, format_explain
from parlab.comm.sweep import SweepSpec, run_sweep, write_sweep
from parlab.contract import write_document
from parlab.doctor.render import demo_step as doctor_step
from parlab.errors import UsageError
from parlab.hardware.precheck import run_precheck
from parlab.projects import model_internal, moe, training_state
from parlab.projects.serving import demo_step as serving_step
from parlab.report.format import fmt_metric


@dataclass(frozen=True, kw_only=True)
class DemoStep:
    """One step of the demo."""

    name: str
    """Short label shown while it runs (what ``--only`` takes)."""
    task: str
    """The T0-T6 step it illustrates."""
    run: Callable[[Path, Console], None]
    """``run(results, console)`` writes its documents under the results folder and raises if
    the step failed."""


def env_step(results: Path, console: Console) -> None:
    """T1: ``parlab env``, the environment precheck."""
    doc = run_precheck(command=f"parlab env --results {results}")
    write_document(doc, results)
    if doc.status != "ok":
        raise RuntimeError(f"precheck failed: {doc.failure.message if doc.failure else '?'}")


def collectives_step(results: Path, console: Console) -> None:
    """T1: a CPU-sized sweep, its alpha-beta fit and the T1 table.

    Every op from 8 B to 1 MiB (x4 steps) on 2 ranks (gloo on CPU, NCCL where there are GPUs),
    checked and timed; the fit of that sweep as a calibration; and the T1 table of the
    ``tiny`` model on dp=2 from that calibration. Three documents and one plot, in well under
    a minute on 2 cores."""
    args = "-b 8 -e 1MiB -f 4 -w 2 -n 10 --nproc 2"
    spec = SweepSpec(
        ops=tuple(ops.OPS), minbytes=8, maxbytes=1 << 20, stepfactor=4, warmup=2, iters=10, nproc=2
    )
    outcome = run_sweep(spec, command=f"parlab collectives {args} --results {results}")
    doc = outcome.doc
    path = write_sweep(doc, results)
    console.print(f"sweep: {len(outcome.records)} measurements, {path}")
    if doc.status != "ok" or outcome.interrupted:
        raise RuntimeError(f"sweep failed: {doc.failure.message if doc.failure else 'interrupted'}")
    if doc.metric("wrong_total"):
        raise RuntimeError(f"sweep found {doc.metric('wrong_total')} wrong values")
    peak = doc.metric("busbw_peak") or 0.0
    console.print(f"busbw peak {peak / 1e9:.3f} GB/s ({doc.evidence_level}), 0 wrong values")
    cal = calibration_document(doc, command=f"parlab collectives --fit {path} --results {results}")
    cal_path = write_document(cal, results)
    t1 = explain_document(
        model_name="tiny",
        layout="dp=2",
        strategy="ddp",
        micro_batch=1,
        seq=None,
        calibration=cal_path,
        command=f"parlab collectives --explain tiny --layout dp=2 --calibration {cal_path}",
    )
    write_document(t1, results)
    format_explain(t1, console)


def training_state_step(results: Path, console: Console) -> None:
    """T2: the CPU-sized comparison set (DDP, ZeRO-1/2/3, FSDP on 2 gloo ranks)."""
    paths = training_state.run_project(
        results,
        model="tiny",
        nproc=2,
        steps=2,
        seq=32,
        only=("ddp", "zero1", "zero2", "zero3", "fsdp"),
        console=console,
    )
    console.print(f"report: {paths['report']}")


def model_internal_step(results: Path, console: Console) -> None:
    """T3: TP2+SP, PP2 1F1B and CP2 on the tiny model, 2 gloo ranks."""
    paths = model_internal.run_project(
        results, console=console, preset="cpu", only=["tp2-sp", "pp2-1f1b", "cp2-ring"]
    )
    console.print(f"report: {paths['report']}")


def moe_step(results: Path, console: Console) -> None:
    """T4: a CPU-sized MoE run (2 ranks, 8 experts, top-2, uniform and Zipf 1.2)."""
    args = "--ep 2 --experts 8 --topk 2 --capacity-factor 1.25 --skew zipf:1.2 --hidden 64 "
    args += "--ffn-hidden 128 --tokens 256 --train-steps 4 --warmup 1 --iters 3"
    cfg = moe.MoERunConfig(
        ep=2, experts=8, topk=2, capacity_factor=1.25, skews=(1.2,), hidden=64, ffn_hidden=128,
        tokens=256, train_steps=4, warmup=1, iters=3,
    )  # fmt: skip
    out = moe.run_moe_project(
        cfg, results=results, command=f"parlab project moe {args} --results {results}"
    )
    if not out.ok:
        f = out.documents[0].failure
        raise RuntimeError(f"moe run failed: {f.message if f else '?'}")
    for d in out.documents[:2]:
        m = d.metrics
        console.print(
            f"{d.workload['name']}: overflow {fmt_metric(m['overflow_rate'])}, expert load "
            f"max/mean {fmt_metric(m['expert_load_max_over_mean'])}, slowest rank "
            f"{fmt_metric(m['slowest_rank'])} (+{fmt_metric(m['slowest_rank_excess'])}), "
            f"dispatch {fmt_metric(m['dispatch_time'])}"
        )
    console.print(f"report: {out.report}")


# One line per step, in T0-T6 order.
STEPS: list[DemoStep] = [
    DemoStep(name="fit", task="T0", run=fit_step),
    DemoStep(name="environment precheck", task="T1", run=env_step),
    DemoStep(name="collectives sweep", task="T1", run=collectives_step),
    DemoStep(name="training state", task="T2", run=training_state_step),
    DemoStep(name="model internals", task="T3", run=model_internal_step),
    DemoStep(name="moe expert parallel", task="T4", run=moe_step),
    DemoStep(name="serving", task="T4", run=serving_step),
    DemoStep(name="profile ddp buckets", task="T5", run=profile_step),
    DemoStep(name="plan and decide", task="T6", run=plan_decide_step),
    DemoStep(name="doctor", task="T6", run=doctor_step),
    DemoStep(name="report", task="T6", run=report_step),
]


def run_demo(results: Path, console: Console, *, only: list[str] | None = None) -> int:
    """Run every step (or those ``only`` names); return the number that failed."""
    names = [s.name for s in STEPS]
    unknown = [n for n in only or [] if n not in names]
    if unknown:
        raise UsageError(
            f"--only {unknown[0]!r} is not a demo step: use one of {', '.join(map(repr, names))}"
        )
    failed = 0
    for i, step in enumerate(STEPS, 1):
        if only and step.name not in only:
            continue
        console.rule(f"[{i}/{len(STEPS)}] {step.task} {step.name}")
        t0 = time.perf_counter()
        try:
            step.run(results, console)
        except Exception as exc:
            failed += 1
            console.print(f"[red]step {step.name!r} failed:[/red] {exc}")
        else:
            console.print(f"done in {time.perf_counter() - t0:.1f} s")
    return failed
