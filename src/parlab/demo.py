"""``parlab demo``: the whole lab at CPU size, on the embedded default.

Each step of the lab adds one ``DemoStep`` below, in T0-T6 order; the demo
runs them in turn against one results folder and ends with the asset table
(and, once the report exists, the report). With no GPU every distributed step
runs on gloo CPU ranks. A step that fails is reported and the demo goes on,
exiting non-zero at the end.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console


@dataclass(frozen=True, kw_only=True)
class DemoStep:
    """One step of the demo."""

    name: str
    """Short label shown while it runs."""
    task: str
    """The T0-T6 step it illustrates."""
    entry: str
    """``module:function`` called as ``function(results, console)``; it writes its
    documents under the results folder and raises if the step failed."""

    def resolve(self) -> Callable[[Path, Console], None]:
        module, _, name = self.entry.partition(":")
        return getattr(importlib.import_module(module), name)


def env_step(results: Path, console: Console) -> None:
    from parlab.cli.common import write
    from parlab.hardware.precheck import run_precheck

    doc = run_precheck(command=f"parlab env --results {results}")
    write(doc, results)
    if doc.status != "ok":
        raise RuntimeError(f"precheck failed: {doc.failure.message if doc.failure else '?'}")


# One line per step, in T0-T6 order; each step's code lives in its own module.
STEPS: list[DemoStep] = [
    DemoStep(name="fit", task="T0", entry="parlab.cli.analytic:demo_step"),
    DemoStep(name="environment precheck", task="T1", entry="parlab.demo:env_step"),
    DemoStep(name="collectives sweep", task="T1", entry="parlab.comm.demo:demo_step"),
    DemoStep(name="training state", task="T2", entry="parlab.projects.training_state:demo_step"),
    DemoStep(name="model internals", task="T3", entry="parlab.projects.model_internal:demo_step"),
    DemoStep(name="moe expert parallel", task="T4", entry="parlab.projects.moe:demo_step"),
    DemoStep(name="serving", task="T4", entry="parlab.projects.serving:demo_step"),
    DemoStep(name="profile ddp buckets", task="T5", entry="parlab.cli.profile:demo_step"),
    DemoStep(name="plan and decide", task="T6", entry="parlab.plan.demo:plan_decide_step"),
    DemoStep(name="doctor", task="T6", entry="parlab.doctor.diagnose:demo_step"),
    DemoStep(name="report", task="T6", entry="parlab.plan.demo:report_step"),
]


def run_demo(results: Path, console: Console, *, only: list[str] | None = None) -> int:
    """Run every step; return the number that failed."""
    failed = 0
    for i, step in enumerate(STEPS, 1):
        if only and step.name not in only:
            continue
        console.rule(f"[{i}/{len(STEPS)}] {step.task} {step.name}")
        t0 = time.perf_counter()
        try:
            step.resolve()(results, console)
        except Exception as exc:
            failed += 1
            console.print(f"[red]step {step.name!r} failed:[/red] {exc}")
        else:
            console.print(f"done in {time.perf_counter() - t0:.1f} s")
    return failed
