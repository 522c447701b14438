"""Ranks idle while others work: a pipeline bubble, a straggler rank, MoE load skew (their
thresholds, detectors and entries)."""

from __future__ import annotations

from parlab.doctor.cases.base import (
    Case,
    Doc,
    Finding,
    finding,
    fmt,
    mfield,
    mper,
    mval,
    ok_docs,
)
from parlab.ledger.activations import bubble_fraction

PP_BUBBLE = 0.20
"""A pipeline bubble (idle fraction of the busiest stage) at or above this."""
STRAGGLER_FRACTION = 0.05
"""A rank late by this fraction of the step time."""
MOE_EXCESS_PCT = 20.0
"""The slowest rank's excess over the mean, %, in an expert-parallel layer."""
MOE_LOAD_RATIO = 1.20
"""... with its routed load this much above the mean."""


def bubble_formula(pp: int, microbatches: int, vpp: int = 1) -> float:
    """Fill-and-drain idle fraction of a pipeline's step: (p-1) / (v*m + p-1)."""
    idle = bubble_fraction(pp, microbatches, vpp)
    return idle / (1 + idle)


def detect_pp_bubble(docs: list[Doc]) -> list[Finding]:
    out: list[Finding] = []
    for d in ok_docs(docs):
        doc = d.doc
        pp = int((doc.layout.get("mesh") or {}).get("pp") or 1)
        m = doc.workload.get("microbatches")
        if pp < 2 or not m:
            continue
        vpp = int(doc.layout.get("vpp") or 1)
        analytic = bubble_formula(pp, int(m), vpp)
        measured = mval(doc, "pp_bubble")
        fields = [f"workload.microbatches = {m}", f"layout.mesh.pp = {pp}",
                  f"(p-1)/(v*m+p-1) = {analytic:.3f}"]  # fmt: skip
        if measured is not None and measured >= PP_BUBBLE and analytic >= PP_BUBBLE / 2:
            # the fill-and-drain formula must account for a good part of it: idle with many
            # micro-batches is stage imbalance or send/recv time, not this case
            out.append(finding(
                d, "pp-bubble", "strong" if analytic >= PP_BUBBLE else "moderate",
                f"pipeline bubble {100 * measured:.0f}% of the busiest stage's step with "
                f"{m} micro-batches on {pp} stages (formula {100 * analytic:.0f}%)",
                [mfield(d, "pp_bubble"), *fields],
            ))  # fmt: skip
        elif measured is None and analytic >= PP_BUBBLE:
            out.append(finding(
                d, "pp-bubble", "weak",
                f"{m} micro-batches on {pp} stages: the formula gives a {100 * analytic:.0f}% "
                "bubble (not measured in this document)",
                fields,
            ))  # fmt: skip
    return out


def detect_straggler(docs: list[Doc]) -> list[Finding]:
    out: list[Finding] = []
    for d in ok_docs(docs):
        doc = d.doc
        late, step, rank = (mval(doc, n) for n in ("straggler_lateness", "step_time",
                                                    "straggler_rank"))  # fmt: skip
        if late is None or not step or rank is None:
            continue
        frac = late / step
        if frac >= STRAGGLER_FRACTION:
            out.append(finding(
                d, "straggler", "strong" if frac >= 3 * STRAGGLER_FRACTION else "moderate",
                f"rank {rank:.0f} arrives {fmt(late, 's')} late at the collectives "
                f"({100 * frac:.0f}% of a {fmt(step, 's')} step); the others wait for it",
                [mfield(d, "straggler_rank"), mfield(d, "straggler_lateness"), mfield(d, "step_time")],
            ))  # fmt: skip
    return out


def detect_moe_skew(docs: list[Doc]) -> list[Finding]:
    out: list[Finding] = []
    for d in ok_docs(docs):
        doc = d.doc
        excess, load = mval(doc, "slowest_rank_excess"), mval(doc, "rank_load_max_over_mean")
        if excess is None or load is None:
            continue
        if excess >= MOE_EXCESS_PCT and load >= MOE_LOAD_RATIO:
            rank = mval(doc, "slowest_rank")
            per = mper(doc, "rank_load_max_over_mean")
            out.append(finding(
                d, "moe-skew", "strong" if excess >= 2 * MOE_EXCESS_PCT else "moderate",
                f"rank {rank:.0f} is the slowest, +{excess:.0f}% over the mean; its routed load is "
                f"{load:.2f}x the mean" + (f" (per rank {[int(x) for x in per]})" if per else "")
                + f"; workload {doc.workload.get('name', '?')}",
                [mfield(d, "slowest_rank"), mfield(d, "slowest_rank_excess"),
                 mfield(d, "rank_load_max_over_mean")],
            ))  # fmt: skip
    return out


CASES: list[Case] = [
    Case(
        id="pp-bubble",
        title="pipeline bubble from too few micro-batches",
        symptom="pipeline-parallel run far from the ideal speed-up; stages idle at the start and "
        "end of each step",
        evidence="model-internal runs with layout.mesh.pp > 1: metrics.pp_bubble (idle fraction "
        f"of the busiest stage) >= {PP_BUBBLE:.2f}, beside workload.microbatches and the formula "
        "(p-1)/(v*m+p-1)",
        explanation="A pipeline of p stages fills and drains every step: the first stage waits "
        "p-1 slots for the last to finish its backward. With m micro-batches the idle share is "
        "(p-1)/(m+p-1) for GPipe and 1F1B (1F1B only lowers the memory); interleaving v virtual "
        "stages divides it by v.",
        try_="raise the micro-batch count to >= 4x the stages (same global batch, smaller "
        "micro-batches); use interleaved 1F1B (vpp > 1) or zero-bubble schedules; balance the "
        "stages (first/last carry the embedding and head)",
        detector=detect_pp_bubble,
        reproduce="cpu",
        reproduce_note="PP2 1F1B on the tiny model with 2 micro-batches against 16 (2 gloo ranks)",
        terms=("bubble", "PP"),
    ),
    Case(
        id="straggler",
        title="a straggler rank",
        symptom="every rank waits in the same collective for one late rank",
        evidence="profiles: metrics.straggler_rank, straggler_lateness (mean lateness at the "
        f"collectives) >= {100 * STRAGGLER_FRACTION:.0f}% of step_time",
        explanation="A collective finishes when its last rank arrives. One slow rank (thermal "
        "throttling, a noisy neighbour, an uneven shard or data loader, host-side Python work) "
        "makes all others idle; the time shows up as communication on the fast ranks.",
        try_="compare per-rank compute in the merged timeline (`parlab profile` artifacts); check "
        "nvidia-smi clocks/throttle reasons and CPU affinity; balance the data per rank; keep "
        "logging and checkpoint I/O off the critical path or on one rank after the step",
        gpu_timing=True,
        detector=detect_straggler,
        reproduce="none",
        reproduce_note="no reproduction yet",
        terms=("straggler",),
    ),
    Case(
        id="moe-skew",
        title="MoE load skew makes one rank the slowest",
        symptom="expert-parallel layer time set by one rank; all-to-all busbw below the plain "
        "all-to-all",
        evidence="MoE workload documents: metrics.slowest_rank, slowest_rank_excess (% over the "
        f"mean) >= {MOE_EXCESS_PCT:.0f}% with rank_load_max_over_mean >= {MOE_LOAD_RATIO:.2f}",
        explanation="The router sends tokens where the gate scores are high; popular experts get "
        "more tokens, and the rank hosting them computes longer while the others wait in the "
        "combine all-to-all. With a capacity factor the excess is dropped instead (overflow), "
        "which costs quality.",
        try_="a load-balancing loss (aux loss) or DeepSeek's aux-loss-free bias; spread hot "
        "experts over ranks (round-robin placement); a capacity factor of 1.25-2 with the "
        "overflow rate watched; more experts per rank to average the load",
        detector=detect_moe_skew,
        reproduce="cpu",
        reproduce_note="`parlab project moe` with Zipf 1.5 routing (hot experts on rank 0) "
        "against uniform routing (2 gloo ranks)",
        terms=("EP", "capacity factor"),
    ),
]
