"""Fit the roofline's efficiencies on measured training documents, in stated steps.

A measured run (a ``real-training`` document of PAR-TRAINING-STATE or PAR-MODEL-INTERNAL)
is rebuilt as a planner request (``run_request``: its model, batch, sequence, layout,
dtype policy, implementation and cluster) and predicted by ``parlab.plan.planner.evaluate``
under a ``Roofline``. ``fit_steps`` fits the efficiencies one step at a time, each on the
runs its selector picks, with the earlier steps' values held (``parlab.plan.roofline.
fit_roofline``; three rounds, because exposed communication depends on compute). The steps
the lab uses (``LAB_STEPS``):

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

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from parlab.dtypes import RECIPES, document_dtype
from parlab.errors import UsageError
from parlab.ledger.implementation import Implementation
from parlab.plan.estimate import StepEstimate, Throughput
from parlab.plan.fit.efficiencies import FitRow, fit_roofline
from parlab.plan.fit.runs import implementation_of, knobs, model_name, recompute_of
from parlab.plan.roofline import Roofline

_STAMP = re.compile(r"-\d{8}T\d{6}-[0-9a-f]+$")


def group_of(doc: Any) -> str:
    """Runs that repeat one configuration: the run id without its time stamp, the ranks and the
    shape of a rank's batch (``n2-mb2x4096``: one run name covers several), and the knobs that
    change the work (implementation, recompute, resharding, bf16 master weights) or where it
    runs (the ranks' NUMA binding, garbage collection by hand)."""
    k = knobs(doc)
    impl = implementation_of(doc)
    w = doc.workload or {}
    world = (doc.layout or {}).get("world_size")
    mb, seq = w.get("micro_batch"), w.get("seq") or w.get("seq_len")
    parts = [
        _STAMP.sub("", doc.run_id),
        f"n{world}-mb{mb}x{seq}" if world and mb and seq else "",
        impl.norm_kernel,
        str(k.get("recompute") or "none"),
        "keep" if k.get("reshard_after_forward") is False else "",
        # parlab's ZeRO-1/2 with bf16 parameters and fp32 master shards: other work
        "bf16-master" if k.get("dtype") == "bf16-master" else "",
        "sp-per-linear" if impl.sp_gather == "per-linear" else "",
        f"numa-{k['numa_binding']}" if k.get("numa_binding") else "",
        f"gc-{k['manual_gc']}" if k.get("manual_gc") else "",
    ]
    return "/".join(p for p in parts if p)


def is_dtensor_tp(doc: Any) -> bool:
    """torch's DTensor tensor parallelism (``implementation: torch`` at tp > 1)."""
    mesh = (doc.layout or {}).get("mesh") or {}
    return knobs(doc).get("implementation") == "torch" and int(mesh.get("tp", 1)) > 1


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
        from parlab.models import get_spec

        spec = get_spec(name)
    except ValueError:
        return ""
    if spec.vocab_size % 64:
        from parlab.plan.fit.shapes import shape_factor

        if roofline is not None and shape_factor(doc, roofline, shapes) is not None:
            return ""
        return (
            f"vocab {spec.vocab_size} not a multiple of 64: unaligned output GEMM, and head dim "
            f"{spec.d_head} (not modelled)"
        )
    return ""


def run_request(
    doc: Any,
    *,
    roofline: Roofline | None = None,
    mfu: float = 0.40,
    calibration: Any = None,
) -> tuple[Any, Any, bool] | None:
    """(request, candidate, sequence parallel) reproducing one training run from its document
    (``request_of`` on what the document records), or None when it lacks the model, sequence,
    batch or GPU."""
    w, lay = doc.workload, doc.layout
    model = w.get("model")
    gpus = ((doc.environment or {}).get("hardware") or {}).get("gpus") or []
    if not model or not w.get("seq") or not w.get("global_batch") or not gpus:
        return None
    mesh = lay.get("mesh") or {}
    world = int(lay["world_size"])
    tp, pp, cp = int(mesh.get("tp", 1)), int(mesh.get("pp", 1)), int(mesh.get("cp", 1))
    schedule = "-"
    if pp > 1:
        from parlab.ledger.activations import schedule_name

        try:
            schedule = schedule_name(str(lay.get("pp_schedule") or "1f1b").removesuffix("-torch"))
        except ValueError:
            return None
    return request_of(
        model=str(w.get("preset") or (model.get("name") if isinstance(model, dict) else model)),
        gpu=str(gpus[0]["name"]), gpus_per_node=max(1, len(gpus)), world=world,
        strategy=str(lay.get("strategy") or "ddp"),
        mesh={"tp": tp, "pp": pp, "cp": cp, "dp": int(mesh.get("dp", world // (tp * pp * cp)))},
        micro_batch=int(w.get("micro_batch") or 1), global_batch=int(w["global_batch"]),
        seq=int(w["seq"]), dtype=document_dtype(doc), recompute=recompute_of(doc),
        schedule=schedule, vpp=int(lay.get("vpp") or 1), impl=implementation_of(doc),
        sp=bool(knobs(doc).get("sequence_parallel", tp > 1)), roofline=roofline, mfu=mfu,
        calibration=calibration,
    )  # fmt: skip


def request_of(
    *,
    model: str,
    gpu: str,
    gpus_per_node: int,
    world: int,
    strategy: str,
    mesh: dict[str, int],
    micro_batch: int,
    global_batch: int,
    seq: int,
    dtype: str | None,
    recompute: str,
    schedule: str = "-",
    vpp: int = 1,
    impl: Implementation | None = None,
    sp: bool = False,
    roofline: Roofline | None = None,
    mfu: float = 0.40,
    calibration: Any = None,
) -> tuple[Any, Any, bool]:
    """(request, candidate, sequence parallel) of one run's configuration -- what a document
    records, or what ``parlab train`` is about to run -- the one place a run becomes a plan."""
    from parlab.models import get_spec
    from parlab.plan.fit.lab import LabCompute
    from parlab.plan.planner import PlanRequest
    from parlab.plan.space import Candidate, make_cluster

    spec = get_spec(model)
    cluster = make_cluster(
        gpus=f"{world}x{gpu}", gpus_per_node=gpus_per_node, calibration=calibration
    )
    strategy = strategy.removesuffix("-naive").removeprefix("deepspeed-")  # the same sharding
    if strategy not in ("zero1", "zero2", "zero3", "fsdp"):  # ddp forms; tp2/pp2/cp2 layouts
        strategy = "ddp"
    peak = cluster.gpu.peak("bf16") or 0.0
    req = PlanRequest(
        spec=spec,
        cluster=cluster,
        global_batch=global_batch,
        seq=seq,
        compute=(
            Throughput(mfu=mfu, peak_flops=peak, source=f"MFU {mfu:.3f}", assumed=True)
            if roofline is None
            else LabCompute(roofline_fit=roofline)
        ),
        dtype=dtype if dtype in RECIPES else "bf16-compute",
        optimizer="adamw-fused",
        implementation=impl or Implementation(),
    )
    dp = mesh.get("dp", world // (mesh.get("tp", 1) * mesh.get("pp", 1) * mesh.get("cp", 1)))
    cand = Candidate(
        dp=dp,
        tp=mesh.get("tp", 1),
        pp=mesh.get("pp", 1),
        cp=mesh.get("cp", 1),
        ep=1,
        strategy=strategy,
        micro_batch=micro_batch,
        microbatches=max(1, global_batch // (dp * micro_batch)),
        recompute=recompute,
        schedule=schedule,
        vpp=vpp if schedule in ("interleaved", "zbv") else 1,  # zbv: the V, 2 chunks a rank
    )
    return req, cand, sp


def predict(
    doc: Any, roofline: Roofline, *, calibration: Any = None, shapes: Any = None
) -> StepEstimate | None:
    """The planner's step estimate of one measured run under ``roofline``; with a GEMM-shape
    calibration ``shapes`` covering the run, its measured shape factor replaces the width law
    and its measured attention factor scales the attention term
    (``parlab.plan.fit.shapes.shaped_roofline``)."""
    from parlab.plan.fit.shapes import shaped_roofline
    from parlab.plan.planner import evaluate

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
    from parlab.plan.planner import candidate_work

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
        from parlab.models import get_spec

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
    from pathlib import Path

    from parlab.comm.calibration import load_calibration

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
    roof = Roofline(gemm=1.0, attention=1.0, ring_attention=1.0, memory=1.0)
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
        names = {
            str((((d.environment or {}).get("hardware") or {}).get("gpus") or [{}])[0].get("name"))
            for d in chosen
        }
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
    from pathlib import Path

    from parlab.contract import read_results

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
    from parlab.plan.fit.paramwork import param_work_calibration

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
    from parlab.plan.fit.shapes import gemm_shape_calibration

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
    from dataclasses import replace

    from parlab.plan.fit.lab import LabCompute
    from parlab.plan.fit.shapes import gemm_shape_calibration, same_gpu
    from parlab.plan.planner import evaluate

    cal = collectives_calibration(root)
    runs = training_runs(root)
    gpus = {
        str((((d.environment or {}).get("hardware") or {}).get("gpus") or [{}])[0].get("name"))
        for d in runs
    }
    if not any(same_gpu(g, req.cluster.gpu.name) for g in gpus):
        return None
    roof, used = lab_roofline(root, calibration=cal)
    compute = LabCompute(roofline_fit=roof, shapes=gemm_shape_calibration(root))
    cluster = replace(req.cluster, calibration=cal) if cal is not None else req.cluster
    est = evaluate(replace(req, compute=compute, cluster=cluster), cand, sp=sp).estimate
    if est is None:
        return None
    return est.step_s, f"roofline fitted on {len(used)} runs under {root}"
