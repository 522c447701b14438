"""The job across ranks and hosts: a collective that times out or hangs, tensor parallelism
spanning nodes (their detectors and entries)."""

from __future__ import annotations

import re

from parlab.doctor.cases.base import (
    Case,
    Doc,
    Finding,
    finding,
    ok_docs,
)

_WATCHDOG = re.compile(r"watchdog|timed out|timeout", re.I)
"""A crash whose message says the NCCL watchdog aborted the process on a timeout."""


def detect_timeout(docs: list[Doc]) -> list[Finding]:
    out: list[Finding] = []
    for d in docs:
        f = d.doc.failure
        if f is None or "budget" in f.message:
            continue  # a budget left unspent is not a hang
        if f.kind != "timeout" and not (f.kind == "crash" and _WATCHDOG.search(f.message)):
            continue
        collective = re.search(r"collective|allreduce|all_reduce|watchdog|gloo|nccl|barrier",
                               f.message, re.I)  # fmt: skip
        out.append(finding(
            d, "collective-timeout", "strong" if collective else "weak",
            ("a collective timed out" if collective else "the run was stopped at its deadline "
             "(a hang or just slow: the document cannot tell)")
            + (f" (rank {f.rank})" if f.rank is not None else "") + f": {f.message[:120]}",
            ["failure.kind = timeout", f"failure.message = {f.message[:160]!r}"],
        ))  # fmt: skip
    return out


def detect_tp_across_nodes(docs: list[Doc]) -> list[Finding]:
    out: list[Finding] = []
    for d in ok_docs(docs):
        doc = d.doc
        tp = int((doc.layout.get("mesh") or {}).get("tp") or 1)
        hw = doc.environment.get("hardware") or {}
        hosts = int(hw.get("host_count") or 1)
        local = int(hw.get("gpu_count") or 0)
        if tp > 1 and hosts > 1 and local and tp > local:
            out.append(finding(
                d, "tp-across-nodes", "strong",
                f"tensor parallel degree {tp} is larger than the {local} GPUs of one host "
                f"({hosts} hosts): every layer's all-reduce crosses the network",
                [f"layout.mesh.tp = {tp}", f"environment.hardware.gpu_count = {local}",
                 f"environment.hardware.host_count = {hosts}"],
            ))  # fmt: skip
    return out


CASES: list[Case] = [
    Case(
        id="collective-timeout",
        title="a collective timeout or hang",
        symptom="the job stops making progress, then dies after the process-group timeout",
        evidence="failed documents with failure.kind = timeout (a budget left unspent is not "
        "counted); failure.message naming the collective",
        explanation="A collective waits until every rank of its group joins. A rank that skipped "
        "it (a data-dependent branch, an exception swallowed, an uneven number of batches) or "
        "issued collectives in a different order leaves the others waiting until the timeout. "
        "NCCL's flight recorder (TORCH_FR_BUFFER_SIZE=N, formerly TORCH_NCCL_TRACE_BUFFER_SIZE, "
        "e.g. 2000, with "
        "TORCH_NCCL_DUMP_ON_TIMEOUT=1 and TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/tmp/nccl_trace_rank_) "
        "keeps the last N collectives per rank and dumps them on timeout.",
        try_="set the flight recorder variables, reproduce, then read the dumps with "
        "`python -m torch.distributed.flight_recorder.fr_trace <dump dir>`: the first collective "
        "whose sequence id some rank never reached, and that rank's stack, name the culprit; "
        "set a short timeout while debugging (init_process_group(timeout=...)); "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL checks collective order/shapes across ranks",
        detector=detect_timeout,
        reproduce="cpu",
        reproduce_note="2 gloo ranks where rank 1 skips one all-reduce (3 s group timeout) "
        "against both joining",
        terms=("flight recorder",),
    ),
    Case(
        id="tp-across-nodes",
        title="tensor parallelism spanning nodes",
        symptom="TP run many times slower on two hosts than on one",
        evidence="layout.mesh.tp larger than environment.hardware.gpu_count with host_count > 1",
        explanation="TP all-reduces (or all-gather + reduce-scatter with SP) activations twice "
        "per layer in forward and again in backward, on the critical path. Across hosts they "
        "go over the network at a tenth or less of NVLink bandwidth.",
        try_="keep TP inside one NVLink domain (tp <= GPUs per host); use PP or FSDP/DP across "
        "hosts; `parlab layout` and `parlab plan` put tp innermost",
        detector=detect_tp_across_nodes,
        reproduce="none",
        reproduce_note="needs two hosts",
        terms=("TP",),
    ),
]
