"""Run a cause-and-effect preset: launch it on every rank, analyse each setting, plot the sweep.

``run_sweep`` launches the preset's rank function (``parlab.profile.presets``)
through torchrun (``parlab.runtime.launch``: NCCL on GPUs, gloo on CPU),
which trains once per setting under ``Profiler``; then it analyses each
setting's trace folder into one T5 document (the first setting is the
baseline, the others candidates; each with the ledger's predicted
collectives and bytes per step, ``parlab.ledger.traffic``), draws one bar chart of exposed
communication, communication and step time per setting (``sweep.png``,
beside the first document, named in every document's artifacts). A failed
launch writes one failure document and returns it; nothing is analysed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from parlab.contract import Document, Failure, Prediction, new_run_id, now_iso, write_result
from parlab.hardware.env import snapshot
from parlab.ledger.traffic import traffic
from parlab.models import get_spec
from parlab.profile.capture import parse_schedule
from parlab.profile.export import write_sweep_png
from parlab.profile.presets import PRESETS
from parlab.profile.report import ProfileOutcome, profile_folder
from parlab.runtime.launch import LaunchConfig, launch
from parlab.topology import Topology


@dataclass(frozen=True, kw_only=True)
class SweepResult:
    """What a preset produced."""

    outcomes: list[ProfileOutcome] = field(default_factory=list)
    """One analysed setting each, in the preset's order."""
    sweep_png: Path | None = None
    """The sweep plot, when there were several settings."""
    failure: Failure | None = None
    """Why the launch failed (then ``outcomes`` is empty)."""
    failure_path: Path | None = None
    """The failure document."""


def predict_wire(
    preset: str, knobs: dict[str, Any], *, model: str, batch: int, seq: int, nproc: int, gpu: bool
) -> tuple[dict[str, Prediction], str | None]:
    """Collectives and bytes per step for one setting, from the ledger's wire table.

    ``parlab.ledger.traffic`` is the one definition of what a layout puts on the
    wire; the profile's measured ``comm_count_per_step`` and ``comm_bytes_per_step``
    sit beside it. Returns the predictions and, when there are none, why.
    """
    if preset == "fsdp" and not knobs.get("reshard_after_forward", True):
        return {}, "no prediction: the wire table models FSDP with reshard_after_forward only"
    dtype = "bf16-compute" if gpu else "fp32"
    kw: dict[str, Any] = {"micro_batch": batch, "seq_len": seq, "dtype": dtype}
    if preset in ("ddp", "ddp-buckets"):
        topo, strategy = Topology(world_size=nproc, dp=nproc), "ddp"
        kw["bucket_bytes"] = int(knobs["bucket_cap_mb"] * 1024 * 1024)
    elif preset == "fsdp":
        topo, strategy = Topology(world_size=nproc, dp=nproc), "fsdp"
    else:
        topo, strategy = Topology(world_size=nproc, tp=nproc), "ddp"
        kw["sp"] = bool(knobs.get("sequence_parallel"))
    try:
        items = traffic(get_spec(model), topo, strategy, **kw)
    except ValueError as exc:
        return {}, f"no prediction: the wire table has none for this layout ({exc})"
    where = f"ledger.traffic:{strategy}/{dtype}"
    return {
        "comm_count_per_step": Prediction(
            value=sum(i.count_per_step for i in items), unit="count", model=where
        ),
        "comm_bytes_per_step": Prediction(
            value=sum(i.total_bytes for i in items), unit="B", model=where
        ),
    }, None


def default_nproc() -> int:
    """Every GPU when there are at least two, else 2 (gloo CPU ranks)."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return n if n >= 2 else 2


def _failure_document(
    res_failure: Failure | None,
    *,
    run_id: str,
    preset: str,
    project: str,
    command: str,
    level: str,
    workload: dict[str, Any],
    nproc: int,
    backend: str,
    results: Path,
) -> SweepResult:
    """The launch failed: one failure document, nothing analysed."""
    failure = res_failure or Failure(kind="crash", message="the preset failed")
    doc = Document(
        run_id=run_id,
        created=now_iso(),
        project=project,
        task="T5",
        role="failure",
        evidence_level=level,
        command=command,
        environment=snapshot(),
        workload={"preset": preset, **workload},
        layout={"world_size": nproc, "backend": backend, "strategy": preset},
        metrics={},
        status="failed",
        failure=failure,
    )
    return SweepResult(failure=failure, failure_path=write_result(doc, results))


def _analyse_setting(
    i: int,
    setting: dict[str, Any],
    *,
    preset: str,
    kwargs: dict[str, Any],
    run_id: str,
    workload: dict[str, Any],
    nproc: int,
    gpu: bool,
    results: Path,
    project: str,
    command: str,
) -> ProfileOutcome:
    """Setting ``i``'s trace folder as one document, with the ledger's wire beside it."""
    knobs = setting["knobs"]
    preds, why = predict_wire(
        preset, knobs, model=kwargs["model"], batch=kwargs["batch"], seq=kwargs["seq"],
        nproc=nproc, gpu=gpu,
    )  # fmt: skip
    return profile_folder(
        setting["dir"],
        results=results,
        command=command,
        project=project,
        label=setting["label"],
        role="baseline" if i == 0 else "candidate",
        workload={"preset": preset, "sweep_run_id": run_id, **workload, "knobs": knobs},
        layout={"strategy": preset, "mesh": {"tp" if preset == "tp" else "dp": nproc}, **knobs},
        predictions=preds,
        notes=[why] if why else None,
    )


def _plot_sweep(
    outcomes: list[ProfileOutcome], *, results: Path, project: str, title: str, xlabel: str
) -> SweepResult:
    """Draw ``sweep.png`` beside the first document and name it in every document."""
    png = results / project / outcomes[0].doc.run_id / "sweep.png"

    def ms(name: str) -> list[float | None]:
        vals = [o.summary.mean(name) for o in outcomes]
        return [None if v is None else 1e3 * v for v in vals]

    write_sweep_png(
        png,
        labels=[o.doc.workload["label"] for o in outcomes],
        series={"exposed comm": ms("exposed_s"), "comm": ms("comm_s"), "step": ms("step_time_s")},
        title=title,
        ylabel="ms per step (mean over ranks)",
        xlabel=xlabel,
    )
    rel = str(png.relative_to(results / project))
    updated = []
    for o in outcomes:
        doc = dataclasses.replace(o.doc, artifacts={**o.doc.artifacts, "sweep_png": rel})
        write_result(doc, results)  # the same run_id: replaces the document atomically
        updated.append(dataclasses.replace(o, doc=doc))
    return SweepResult(outcomes=updated, sweep_png=png)


def run_sweep(
    preset: str,
    kwargs: dict[str, Any],
    *,
    nproc: int | None,
    backend: str,
    timeout: float,
    results: Path,
    trace_dir: Path | None,
    schedule: str,
    project: str,
    command: str,
    plot: tuple[str, str] | None,
) -> SweepResult:
    """Launch ``preset`` with ``kwargs`` on ``nproc`` ranks; analyse and document every setting.

    ``plot``: (title, x label) of the sweep plot across settings (None: no plot).
    """
    sched = list(parse_schedule(schedule))
    nproc = nproc or default_nproc()
    config = LaunchConfig(nproc=nproc, backend=backend, timeout_s=timeout)
    run_id = new_run_id(f"profile-{preset}")
    tdir = trace_dir or results / "profile-traces" / run_id
    kwargs = {**kwargs, "out_dir": str(tdir.resolve()), "schedule": sched, "run_id": run_id}
    res = launch(PRESETS[preset], kwargs, config)
    resolved = config.resolved_backend()
    level = "real-training" if resolved == "nccl" else "cpu-mechanism"
    workload = {k: v for k, v in kwargs.items() if k in ("model", "batch", "seq")}
    if not res.ok:
        return _failure_document(
            res.failure, run_id=run_id, preset=preset, project=project, command=command,
            level=level, workload=workload, nproc=nproc, backend=resolved, results=results,
        )  # fmt: skip
    gpu = resolved == "nccl"
    outcomes = []
    for i, c in enumerate(res.results[0]):
        outcomes.append(_analyse_setting(
            i, c, preset=preset, kwargs=kwargs, run_id=run_id, workload=workload, nproc=nproc,
            gpu=gpu, results=results, project=project, command=command,
        ))  # fmt: skip
    if plot is None or len(outcomes) < 2:
        return SweepResult(outcomes=outcomes)
    title = f"{plot[0]} ({level}, {nproc} ranks, {workload.get('model')})"
    return _plot_sweep(outcomes, results=results, project=project, title=title, xlabel=plot[1])
