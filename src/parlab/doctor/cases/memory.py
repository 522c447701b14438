"""Out-of-memory cases: activations rather than states, memory held by another process (their
thresholds, detectors and entries)."""

from __future__ import annotations

import re

from parlab.doctor.cases.base import (
    Case,
    Doc,
    Finding,
    finding,
    fmt,
)

ACTIVATION_SHARE = 0.50
"""An OOM where activations are at least this share of the predicted peak."""


_FOREIGN = re.compile(r"Process \d+ has ([\d.]+ [KMGT]iB) memory in use")


def detect_oom_activations(docs: list[Doc]) -> list[Finding]:
    out: list[Finding] = []
    for d in docs:
        doc = d.doc
        if doc.failure is None or doc.failure.kind != "oom":
            continue
        preds = doc.predictions
        peak = preds.get("peak_memory")
        states = [p for n, p in preds.items() if n.startswith("state_bytes.")]
        act = preds.get("activation_bytes")
        if peak is None or peak.value is None:
            continue
        if act is not None and act.value is not None:
            a = float(act.value)
        elif states:
            a = float(peak.value) - sum(float(p.value or 0) for p in states)
        else:
            continue
        share = a / float(peak.value)
        if share >= ACTIVATION_SHARE:
            out.append(finding(
                d, "oom-activations", "strong" if share >= 0.7 else "moderate",
                f"out of memory; the ledger puts activations at {100 * share:.0f}% of the "
                f"predicted peak {fmt(float(peak.value), 'B')} (states the rest)",
                ["failure.kind = oom", f"predictions.peak_memory = {fmt(float(peak.value), 'B')}",
                 f"activations (peak - state_bytes.*) = {fmt(a, 'B')}"],
            ))  # fmt: skip
    return out


def detect_foreign_memory(docs: list[Doc]) -> list[Finding]:
    out: list[Finding] = []
    for d in docs:
        f = d.doc.failure
        if f is None or f.kind != "oom":
            continue
        m = _FOREIGN.search(f.message)
        if m:
            out.append(finding(
                d, "memory-held-elsewhere", "strong",
                f"out of memory while another process held {m.group(1)} on the same GPU "
                f"(rank {f.rank})",
                [f"failure.message: ...{m.group(0)}..."],
            ))  # fmt: skip
    return out


CASES: list[Case] = [
    Case(
        id="oom-activations",
        title="out of memory from activations rather than states",
        symptom="CUDA out of memory during forward/backward although params, grads and optimizer "
        "state fit",
        evidence="failed documents with failure.kind = oom and the ledger's predictions "
        f"(peak_memory, state_bytes.*, activation_bytes): activations >= "
        f"{100 * ACTIVATION_SHARE:.0f}% of the predicted peak",
        explanation="Sharding (ZeRO/FSDP) divides states by the data-parallel degree but leaves "
        "each rank's activations as they were: they grow with micro-batch x sequence x hidden x "
        "layers. Past a few thousand tokens per GPU they dominate the peak.",
        try_="activation checkpointing (`parlab train --recompute selective|full`); smaller "
        "micro-batch with gradient accumulation; sequence/context parallelism for long "
        "sequences; check `parlab fit` for the breakdown before launching",
        detector=detect_oom_activations,
        reproduce="cpu",
        reproduce_note="`parlab train` DDP on the tiny model at a long sequence with a memory cap "
        "under the predicted peak; the healthy twin uses full recompute under the same cap",
        terms=("recompute", "ZeRO"),
    ),
    Case(
        id="memory-held-elsewhere",
        title="out of memory because another process holds the GPU",
        symptom="CUDA out of memory far below the model's need",
        evidence="failure.kind = oom with 'Process N has X GiB memory in use' in failure.message",
        explanation="The allocator's message lists the other processes on the GPU: a previous "
        "run's ranks that did not exit (a timed-out launch, a zombie worker) or another job.",
        try_="nvidia-smi --query-compute-apps=pid,used_memory --format=csv; stop the leftover "
        "ranks (by pid) before the next launch; parlab's launcher stops every rank on timeout",
        detector=detect_foreign_memory,
        reproduce="none",
        reproduce_note="needs a GPU held by another process",
        terms=(),
    ),
]
