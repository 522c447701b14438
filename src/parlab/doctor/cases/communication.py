"""Communication cases: a slow link, exposed communication, DDP buckets too small, FSDP without
prefetch (their thresholds, detectors and entries)."""

from __future__ import annotations

from parlab.contract import Document
from parlab.doctor.cases.base import (
    Case,
    Doc,
    Finding,
    finding,
    fmt,
    mfield,
    mval,
    ok_docs,
    sweep_group,
)

SLOW_LINK_FRACTION = 0.40
"""busbw at the largest size below this fraction of the link peak: far below the topology."""
SLOW_LINK_MIN_SIZE = 64 * 2**20
"""Only sweeps that reach this size are judged (smaller sizes are latency-bound)."""
EXPOSED_COMM_PCT = 25.0
"""Exposed communication at or above this % of step time dominates."""
SMALL_BUCKET_SLOWDOWN = 1.10
"""A bucket setting this much slower than its largest-bucket twin (step time)."""
SMALL_BUCKET_CALLS_RATIO = 4.0
"""... while issuing at least this many times its twin's collectives."""
SMALL_BUCKET_EXPOSED_RATIO = 1.5
"""... or with this many times its twin's exposed communication (and at least 5% of the
twin's step more)."""
SMALL_CALL_BYTES = 256 * 2**10
"""Without a twin: calls smaller than this on average hint at latency-bound buckets."""
LATENCY_BOUND_BYTES = 2**20
"""Calls below this are latency-bound when no collectives sweep of the backend says where
the all_reduce reaches half its peak busbw."""
FSDP_EXPOSED_PCT = 10.0
"""FSDP without prefetch: exposed communication at or above this % of step time."""

NCCL_SLOW_VARS = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_ALGO", "NCCL_PROTO",
                  "NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL", "NCCL_IB_DISABLE")  # fmt: skip
PCIE_LINKS = ("PIX", "PXB", "PHB", "NODE", "SYS")
"""``nvidia-smi topo -m`` entries that mean a PCIe or host path (no NVLink)."""


def _link_peak(doc: Document) -> float | None:
    bw = doc.workload.get("link_bw")
    if bw:
        return float(bw)
    inter = (doc.environment.get("hardware") or {}).get("interconnect") or {}
    vals = [v for row in inter.get("per_direction_bw") or [] for v in row if v]
    return float(max(vals)) if vals else None


def _slow_vars(doc: Document) -> dict[str, str]:
    var = doc.environment.get("variables") or {}
    return {k: str(v) for k, v in var.items() if k in NCCL_SLOW_VARS}


def detect_slow_link(docs: list[Doc]) -> list[Finding]:
    out: list[Finding] = []
    for d in ok_docs(docs):
        doc = d.doc
        if doc.project != "PAR-COLLECTIVES" or doc.workload.get("kind") != "collectives-sweep":
            continue
        link = _link_peak(doc)
        slow = _slow_vars(doc)
        var_txt = ", ".join(f"{k}={v}" for k, v in slow.items())
        low: list[tuple[str, float, float]] = []
        for name in doc.metrics:
            if not name.endswith(".busbw_peak"):
                continue
            op = name.removesuffix(".busbw_peak")
            if op in ("all_to_all_uneven", "barrier"):
                continue  # uneven splits' busbw is not comparable with the link
            bw, size = mval(doc, name), mval(doc, f"{op}.busbw_peak_size")
            if bw is None or size is None or size < SLOW_LINK_MIN_SIZE or not link:
                continue
            if bw < SLOW_LINK_FRACTION * link:
                low.append((op, bw, size))
        if low:
            op, bw, size = min(low, key=lambda t: t[1])
            fields = [mfield(d, f"{o}.busbw_peak") for o, _, _ in low]
            fields.append(f"workload.link_bw = {fmt(link or 0, 'B/s')}")
            if slow:
                fields.append(f"environment.variables: {var_txt}")
            out.append(finding(
                d, "slow-link", "strong" if slow or len(low) > 1 else "moderate",
                f"{op} peaks at {bw / 1e9:.1f} GB/s busbw ({100 * bw / (link or 1):.0f}% of the "
                f"{(link or 0) / 1e9:.0f} GB/s link) at {fmt(size, 'B')}; {len(low)} op(s) under "
                f"{100 * SLOW_LINK_FRACTION:.0f}%" + (f"; set: {var_txt}" if slow else ""),
                fields,
            ))  # fmt: skip
        elif slow:
            out.append(finding(
                d, "slow-link", "weak",
                f"{var_txt} set while measuring (bandwidth not judged: "
                + ("no link peak known" if not link else "largest size below 64 MiB") + ")",
                [f"environment.variables: {var_txt}"],
            ))  # fmt: skip
    # a PCIe/host path between GPUs (any document with the matrix; report it once)
    for d in docs:
        inter = (d.doc.environment.get("hardware") or {}).get("interconnect") or {}
        matrix = inter.get("matrix") or []
        paths = {c for row in matrix for c in row if c in PCIE_LINKS}
        if paths:
            out.append(finding(
                d, "slow-link", "moderate",
                f"GPUs joined by {'/'.join(sorted(paths))} (PCIe or host path, no NVLink) in "
                "environment.hardware.interconnect.matrix",
                [f"environment.hardware.interconnect.matrix contains {sorted(paths)}"],
            ))  # fmt: skip
            break
    return out


def detect_exposed_comm(docs: list[Doc]) -> list[Finding]:
    out: list[Finding] = []
    for d in ok_docs(docs):
        doc = d.doc
        pct = mval(doc, "exposed_comm_fraction")
        if pct is not None and pct >= EXPOSED_COMM_PCT:
            ov = mval(doc, "overlap_fraction")
            out.append(finding(
                d, "exposed-comm", "strong" if pct >= 1.5 * EXPOSED_COMM_PCT else "moderate",
                f"{pct:.1f}% of the step is exposed communication "
                f"({fmt(mval(doc, 'exposed_comm_time') or 0, 's')} of "
                f"{fmt(mval(doc, 'step_time') or 0, 's')}; overlap {ov or 0:.0f}%)",
                [mfield(d, "exposed_comm_fraction"), mfield(d, "overlap_fraction"), mfield(d, "step_time")],
            ))  # fmt: skip
            continue
        eff, step = mval(doc, "scaling_efficiency"), mval(doc, "step_time")
        comm = [n for n in doc.metrics if n.startswith("comm_time.")]
        if eff is None or step is None or not comm or eff >= 0.7:
            continue
        ct = sum(mval(doc, n) or 0.0 for n in comm)
        if ct / step >= EXPOSED_COMM_PCT / 100:
            out.append(finding(
                d, "exposed-comm", "moderate",
                f"scaling efficiency {eff:.2f} with collectives taking {100 * ct / step:.0f}% of "
                "the step when replayed alone (an upper bound of the exposed part)",
                [mfield(d, "scaling_efficiency"), *(mfield(d, n) for n in comm), mfield(d, "step_time")],
            ))  # fmt: skip
    return out


def _bucket_mb(doc: Document) -> float | None:
    if "bucket_cap_mb" in doc.layout:
        return float(doc.layout["bucket_cap_mb"])
    knobs = doc.layout.get("knobs") or {}
    if doc.layout.get("strategy") in ("ddp", "ddp-bucket") and "bucket_mb" in knobs:
        return float(knobs["bucket_mb"])
    return None


def _calls(doc: Document) -> float | None:
    return mval(doc, "comm_count_per_step") or mval(doc, "comm_count_per_step.all_reduce")


def half_bandwidth_size(
    docs: list[Doc], backend: str | None, op: str = "all_reduce"
) -> tuple[float | None, str | None]:
    """The smallest measured ``op`` size reaching half its peak busbw, from the newest
    collectives sweep of the same backend in ``docs`` that brackets it (and that sweep's
    path): a sweep measured only above the half-peak point (e.g. 64 MiB - 1 GiB) cannot say
    where it lies, so it is passed over."""
    for d in reversed(ok_docs(docs)):
        w = d.doc.workload
        if w.get("kind") != "collectives-sweep" or d.doc.layout.get("backend") != backend:
            continue
        rows = [m for m in w.get("measurements") or [] if m.get("op") == op and m.get("busbw")]
        if not rows:
            continue
        peak = max(float(m["busbw"]) for m in rows)
        sizes = sorted(float(m["size"]) for m in rows if float(m["busbw"]) >= peak / 2)
        smallest = min(float(m["size"]) for m in rows)
        big_enough = max(float(m["size"]) for m in rows) >= SLOW_LINK_MIN_SIZE
        if sizes and big_enough and smallest < sizes[0]:
            return sizes[0], d.path
    return None, None


def detect_ddp_small_buckets(docs: list[Doc]) -> list[Finding]:
    out: list[Finding] = []
    for d in ok_docs(docs):
        doc = d.doc
        cap, calls = _bucket_mb(doc), _calls(doc)
        nbytes, step = mval(doc, "comm_bytes_per_step"), mval(doc, "step_time")
        if cap is None or not calls or not nbytes or step is None:
            continue
        n_half, sweep = half_bandwidth_size(docs, doc.layout.get("backend"))
        limit = n_half or LATENCY_BOUND_BYTES
        if nbytes / calls >= limit:
            continue  # calls big enough to be bandwidth-bound: their number is not the problem
        twins = [o for o in sweep_group(d, docs) if (_bucket_mb(o.doc) or 0) > cap]
        if twins:
            big = max(twins, key=lambda o: _bucket_mb(o.doc) or 0)
            bcalls, bstep = _calls(big.doc), mval(big.doc, "step_time")
            if bcalls and bstep and calls >= SMALL_BUCKET_CALLS_RATIO * bcalls:
                exp, bexp = mval(doc, "exposed_comm_time"), mval(big.doc, "exposed_comm_time")
                # slower: by step time, or by exposed communication (the direct cost, less
                # noisy than a 2-step step time on a shared host)
                by_exposed = (exp is not None and bexp is not None
                              and exp >= SMALL_BUCKET_EXPOSED_RATIO * bexp
                              and exp - bexp >= 0.05 * bstep)  # fmt: skip
                if step >= SMALL_BUCKET_SLOWDOWN * bstep or by_exposed:
                    fields = [
                        f"layout.bucket_cap_mb = {cap:g}",
                        mfield(d, "comm_count_per_step"),
                        mfield(d, "step_time"),
                        f"{big.path}: step_time = {fmt(bstep, 's')}",
                    ]
                    if exp is not None and bexp is not None:
                        fields += [
                            mfield(d, "exposed_comm_time"),
                            f"{big.path}: exposed_comm_time = {fmt(bexp, 's')}",
                        ]
                    fields.append(f"latency-bound below {fmt(limit, 'B')} "
                                  + (f"(all_reduce half-peak size, {sweep})" if sweep
                                     else "(default)"))  # fmt: skip
                    out.append(finding(
                        d, "ddp-small-buckets", "strong",
                        f"bucket_cap_mb {cap:g}: {calls:.0f} all-reduces/step of "
                        f"{fmt(nbytes / calls, 'B')} on average; step {fmt(step, 's')}"
                        + (f", exposed comm {fmt(exp, 's')}" if exp is not None else "")
                        + f" vs {fmt(bstep, 's')}"
                        + (f", {fmt(bexp, 's')}" if bexp is not None else "")
                        + f" with {bcalls:.0f} call(s) at {_bucket_mb(big.doc):g} MB",
                        fields, [big.path],
                    ))  # fmt: skip
                continue  # the twin says whether it matters here; it did not
        if calls >= 16 and nbytes / calls < SMALL_CALL_BYTES:
            out.append(finding(
                d, "ddp-small-buckets", "weak",
                f"bucket_cap_mb {cap:g}: {calls:.0f} all-reduces/step of "
                f"{fmt(nbytes / calls, 'B')} on average (latency-bound sizes; no larger-bucket "
                "twin to compare with)",
                [f"layout bucket = {cap:g} MB", f"{calls:.0f} calls, {fmt(nbytes, 'B')}/step"],
            ))  # fmt: skip
    return out


def detect_fsdp_no_prefetch(docs: list[Doc]) -> list[Finding]:
    out: list[Finding] = []
    for d in ok_docs(docs):
        doc = d.doc
        if doc.layout.get("strategy") != "fsdp" or doc.layout.get("prefetch") is not False:
            continue
        step, pct = mval(doc, "step_time"), mval(doc, "exposed_comm_fraction")
        if step is None or pct is None:
            continue
        reshard = doc.layout.get("reshard_after_forward")
        twins = [o for o in sweep_group(d, docs) if o.doc.layout.get("prefetch") is True
                 and o.doc.layout.get("reshard_after_forward") == reshard]  # fmt: skip
        tstep = mval(twins[0].doc, "step_time") if twins else None
        if tstep is not None and tstep <= step / SMALL_BUCKET_SLOWDOWN:
            out.append(finding(
                d, "fsdp-no-prefetch", "strong",
                f"no prefetch: step {fmt(step, 's')}, exposed comm {pct:.1f}%; with prefetch "
                f"{fmt(tstep, 's')}",
                [mfield(d, "step_time"), mfield(d, "exposed_comm_fraction"), "layout.prefetch = false"],
                [twins[0].path],
            ))  # fmt: skip
        elif pct >= FSDP_EXPOSED_PCT and not (tstep is not None and tstep >= step):
            out.append(finding(
                d, "fsdp-no-prefetch", "moderate",
                f"no prefetch and {pct:.1f}% of the step is exposed communication",
                [mfield(d, "exposed_comm_fraction"), "layout.prefetch = false"],
            ))  # fmt: skip
    return out


CASES: list[Case] = [
    Case(
        id="slow-link",
        title="collective bandwidth far below the topology peak",
        symptom="busbw of large all-reduces / all-gathers is a fraction of what the GPUs' links "
        "carry; every data-parallel step pays for it",
        evidence="PAR-COLLECTIVES sweep: metrics.<op>.busbw_peak at busbw_peak_size >= 64 MiB "
        f"against workload.link_bw (environment.hardware.interconnect.per_direction_bw); under "
        f"{100 * SLOW_LINK_FRACTION:.0f}% is far below. environment.variables (NCCL_P2P_DISABLE, "
        "NCCL_SHM_DISABLE, NCCL_ALGO, NCCL_PROTO, NCCL_P2P_LEVEL) and "
        "environment.hardware.interconnect.matrix (PIX/PXB/PHB/NODE/SYS = PCIe or host path)",
        explanation="NCCL picks its transport per GPU pair: NVLink peer-to-peer when it can, "
        "else PCIe peer-to-peer, else staging through host shared memory, else the network. "
        "NCCL_P2P_DISABLE=1 forces the host path; NCCL_SHM_DISABLE=1 forbids host shared memory "
        "(then sockets); a forced NCCL_ALGO/NCCL_PROTO can pick a ring/tree or the LL protocol "
        "where another is faster; GPUs without NVLink share PCIe switches and the CPU root "
        "complex. Each caps busbw far below the NVLink figure.",
        try_="unset the NCCL_* overrides and re-run `parlab collectives`; check "
        "`nvidia-smi topo -m` (NV# between the GPUs, not PHB/SYS); run with NCCL_DEBUG=INFO and "
        "read the 'via P2P/IPC' vs 'via SHM' lines; in containers, give the ranks the same IPC "
        "namespace (--ipc=host) so P2P/CUMEM works",
        detector=detect_slow_link,
        reproduce="gpu",
        reproduce_note="`parlab collectives` all_reduce/all_gather 1 MiB-1 GiB with "
        "NCCL_P2P_DISABLE=1 against the same sweep without it (needs 2 GPUs)",
        terms=("busbw", "algbw"),
    ),
    Case(
        id="exposed-comm",
        title="multi-GPU slower than expected: exposed communication dominates",
        symptom="more GPUs, little or no speed-up; the profile shows GPUs idle in collectives",
        evidence="profile documents: metrics.exposed_comm_fraction (% of step time) >= "
        f"{EXPOSED_COMM_PCT:.0f}% and overlap_fraction; model-internal runs: scaling_efficiency < "
        "0.7 with metrics.comm_time.<axis> >= 25% of step_time",
        explanation="Communication costs time only where nothing else runs beside it. DDP and "
        "FSDP overlap gradient reduction with backward; tensor parallelism's all-reduces sit on "
        "the critical path between two matmuls (nothing to overlap without async-TP), so at "
        "small per-GPU work the step becomes comm-bound.",
        try_="give each GPU more work per collective (larger micro-batch or sequence); keep TP "
        "inside the NVLink domain and as small as the memory allows; prefer FSDP/DP for the "
        "extra GPUs; enable overlap (DDP buckets, FSDP prefetch, async-TP / torch.compile "
        "micro-pipelining); re-run `parlab profile` and compare exposed_comm_fraction",
        gpu_timing=True,
        detector=detect_exposed_comm,
        reproduce="none",
        reproduce_note="shown by the GPU TP profiles (`parlab profile tp`); on CPU gloo, comm and "
        "compute share the cores, so the ratio says nothing about GPUs",
        terms=("exposed communication", "overlap", "TP"),
    ),
    Case(
        id="ddp-small-buckets",
        title="DDP buckets too small: many small all-reduces",
        symptom="DDP step slower than expected; the trace shows a long train of tiny all-reduces",
        evidence="DDP profile sweep (`parlab profile ddp-buckets`): layout.bucket_cap_mb, "
        "metrics.comm_count_per_step, comm_bytes_per_step, step_time, against the largest-"
        f"bucket twin of the same workload.sweep_run_id (>= {SMALL_BUCKET_CALLS_RATIO:g}x the "
        f"calls and >= {SMALL_BUCKET_SLOWDOWN:.2f}x the step time)",
        explanation="Each all-reduce pays a fixed latency (launch, synchronisation, protocol "
        "hand-shakes: tens of microseconds on NVLink, more on gloo or the network) before its "
        "bytes flow. Buckets far below the size where the link reaches half its bandwidth turn "
        "the gradient sync latency-bound: the same bytes, many more fixed costs.",
        try_="raise bucket_cap_mb (torch's default 25 MB; 100-250 MB for large models on fast "
        "links); check the all_reduce curve of `parlab collectives` for the size that reaches "
        "half the peak busbw; keep the first bucket small enough to start overlap early",
        detector=detect_ddp_small_buckets,
        reproduce="cpu",
        reproduce_note="`parlab profile ddp-buckets --buckets 0.01,25` on the tiny model, 2 gloo "
        "ranks; the healthy twin is the 25 MB run",
        terms=("bucket", "overlap"),
    ),
    Case(
        id="fsdp-no-prefetch",
        title="FSDP without prefetch",
        symptom="FSDP step slower than DDP at the same size; all-gathers start only when each "
        "layer is needed",
        evidence="FSDP profiles (`parlab profile fsdp`): layout.prefetch = false, "
        f"metrics.exposed_comm_fraction >= {FSDP_EXPOSED_PCT:.0f}%, or the prefetch twin of the "
        "same sweep (same reshard_after_forward) faster by >= 10%",
        explanation="FSDP all-gathers each unit's parameters before using them. With prefetch the "
        "next unit's all-gather is issued while this unit computes; without it, every unit "
        "waits for its own gather, and in backward the re-gather after reshard adds a second "
        "exposed wait.",
        try_="FSDP2: module.set_modules_to_forward_prefetch / set_modules_to_backward_prefetch "
        "(or rely on the implicit prefetch of the default stream order); FSDP1: "
        "forward_prefetch=True, backward_prefetch=BACKWARD_PRE; reshard_after_forward=False on "
        "the last blocks if memory allows",
        gpu_timing=True,
        detector=detect_fsdp_no_prefetch,
        reproduce="none",
        reproduce_note="the overlap needs a GPU's separate comm stream; `parlab profile fsdp` on "
        "GPUs writes the prefetch on/off pair",
        terms=("FSDP", "overlap"),
    ),
]
