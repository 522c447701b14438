"""Serving cases: tails from an unbalanced router (thresholds, detector and entry)."""

from __future__ import annotations

from parlab.doctor.cases.base import (
    Case,
    Doc,
    Finding,
    finding,
    mfield,
    mper,
    mval,
    ok_docs,
)

ROUTER_IMBALANCE = 1.05
"""Requests per replica: max / mean at or above this."""
ROUTER_TAIL_RATIO = 3.0
"""... with p99 TTFT at least this many times the median."""


def detect_router_imbalance(docs: list[Doc]) -> list[Finding]:
    out: list[Finding] = []
    serving = [d for d in ok_docs(docs) if mper(d.doc, "requests_per_replica")]
    for d in serving:
        doc = d.doc
        per = mper(doc, "requests_per_replica") or []
        p99, med = mval(doc, "p99_ttft_ms"), mval(doc, "median_ttft_ms")
        if len(per) < 2 or not sum(per) or p99 is None or not med:
            continue
        imb = max(per) / (sum(per) / len(per))
        tail = p99 / med
        if imb < ROUTER_IMBALANCE or tail < ROUTER_TAIL_RATIO:
            continue
        key = (doc.workload.get("dataset"), doc.workload.get("seed"),
               doc.workload.get("request_rate"), doc.workload.get("num_requests"))  # fmt: skip
        twins = [o for o in serving if o is not d and (o.doc.workload.get("dataset"),
                 o.doc.workload.get("seed"), o.doc.workload.get("request_rate"),
                 o.doc.workload.get("num_requests")) == key]  # fmt: skip
        better = [o for o in twins if (mval(o.doc, "p99_ttft_ms") or 1e30) < p99
                  and max(mper(o.doc, "requests_per_replica") or [0]) < max(per)]  # fmt: skip
        strength = "moderate" if better and imb >= 1.2 else "weak"
        out.append(finding(
            d, "router-imbalance", strength,
            f"router {doc.layout.get('policy', '?')}: requests per replica {[int(x) for x in per]} "
            f"(max/mean {imb:.2f}), p99 TTFT {p99:.0f} ms = {tail:.1f}x the median"
            + (f"; a balanced policy on the same trace had p99 "
               f"{min(mval(o.doc, 'p99_ttft_ms') or 0 for o in better):.0f} ms" if better else ""),
            [mfield(d, "requests_per_replica"), mfield(d, "p99_ttft_ms"), mfield(d, "median_ttft_ms")],
            [o.path for o in better],
        ))  # fmt: skip
    return out


CASES: list[Case] = [
    Case(
        id="router-imbalance",
        title="serving tails from an unbalanced router",
        symptom="p99 TTFT several times the median while replicas are not saturated on average",
        evidence="serving documents: metrics.requests_per_replica (per replica) max/mean >= "
        f"{ROUTER_IMBALANCE:.2f} with p99_ttft_ms >= {ROUTER_TAIL_RATIO:g}x median_ttft_ms; "
        "stronger when a balanced policy on the same trace had a lower p99",
        explanation="A router that ignores load (random, hashing) lets queues build on one "
        "replica while another idles; requests behind the queue wait for prefill, which shows "
        "as the TTFT tail.",
        try_="least-outstanding-requests or power-of-two-choices routing; cache-aware routing "
        "with a load bound; compare policies with `parlab project serving`",
        detector=detect_router_imbalance,
        reproduce="none",
        reproduce_note="`parlab project serving` runs the policies side by side",
        terms=("TTFT", "goodput"),
    ),
]
