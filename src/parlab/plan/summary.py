"""What a plan answers first: can it fit, how fast, what does it cost -- in plain sentences, for
the top choice -- and which candidates the error band cannot tell from it (ties).

Built from a ``PlanResult`` alone; the CLI prints it and the plan document carries it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from parlab.plan.cost import Budget, Cost, cost_of, duration
from parlab.plan.precision import Band, band_for, nodes_crossed, overlaps, simplicity
from parlab.plan.request import PlanResult, Verdict
from parlab.plan.throughput import Throughput

GIB = 2**30


@dataclass(kw_only=True)
class Summary:
    """The plan's answers, band and ties."""

    answers: list[str]
    """Fits? How fast? What does it cost? One sentence each, for the top choice."""
    band: Band | None
    """The error band of this kind of prediction, or None where the lab has not measured it."""
    ties: list[Verdict] = field(default_factory=list)
    """Admitted candidates whose band overlaps the top one's (the top first)."""
    apart: dict[str, str] = field(default_factory=dict)
    """Candidate name -> what tells it apart from the top choice."""
    cost: Cost | None = None
    """The top choice's cost of the budget."""

    def to_json(self) -> dict[str, Any]:
        return {
            "answers": self.answers,
            "band": None if self.band is None else self.band.to_json(),
            "ties": [v.cand.name for v in self.ties],
            "apart": self.apart,
            "cost": None if self.cost is None else self.cost.to_json(),
        }


def prediction_kind(result: PlanResult) -> str:
    """``mfu``, or the compute model's ``kind`` (``built-in``, ``fitted``)."""
    compute = result.request.compute
    return "mfu" if isinstance(compute, Throughput) else str(getattr(compute, "kind", "built-in"))


def summarize(result: PlanResult, budget: Budget) -> Summary:
    """The answers, band and ties of ``result`` (see the module docstring)."""
    band = band_for(prediction_kind(result))
    top = result.top
    if top is None:
        return Summary(answers=[_no_fit(result)], band=band)
    ties = [top]
    rel = band.rel if band is not None else 0.0
    for v in result.ranked[1:]:
        if rel and overlaps(v.tokens_per_s_per_gpu or 0, top.tokens_per_s_per_gpu or 0, rel):
            ties.append(v)
    req = result.request
    cost = cost_of(top.tokens_per_s_per_gpu or 0.0, req.cluster.count, req.cluster.gpu, budget)
    return Summary(
        answers=_answers(result, top, band, cost, budget),
        band=band,
        ties=ties,
        apart={v.cand.name: _apart(v, top, req.cluster.gpus_per_node) for v in ties[1:]},
        cost=cost,
    )


def _fmt(band: Band | None, x: float) -> str:
    return band.fmt(x) if band is not None else f"{x:,.3g}"


def _answers(
    result: PlanResult, top: Verdict, band: Band | None, cost: Cost | None, budget: Budget
) -> list[str]:
    req = result.request
    c = req.cluster
    e = top.estimate
    assert e is not None and top.peak_bytes is not None and top.headroom_bytes is not None
    pm = f" +/- {100 * band.rel:.0f} %" if band is not None else " (no error band measured)"
    fits = (
        f"Fits: {top.cand.name} holds {req.spec.name} on {c.count} x {c.gpu.name} at "
        f"{top.peak_bytes / GIB:.0f} GiB per GPU on its fullest stage, "
        f"{top.headroom_bytes / GIB:.0f} GiB under the {req.usable_memory / GIB:.0f} GiB usable."
    )
    mfu = f", {100 * top.mfu:.0f} % MFU" if top.mfu else ""
    fast = (
        f"How fast: {_fmt(band, top.tokens_per_s_per_gpu or 0)} tokens/s per GPU{pm}{mfu}, "
        f"a step of {req.tokens_per_step:,} tokens every {_fmt(band, e.step_s)} s."
    )
    if cost is None:
        money = (
            "Cost: give --tokens N (and --gpu-hour-price P) for the time to train, GPU-hours, "
            "cost and energy."
        )
    else:
        assert budget.tokens is not None
        parts = [f"{_fmt(band, cost.gpu_hours)} GPU-hours"]
        if cost.money is not None:
            parts.append(f"{_fmt(band, cost.money)} at {budget.gpu_hour_price:g} a GPU-hour")
        if cost.energy_kwh is not None:
            parts.append(f"{_fmt(band, cost.energy_kwh / 1000)} MWh at board power")
        money = (
            f"Cost: {budget.tokens:.3g} tokens take {duration(cost.seconds)} on {c.count} GPUs: "
            + ", ".join(parts)
            + "."
        )
    return [fits, fast, money]


def _no_fit(result: PlanResult) -> str:
    req = result.request
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(result.rejected_by_kind().items()))
    return (
        f"Does not fit: no layout of {req.cluster.count} x {req.cluster.gpu.name} holds "
        f"{req.spec.name} at global batch {req.global_batch} x {req.seq} ({kinds})."
    )


def _apart(v: Verdict, top: Verdict, gpus_per_node: int) -> str:
    """What tells ``v`` apart from ``top``: memory headroom, nodes crossed, simplicity."""
    out = []
    dh = (v.headroom_bytes or 0) - (top.headroom_bytes or 0)
    if abs(dh) >= GIB:
        out.append(f"{dh / GIB:+.0f} GiB headroom")
    dn = nodes_crossed(v.cand, gpus_per_node) - nodes_crossed(top.cand, gpus_per_node)
    if dn:
        out.append(f"{'more' if dn > 0 else 'fewer'} axes across nodes ({dn:+d})")
    ds = simplicity(v.cand) - simplicity(top.cand)
    if ds:
        out.append("simpler" if ds < 0 else "more moving parts")
    return ", ".join(out) or "the same footprint"
