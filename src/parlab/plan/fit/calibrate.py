"""Fit the roofline's efficiencies on measured training documents, in stated steps.

A measured run (a ``real-training`` document of PAR-TRAINING-STATE or PAR-MODEL-INTERNAL)
is rebuilt as a planner request (``parlab.plan.fit.requests.run_request``: its model, batch,
sequence, layout, dtype policy, implementation and cluster) and predicted by
``parlab.plan.admission.evaluate`` under a ``Roofline``. ``fit_steps`` fits the efficiencies
one step at a time, each on the runs its selector picks, with the earlier steps' values held
(``parlab.plan.fit.efficiencies.fit_roofline``; three rounds, because exposed communication
depends on compute). The steps the lab uses (``LAB_STEPS``):

1. ``gemm``, ``attention``, ``memory``: the one-GPU model-internal runs of the 1.3B (no
   communication, no bubble): short sequences (GEMM-heavy), 32k sequences (attention-heavy),
   two implementations (their elementwise bytes differ by ``parlab.plan.roofline.ELEMENTWISE``);
   the one-GPU training runs of other models and shapes are left to test it;
2. ``ring_attention``: the context-parallel ring runs;
3. ``contention`` and the GEMM width law's ``gemm_width_half``: the data-parallel training
   runs (DDP, ZeRO, FSDP) of Llama-style models in the current implementation, without
   recompute or compile (two widths: the 1.3B's 2048 and the 8B's 4096).

Every prediction is the GPU's time alone. torch's DTensor tensor-parallel runs, whose step the
host's per-op dispatch sets, are "not modelled" (``unmodelled``).

Models whose GEMM shapes the width law does not describe (GPT-2 1.5B: hidden 1600, vocabulary
50257) are predicted with the measured GEMM-shape factor where a GPU GEMM-shape calibration
covers them (``parlab.plan.fit.shapes``; ``predict``'s ``shapes``), and are "not modelled" without
one. The fit never uses it: ``fit_steps`` keeps the width law and leaves those runs out.

Nothing here crosses a wire or imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from parlab.comm.calibration import load_calibration
from parlab.contract import read_results
from parlab.errors import UsageError
from parlab.models import get_spec
from parlab.plan.admission import evaluate
from parlab.plan.estimate import StepEstimate
from parlab.plan.fit.efficiencies import UNIT, FitRow, fit_roofline
from parlab.plan.fit.lab import LabCompute
from parlab.plan.fit.paramwork import param_work_calibration
from parlab.plan.fit.requests import run_request
from parlab.plan.fit.runs import (
    gpu_name,
    implementation_of,
    is_dtensor_tp,
    knobs,
    model_name,
    recompute_of,
)
from parlab.plan.fit.shape_probe import gemm_shape_calibration
from parlab.plan.fit.shapes import same_gpu, shape_factor, shaped_roofline
from parlab.plan.pricing import candidate_work
from parlab.plan.roofline import Roofline


def unmodelled(doc: Any, *, shapes: Any = None, roofline: Any = None) -> str:
    """Why the planner's model does not describe this run ("" when it does); ``shapes`` and
    ``roofline``: a GEMM-shape calibration (``parlab.plan.fit.shapes``) that, where it covers the
    run against ``roofline``'s reference width, describes its unaligned GEMMs (its head dim: the
    measured attention factor where the calibration has one for the run's batch, else the
    attention term's, as for every model)."""
    name = model_name(doc)
    if is_dtensor_tp(doc):
        return "DTensor TP: host-bound per-op dispatch (not modelled)"
    if str((doc.layout or {}).get("strategy", "")).startswith("deepspeed-"):
        return "DeepSpeed's engine: its own buckets, partitions and prefetch (not modelled)"
    if (doc.layout or {}).get("pp_schedule") == "zbv":
        return (
            "torch's zero-bubble V: measured slower than its 1F1B, which the bubble model cannot "
            "give; what its runtime adds (input- and weight-gradient passes as separate autograd "
            "calls, one transfer per action) is not modelled"
        )
    if recompute_of(doc) == "op-selective":
        return (
            "runtime's selective = op-level SAC (priced as recompute=op-selective); the per-op "
            "host cost of its dispatch mode not modelled"
        )
    try:
        spec = get_spec(name)
    except ValueError:
        return ""
    if spec.vocab_size % 64:
        if roofline is not None and shape_factor(doc, roofline, shapes) is not None:
            return ""
        return (
            f"vocab {spec.vocab_size} not a multiple of 64: unaligned output GEMM, and head dim "
            f"{spec.d_head} (not modelled)"
        )
    return ""


def predict(
    doc: Any, roofline: Roofline, *, calibration: Any = None, shapes: Any = None
) -> StepEstimate | None:
    """The planner's step estimate of one measured run under ``roofline``; with a GEMM-shape
    calibration ``shapes`` covering the run, its measured shape factor replaces the width law
    and its measured attention factor scales the attention term
    (``parlab.plan.fit.shapes.shaped_roofline``)."""
    roofline = shaped_roofline(doc, roofline, shapes)
    made = run_request(doc, roofline=roofline, calibration=calibration)
    if made is None:
        return None
    req, cand, sp = made
    return evaluate(req, cand, sp=sp).estimate


def fit_row(doc: Any, roofline: Roofline, *, calibration: Any = None) -> FitRow | None:
    """The run as ``fit_roofline`` reads it, with its communication as predicted at
    ``roofline``."""
    made = run_request(doc, roofline=roofline, calibration=calibration)
    if made is None:
        return None
    req, cand, sp = made
    est = predict(doc, roofline, calibration=calibration)
    measured = doc.metric("step_time")
    if est is None or not measured:
        return None
    w = candidate_work(req, cand, sp=sp)
    return FitRow(
        work=w,
        measured_s=float(measured),
        other_s=est.step_s - est.compute_s,  # exposed communication and bubble
        hidden_s=est.comm_hidden_s,
    )


@dataclass(frozen=True, kw_only=True)
class Step:
    """One calibration step: which efficiencies, fitted on which runs."""

    free: tuple[str, ...]
    """The efficiencies it fits (``parlab.plan.roofline.EFFICIENCIES``)."""
    runs: str
    """The runs it uses, in words."""
    select: Callable[[Any], bool]
    """Picks those runs from the documents."""


def _width(doc: Any) -> float:
    """The run's per-GPU GEMM width, hidden / tp."""
    model = doc.workload.get("model")
    mesh = (doc.layout or {}).get("mesh") or {}
    if isinstance(model, dict) and model.get("hidden"):
        hidden = float(model["hidden"])
    else:
        hidden = float(get_spec(str(doc.workload.get("preset") or model)).hidden)
    return hidden / int(mesh.get("tp", 1))


def _world(doc: Any) -> int:
    return int((doc.layout or {}).get("world_size") or 1)


def _is_llama_dp_run(doc: Any) -> bool:
    k = knobs(doc)
    model = doc.workload.get("model")
    llama = isinstance(model, dict) and model.get("position") == "rope"
    return (
        doc.project == "PAR-TRAINING-STATE"
        and llama
        and implementation_of(doc).norm_kernel == "fused"
        and str(k.get("recompute") or "none") == "none"
        and _world(doc) > 1
    )


LAB_STEPS: tuple[Step, ...] = (
    Step(
        free=("gemm", "attention", "memory"),
        runs="one-GPU model-internal runs of the 1.3B (no communication; seq 4096 and 32768; "
        "both implementations)",
        # the model-internal baselines alone: the one-GPU training runs (other models, shapes,
        # recompute) are what the fitted model is tested on, not fitted to
        select=lambda d: _world(d) == 1 and d.project == "PAR-MODEL-INTERNAL",
    ),
    Step(
        free=("ring_attention",),
        runs="context-parallel ring runs",
        select=lambda d: int(((d.layout or {}).get("mesh") or {}).get("cp", 1)) > 1,
    ),
    Step(
        free=("contention", "gemm_width_half"),
        runs="data-parallel runs of Llama-style models (hidden 2048 and 4096), current "
        "implementation, no recompute or compile",
        select=_is_llama_dp_run,
    ),
)


def collectives_calibration(root: Any) -> Any:
    """The measured (``real-nccl``) alpha-beta calibration under ``root``/PAR-COLLECTIVES that
    fits the most ops, or None: the runs' intra-node links, as measured beside them."""
    best = None
    for path in sorted((Path(root) / "PAR-COLLECTIVES").glob("collectives-calibration-*.json")):
        try:
            cal = load_calibration(path)
        except (ValueError, OSError):
            continue
        if cal.evidence_level == "real-nccl" and (best is None or len(cal.ops) > len(best.ops)):
            best = cal
    return best


def fit_steps(
    docs: Sequence[Any],
    steps: Sequence[Step] = LAB_STEPS,
    *,
    calibration: Any = None,
    param_work: Any = None,
    rounds: int = 3,
) -> tuple[Roofline, list[tuple[Step, list[str]]]]:
    """The roofline fitted step by step, and the run ids each step used; with ``param_work``
    (``parlab.plan.fit.paramwork.ParamWork``) the optimizer step and the casts run at its measured
    bandwidths, fixed through the fit, instead of the fitted elementwise one.

    ``UsageError`` when a step has no run or its runs cannot determine its efficiencies.
    """
    if not docs:
        raise UsageError("no measured training run to fit the roofline on")
    roof = UNIT
    if param_work is not None:
        roof = replace(
            roof,
            optimizer_bw=param_work.optimizer_bw,
            cast_bw=param_work.cast_bw,
            bucket_bw=param_work.bucket_bw,
        )
    peak = hbm = 0.0
    used: list[tuple[Step, list[str]]] = []
    for step in steps:
        chosen = [d for d in docs if step.select(d) and not unmodelled(d)]
        if not chosen:
            raise UsageError(f"no run to fit {', '.join(step.free)} on: needs {step.runs}")
        names = {gpu_name(d) for d in chosen}
        if len(names) > 1:
            raise UsageError(
                f"the runs to fit {', '.join(step.free)} on ran on {', '.join(sorted(names))}: "
                "fit one GPU model at a time"
            )
        if "gemm" in step.free:  # the GEMM efficiency belongs to these runs' width
            widths = sorted(_width(d) for d in chosen)
            roof = replace(roof, gemm_width=widths[len(widths) // 2])
        for _ in range(rounds):
            rows = []
            for d in chosen:
                row = fit_row(d, roof, calibration=calibration)
                if row is not None:
                    rows.append(row)
                    made = run_request(d, calibration=calibration)
                    assert made is not None
                    gpu = made[0].cluster.gpu
                    peak, hbm = float(gpu.peak("bf16") or 0.0), float(gpu.memory_bw)
            roof = fit_roofline(
                rows,
                peak_flops=peak,
                hbm_bw=hbm,
                fixed=roof,
                free=step.free,
                source="fitted",
            )
        used.append((step, [d.run_id for d in chosen]))
    label = "; ".join(f"{', '.join(s.free)} on {len(ids)} {s.runs}" for s, ids in used)
    if param_work is not None:
        label += f"; the optimizer step and the casts at the bandwidths of {param_work.label}"
    return replace(roof, source=f"fitted: {label}"), used


def training_runs(root: Any) -> list[Any]:
    """The measured GPU training runs under ``root`` the roofline can be fitted on: successful
    ``real-training`` documents of PAR-TRAINING-STATE and PAR-MODEL-INTERNAL with a step time
    (profiled runs left out -- ``profiled_run_id`` or the ``profiled`` knob: the profiler's
    overhead is in their step time). ``UsageError`` when ``root`` is not a folder."""
    if not Path(root).is_dir():
        raise UsageError(f"{root} is not a results folder: give the folder the GPU runs wrote")
    entries, _ = read_results(Path(root))
    return [
        e.doc
        for e in entries
        if e.doc.evidence_level == "real-training"
        and e.doc.project in ("PAR-TRAINING-STATE", "PAR-MODEL-INTERNAL")
        and e.doc.status == "ok"
        and e.doc.role != "decision"
        and e.doc.metric("step_time")
        and "profiled_run_id" not in e.doc.workload
        and not knobs(e.doc).get("profiled")
    ]


def lab_roofline(root: Any, *, calibration: Any = None) -> tuple[Roofline, list[str]]:
    """The roofline fitted by ``LAB_STEPS`` on the training runs under ``root``, and the run
    ids it rests on."""
    docs = training_runs(root)
    roof, used = fit_steps(docs, calibration=calibration, param_work=param_work_calibration(root))
    return roof, [rid for _, ids in used for rid in ids]


def step_prediction(doc: Any, root: Any) -> tuple[float, str] | None:
    """(seconds, what made it): the lab's step time -- the GPU's -- for the run ``doc`` describes
    (its layout, workload and environment; made before it runs, it has no metrics yet) from the
    documents under ``root``, as ``benchmarks/plan_accuracy.py`` predicts a run outside its
    calibration: the roofline fitted on ``root``'s training runs (``lab_roofline``) with the
    GEMM-shape probes' factors (``predict``). None where the roofline does not describe the run
    (another GPU, CPU ranks)."""
    cal = collectives_calibration(root)
    roof, used = lab_roofline(root, calibration=cal)
    est = predict(doc, roof, calibration=cal, shapes=gemm_shape_calibration(root))
    if est is None:
        return None
    return est.step_s, f"roofline fitted on {len(used)} runs under {root}"


def predict_planned(req: Any, cand: Any, *, sp: bool, root: Any) -> tuple[float, str] | None:
    """(seconds, what made it): the lab's step time for a run not yet made, given as the plan
    request and candidate its configuration builds (``parlab train --roofline`` builds them from
    its config, before the run starts): the roofline fitted on ``root``'s training runs with the
    GEMM-shape probes' factors (``parlab.plan.fit.lab.LabCompute``), on the links of ``root``'s
    collectives calibration. None where the request's GPU has no runs under ``root``."""
    cal = collectives_calibration(root)
    runs = training_runs(root)
    gpus = {gpu_name(d) for d in runs}
    if not any(same_gpu(g, req.cluster.gpu.name) for g in gpus):
        return None
    roof, used = lab_roofline(root, calibration=cal)
    compute = LabCompute(roofline_fit=roof, shapes=gemm_shape_calibration(root))
    cluster = replace(req.cluster, calibration=cal) if cal is not None else req.cluster
    est = evaluate(replace(req, compute=compute, cluster=cluster), cand, sp=sp).estimate
    if est is None:
        return None
    return est.step_s, f"roofline fitted on {len(used)} runs under {root}"
