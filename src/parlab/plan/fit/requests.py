"""A training run as a planner request: ``run_request`` reads what a measured run's document
records, ``request_of`` builds the (request, candidate, sequence parallel) of a configuration --
the one place a run becomes a plan."""

from __future__ import annotations

from typing import Any

from parlab.dtypes import RECIPES, document_dtype
from parlab.ledger import Implementation
from parlab.ledger.activations import schedule_name
from parlab.models import get_spec
from parlab.plan.fit.lab import LabCompute
from parlab.plan.fit.runs import implementation_of, knobs, recompute_of
from parlab.plan.request import PlanRequest
from parlab.plan.roofline import Roofline
from parlab.plan.space import Candidate, make_cluster
from parlab.plan.throughput import Throughput


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
