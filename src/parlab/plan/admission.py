"""Admission of one candidate, in ``parlab.plan.planner``'s order (layout, batch, unsupported,
memory, comm): the first failing check is its verdict's reason; an admitted one is timed
(``parlab.plan.pricing``)."""

from __future__ import annotations

from typing import Any

from parlab.layout import constraints, shape_of
from parlab.ledger import OPTIMIZERS, Implementation, models_compiled, predict
from parlab.plan.pricing import Group, reshards, timed
from parlab.plan.request import PlanRequest, Verdict
from parlab.plan.space import Candidate
from parlab.topology import Topology


def gib(x: float) -> str:
    return f"{x / 2**30:.2f} GiB"


def _stage_floor(ledger: Any) -> float:
    """The largest on-device state bytes (params, grads, optimizer, master) over stages."""
    best = 0.0
    for stage in range(ledger.topology.pp):
        total = 0
        for name in ("params", "grads", "optimizer", "master_params"):
            it = ledger.item(name)
            if it is not None and it.on_device:
                total += it.per_stage[stage]
        best = max(best, total)
    return best


def layout_group(req: PlanRequest, deg: dict[str, int], vpp: int, sp: bool) -> Group:
    rows = constraints(
        world=req.cluster.count,
        degrees=deg,
        shape=shape_of(req.spec),
        seq=req.seq,
        sequence_parallel=sp,
        gpus_per_node=req.cluster.gpus_per_node,
        vpp=vpp,
    )
    bad = "; ".join(f"{r.name} fails ({r.detail})" for r in rows if not r.ok)
    return Group(bad=bad, topo=None if bad else Topology(world_size=req.cluster.count, **deg))


def _batch_reason(req: PlanRequest, cand: Candidate) -> str:
    per_step = cand.dp * cand.micro_batch
    m = cand.microbatches
    if req.global_batch != per_step * m:
        return (
            f"global batch {req.global_batch} is not a multiple of dp {cand.dp} x micro-batch "
            f"{cand.micro_batch} = {per_step}"
        )
    if cand.schedule == "interleaved" and m % cand.pp:
        return f"interleaved schedule needs the {m} micro-batches to be a multiple of pp {cand.pp}"
    if cand.schedule == "zbv" and m < 2 * cand.pp - 1:
        return f"zero-bubble V needs at least 2 pp - 1 = {2 * cand.pp - 1} micro-batches, not {m}"
    return ""


def judge(
    req: PlanRequest, cand: Candidate, group: Group, *, sp: bool, time_rejected: bool = False
) -> Verdict:
    """One candidate through every admission check and, where it is admitted (or
    ``time_rejected``: rejected for memory too), the estimate."""
    no = dict(cand=cand, admitted=False)
    if group.bad:
        return Verdict(**no, kind="layout", reason=group.bad)
    if why := _batch_reason(req, cand):
        return Verdict(**no, kind="batch", reason=why)
    usable = req.usable_memory
    if group.floor is not None and group.floor > usable:
        return Verdict(**no, kind="memory", reason=group.floor_reason, peak_bytes=group.floor)
    assert group.topo is not None
    ledger_for = _ledger_for(req, cand, group.topo, sp)
    try:
        group.calls += 1
        ledger = ledger_for(req.optimizer)
    except ValueError as exc:
        return Verdict(**no, kind="unsupported", reason=str(exc))
    if group.floor is None:
        group.floor = _stage_floor(ledger)
        group.floor_reason = (
            f"over memory by at least {gib(group.floor - usable)}: the states alone (params, "
            f"grads, optimizer) need {gib(group.floor)} per GPU of {gib(usable)} usable, at any "
            "micro-batch or recompute"
        )
    peak = float(ledger.peak_bytes)
    if peak > usable and not time_rejected:
        v = Verdict(cand=cand, admitted=True, peak_bytes=peak)
    else:
        v = timed(req, cand, group, peak=peak, sp=sp)
    if peak > usable:
        stage = max(range(len(ledger.peak_per_stage)), key=lambda s: ledger.peak_per_stage[s])
        reason = (
            f"over memory by {gib(peak - usable)}: predicted peak {gib(peak)} per GPU of "
            f"{gib(usable)} usable (stage {stage}, {ledger.peak_phase[stage]})"
            + _fused_hint(ledger, usable, req.optimizer, ledger_for)
        )
        return _rejected(v, "memory", reason)
    est = v.estimate
    assert est is not None
    frac = est.comm_exposed_s / est.step_s
    if req.max_exposed_comm is not None and frac > req.max_exposed_comm:
        reason = (
            f"exposed communication {100 * frac:.1f} % of the step, over the budget "
            f"{100 * req.max_exposed_comm:.1f} %"
        )
        return _rejected(v, "comm", reason)
    return v


def _rejected(v: Verdict, kind: str, reason: str) -> Verdict:
    return Verdict(
        cand=v.cand, admitted=False, kind=kind, reason=reason, peak_bytes=v.peak_bytes,
        estimate=v.estimate, tokens_per_s_per_gpu=v.tokens_per_s_per_gpu, mfu=v.mfu,
        headroom_bytes=v.headroom_bytes,
    )  # fmt: skip


def _ledger_for(req: PlanRequest, cand: Candidate, topo: Topology, sp: bool) -> Any:
    impl = req.implementation
    norm = impl.norm_kernel
    if norm == "compiled" and not models_compiled(
        req.spec, dtype=req.dtype, strategy=cand.strategy, recompute=cand.recompute
    ):
        norm = "fused"

    def call(optimizer: str) -> Any:
        return predict(
            req.spec,
            strategy=cand.strategy,
            topology=topo,
            micro_batch=cand.micro_batch,
            seq_len=req.seq,
            dtype=req.dtype,
            optimizer=optimizer,
            recompute=cand.recompute,
            pp_schedule="1f1b" if cand.schedule == "-" else cand.schedule,
            microbatches=cand.microbatches,
            virtual_stages=cand.vpp,
            sp=sp,
            reshard_after_forward=reshards(cand),
            impl=Implementation(
                norm_kernel=norm, kv_repeat=impl.kv_repeat, attention_kernel=impl.attention_kernel
            ),
        )

    return call


def _fused_hint(ledger: Any, usable: float, optimizer: str, ledger_for: Any) -> str:
    """Where the foreach optimizer's temporaries are what puts the peak over: the same layout's
    ledger with the fused form of the optimizer, and its peak if that fits."""
    temp = float(ledger.value("optimizer_temporaries"))
    fused = f"{optimizer}-fused"
    if not temp or ledger.peak_bytes - temp > usable or fused not in OPTIMIZERS:
        return ""
    again = ledger_for(fused)
    if again.peak_bytes > usable:
        return ""
    return (
        f"; the {optimizer} temporaries ({gib(temp)}) put it over: with --optimizer {fused} "
        f"(what parlab train runs on GPUs) the peak is {gib(again.peak_bytes)}"
    )


def evaluate(req: PlanRequest, cand: Candidate, *, sp: bool | None = None) -> Verdict:
    """One given candidate through the same checks and estimate as ``plan`` (no search).

    ``sp`` overrides sequence parallelism (default: on when tp > 1).
    """
    sp = cand.tp > 1 if sp is None else sp
    deg = {"pp": cand.pp, "dp": cand.dp, "cp": cand.cp, "tp": cand.tp, "ep": cand.ep}
    return judge(req, cand, layout_group(req, deg, cand.vpp, sp), sp=sp, time_rejected=True)
