"""The case collection: why a multi-GPU run is not faster, as data.

Each ``Case`` is a symptom, the document fields that show it, a detector, the
explanation and what to try. A detector reads contract documents only (what
``parlab`` commands wrote) and returns ``Finding`` objects naming the document,
the fields and the numbers it used, with a strength:

- ``strong``: a measured number crosses the case's threshold *and* a second
  measurement agrees (a healthy twin in the same sweep, or a setting that
  explains it);
- ``moderate``: one measured number crosses the threshold;
- ``weak``: a hint only (an analytic estimate, a setting without a measurement,
  a ratio close to the threshold, or a run too small to tell).

Nothing here crosses the wire: detectors are pure functions of the documents.
Thresholds are named constants below so the docs and the tests read the same
numbers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from parlab.contract import Document
from parlab.ledger.activations import bubble_fraction

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
PP_BUBBLE = 0.20
"""A pipeline bubble (idle fraction of the busiest stage) at or above this."""
STRAGGLER_FRACTION = 0.05
"""A rank late by this fraction of the step time."""
MOE_EXCESS_PCT = 20.0
"""The slowest rank's excess over the mean, %, in an expert-parallel layer."""
MOE_LOAD_RATIO = 1.20
"""... with its routed load this much above the mean."""
ACTIVATION_SHARE = 0.50
"""An OOM where activations are at least this share of the predicted peak."""
ROUTER_IMBALANCE = 1.05
"""Requests per replica: max / mean at or above this."""
ROUTER_TAIL_RATIO = 3.0
"""... with p99 TTFT at least this many times the median."""

NCCL_SLOW_VARS = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_ALGO", "NCCL_PROTO",
                  "NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL", "NCCL_IB_DISABLE")  # fmt: skip
PCIE_LINKS = ("PIX", "PXB", "PHB", "NODE", "SYS")
"""``nvidia-smi topo -m`` entries that mean a PCIe or host path (no NVLink)."""


@dataclass(frozen=True, kw_only=True)
class Doc:
    """A document as the detectors see it."""

    path: str
    """Its path relative to the results folder (what a finding cites)."""
    doc: Document
    """The parsed document."""


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One case shown by one document (or one pair of documents)."""

    case: str
    """The case id."""
    document: str
    """The document that shows it, relative to the results folder."""
    fields: list[str]
    """The fields read, each as ``field = value``."""
    strength: str
    """``strong``, ``moderate`` or ``weak`` (see the module docstring)."""
    summary: str
    """One line with the numbers."""
    evidence_level: str
    """The document's evidence level."""
    twins: list[str] = field(default_factory=list)
    """Other documents the finding compares with."""

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "document": self.document,
            "fields": list(self.fields),
            "strength": self.strength,
            "summary": self.summary,
            "evidence_level": self.evidence_level,
            "twins": list(self.twins),
        }


Detector = Callable[[list[Doc]], list[Finding]]


@dataclass(frozen=True, kw_only=True)
class Case:
    """One entry of the case collection."""

    id: str
    """Short id (``parlab doctor --reproduce ID``)."""
    title: str
    """The case in a few words."""
    symptom: str
    """What the user sees."""
    evidence: str
    """Which documents and fields show it."""
    explanation: str
    """Why it happens."""
    try_: str
    """What to try."""
    detector: Detector
    """Documents -> findings."""
    reproduce: str
    """``cpu``, ``gpu`` or ``none`` (where the reproduction runs)."""
    reproduce_note: str = ""
    """What the reproduction runs (or why there is none)."""
    terms: tuple[str, ...] = ()
    """Glossary terms that explain it (``parlab explain TERM``)."""
    gpu_timing: bool = False
    """True: only GPU documents are judged (on gloo CPU ranks comm and compute share the
    cores, so overlap and lateness say nothing about GPUs)."""


# ----- helpers ------------------------------------------------------------------------------


def mval(doc: Document, name: str) -> float | None:
    m = doc.metrics.get(name)
    return None if m is None or m.value is None else float(m.value)


def mper(doc: Document, name: str) -> list[float] | None:
    m = doc.metrics.get(name)
    if m is None or m.per_rank is None:
        return None
    return [float(v) for v in m.per_rank if v is not None]


def _fmt(v: float, unit: str = "") -> str:
    if unit == "B":
        from parlab.units import format_bytes

        return format_bytes(v)
    if unit == "s":
        from parlab.units import format_seconds

        return format_seconds(v)
    if unit == "B/s":
        return f"{v / 1e9:.1f} GB/s"
    return f"{v:.4g}{(' ' + unit) if unit else ''}"


def _f(d: Doc, name: str) -> str:
    m = d.doc.metrics[name]
    return f"metrics.{name}.value = {_fmt(float(m.value), m.unit) if m.value is not None else None}"


def _finding(d: Doc, case: str, strength: str, summary: str, fields: Iterable[str],
             twins: Iterable[str] = ()) -> Finding:  # fmt: skip
    return Finding(
        case=case,
        document=d.path,
        fields=list(fields),
        strength=strength,
        summary=summary,
        evidence_level=d.doc.evidence_level,
        twins=list(twins),
    )


def _ok(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if d.doc.status == "ok"]


def _sweep_group(d: Doc, docs: list[Doc]) -> list[Doc]:
    """The documents of the same profile sweep (``workload.sweep_run_id``)."""
    sid = d.doc.workload.get("sweep_run_id")
    if not sid:
        return []
    return [o for o in _ok(docs) if o is not d and o.doc.workload.get("sweep_run_id") == sid]


# ----- detectors ----------------------------------------------------------------------------


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
    for d in _ok(docs):
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
            fields = [_f(d, f"{o}.busbw_peak") for o, _, _ in low]
            fields.append(f"workload.link_bw = {_fmt(link or 0, 'B/s')}")
            if slow:
                fields.append(f"environment.variables: {var_txt}")
            out.append(_finding(
                d, "slow-link", "strong" if slow or len(low) > 1 else "moderate",
                f"{op} peaks at {bw / 1e9:.1f} GB/s busbw ({100 * bw / (link or 1):.0f}% of the "
                f"{(link or 0) / 1e9:.0f} GB/s link) at {_fmt(size, 'B')}; {len(low)} op(s) under "
                f"{100 * SLOW_LINK_FRACTION:.0f}%" + (f"; set: {var_txt}" if slow else ""),
                fields,
            ))  # fmt: skip
        elif slow:
            out.append(_finding(
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
            out.append(_finding(
                d, "slow-link", "moderate",
                f"GPUs joined by {'/'.join(sorted(paths))} (PCIe or host path, no NVLink) in "
                "environment.hardware.interconnect.matrix",
                [f"environment.hardware.interconnect.matrix contains {sorted(paths)}"],
            ))  # fmt: skip
            break
    return out


def detect_exposed_comm(docs: list[Doc]) -> list[Finding]:
    out: list[Finding] = []
    for d in _ok(docs):
        doc = d.doc
        pct = mval(doc, "exposed_comm_fraction")
        if pct is not None and pct >= EXPOSED_COMM_PCT:
            ov = mval(doc, "overlap_fraction")
            out.append(_finding(
                d, "exposed-comm", "strong" if pct >= 1.5 * EXPOSED_COMM_PCT else "moderate",
                f"{pct:.1f}% of the step is exposed communication "
                f"({_fmt(mval(doc, 'exposed_comm_time') or 0, 's')} of "
                f"{_fmt(mval(doc, 'step_time') or 0, 's')}; overlap {ov or 0:.0f}%)",
                [_f(d, "exposed_comm_fraction"), _f(d, "overlap_fraction"), _f(d, "step_time")],
            ))  # fmt: skip
            continue
        eff, step = mval(doc, "scaling_efficiency"), mval(doc, "step_time")
        comm = [n for n in doc.metrics if n.startswith("comm_time.")]
        if eff is None or step is None or not comm or eff >= 0.7:
            continue
        ct = sum(mval(doc, n) or 0.0 for n in comm)
        if ct / step >= EXPOSED_COMM_PCT / 100:
            out.append(_finding(
                d, "exposed-comm", "moderate",
                f"scaling efficiency {eff:.2f} with collectives taking {100 * ct / step:.0f}% of "
                "the step when replayed alone (an upper bound of the exposed part)",
                [_f(d, "scaling_efficiency"), *(_f(d, n) for n in comm), _f(d, "step_time")],
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
    for d in reversed(_ok(docs)):
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
    for d in _ok(docs):
        doc = d.doc
        cap, calls = _bucket_mb(doc), _calls(doc)
        nbytes, step = mval(doc, "comm_bytes_per_step"), mval(doc, "step_time")
        if cap is None or not calls or not nbytes or step is None:
            continue
        n_half, sweep = half_bandwidth_size(docs, doc.layout.get("backend"))
        limit = n_half or LATENCY_BOUND_BYTES
        if nbytes / calls >= limit:
            continue  # calls big enough to be bandwidth-bound: their number is not the problem
        twins = [o for o in _sweep_group(d, docs) if (_bucket_mb(o.doc) or 0) > cap]
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
                        _f(d, "comm_count_per_step"),
                        _f(d, "step_time"),
                        f"{big.path}: step_time = {_fmt(bstep, 's')}",
                    ]
                    if exp is not None and bexp is not None:
                        fields += [
                            _f(d, "exposed_comm_time"),
                            f"{big.path}: exposed_comm_time = {_fmt(bexp, 's')}",
                        ]
                    fields.append(f"latency-bound below {_fmt(limit, 'B')} "
                                  + (f"(all_reduce half-peak size, {sweep})" if sweep
                                     else "(default)"))  # fmt: skip
                    out.append(_finding(
                        d, "ddp-small-buckets", "strong",
                        f"bucket_cap_mb {cap:g}: {calls:.0f} all-reduces/step of "
                        f"{_fmt(nbytes / calls, 'B')} on average; step {_fmt(step, 's')}"
                        + (f", exposed comm {_fmt(exp, 's')}" if exp is not None else "")
                        + f" vs {_fmt(bstep, 's')}"
                        + (f", {_fmt(bexp, 's')}" if bexp is not None else "")
                        + f" with {bcalls:.0f} call(s) at {_bucket_mb(big.doc):g} MB",
                        fields, [big.path],
                    ))  # fmt: skip
                continue  # the twin says whether it matters here; it did not
        if calls >= 16 and nbytes / calls < SMALL_CALL_BYTES:
            out.append(_finding(
                d, "ddp-small-buckets", "weak",
                f"bucket_cap_mb {cap:g}: {calls:.0f} all-reduces/step of "
                f"{_fmt(nbytes / calls, 'B')} on average (latency-bound sizes; no larger-bucket "
                "twin to compare with)",
                [f"layout bucket = {cap:g} MB", f"{calls:.0f} calls, {_fmt(nbytes, 'B')}/step"],
            ))  # fmt: skip
    return out


def detect_fsdp_no_prefetch(docs: list[Doc]) -> list[Finding]:
    out: list[Finding] = []
    for d in _ok(docs):
        doc = d.doc
        if doc.layout.get("strategy") != "fsdp" or doc.layout.get("prefetch") is not False:
            continue
        step, pct = mval(doc, "step_time"), mval(doc, "exposed_comm_fraction")
        if step is None or pct is None:
            continue
        reshard = doc.layout.get("reshard_after_forward")
        twins = [o for o in _sweep_group(d, docs) if o.doc.layout.get("prefetch") is True
                 and o.doc.layout.get("reshard_after_forward") == reshard]  # fmt: skip
        tstep = mval(twins[0].doc, "step_time") if twins else None
        if tstep is not None and tstep <= step / SMALL_BUCKET_SLOWDOWN:
            out.append(_finding(
                d, "fsdp-no-prefetch", "strong",
                f"no prefetch: step {_fmt(step, 's')}, exposed comm {pct:.1f}%; with prefetch "
                f"{_fmt(tstep, 's')}",
                [_f(d, "step_time"), _f(d, "exposed_comm_fraction"), "layout.prefetch = false"],
                [twins[0].path],
            ))  # fmt: skip
        elif pct >= FSDP_EXPOSED_PCT and not (tstep is not None and tstep >= step):
            out.append(_finding(
                d, "fsdp-no-prefetch", "moderate",
                f"no prefetch and {pct:.1f}% of the step is exposed communication",
                [_f(d, "exposed_comm_fraction"), "layout.prefetch = false"],
            ))  # fmt: skip
    return out


def bubble_formula(pp: int, microbatches: int, vpp: int = 1) -> float:
    """Fill-and-drain idle fraction of a pipeline's step: (p-1) / (v*m + p-1)."""
    idle = bubble_fraction(pp, microbatches, vpp)
    return idle / (1 + idle)


def detect_pp_bubble(docs: list[Doc]) -> list[Finding]:
    out: list[Finding] = []
    for d in _ok(docs):
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
            out.append(_finding(
                d, "pp-bubble", "strong" if analytic >= PP_BUBBLE else "moderate",
                f"pipeline bubble {100 * measured:.0f}% of the busiest stage's step with "
                f"{m} micro-batches on {pp} stages (formula {100 * analytic:.0f}%)",
                [_f(d, "pp_bubble"), *fields],
            ))  # fmt: skip
        elif measured is None and analytic >= PP_BUBBLE:
            out.append(_finding(
                d, "pp-bubble", "weak",
                f"{m} micro-batches on {pp} stages: the formula gives a {100 * analytic:.0f}% "
                "bubble (not measured in this document)",
                fields,
            ))  # fmt: skip
    return out


def detect_straggler(docs: list[Doc]) -> list[Finding]:
    out: list[Finding] = []
    for d in _ok(docs):
        doc = d.doc
        late, step, rank = (mval(doc, n) for n in ("straggler_lateness", "step_time",
                                                    "straggler_rank"))  # fmt: skip
        if late is None or not step or rank is None:
            continue
        frac = late / step
        if frac >= STRAGGLER_FRACTION:
            out.append(_finding(
                d, "straggler", "strong" if frac >= 3 * STRAGGLER_FRACTION else "moderate",
                f"rank {rank:.0f} arrives {_fmt(late, 's')} late at the collectives "
                f"({100 * frac:.0f}% of a {_fmt(step, 's')} step); the others wait for it",
                [_f(d, "straggler_rank"), _f(d, "straggler_lateness"), _f(d, "step_time")],
            ))  # fmt: skip
    return out


def detect_moe_skew(docs: list[Doc]) -> list[Finding]:
    out: list[Finding] = []
    for d in _ok(docs):
        doc = d.doc
        excess, load = mval(doc, "slowest_rank_excess"), mval(doc, "rank_load_max_over_mean")
        if excess is None or load is None:
            continue
        if excess >= MOE_EXCESS_PCT and load >= MOE_LOAD_RATIO:
            rank = mval(doc, "slowest_rank")
            per = mper(doc, "rank_load_max_over_mean")
            out.append(_finding(
                d, "moe-skew", "strong" if excess >= 2 * MOE_EXCESS_PCT else "moderate",
                f"rank {rank:.0f} is the slowest, +{excess:.0f}% over the mean; its routed load is "
                f"{load:.2f}x the mean" + (f" (per rank {[int(x) for x in per]})" if per else "")
                + f"; workload {doc.workload.get('name', '?')}",
                [_f(d, "slowest_rank"), _f(d, "slowest_rank_excess"),
                 _f(d, "rank_load_max_over_mean")],
            ))  # fmt: skip
    return out


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
            out.append(_finding(
                d, "oom-activations", "strong" if share >= 0.7 else "moderate",
                f"out of memory; the ledger puts activations at {100 * share:.0f}% of the "
                f"predicted peak {_fmt(float(peak.value), 'B')} (states the rest)",
                ["failure.kind = oom", f"predictions.peak_memory = {_fmt(float(peak.value), 'B')}",
                 f"activations (peak - state_bytes.*) = {_fmt(a, 'B')}"],
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
            out.append(_finding(
                d, "memory-held-elsewhere", "strong",
                f"out of memory while another process held {m.group(1)} on the same GPU "
                f"(rank {f.rank})",
                [f"failure.message: ...{m.group(0)}..."],
            ))  # fmt: skip
    return out


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
        out.append(_finding(
            d, "collective-timeout", "strong" if collective else "weak",
            ("a collective timed out" if collective else "the run was stopped at its deadline "
             "(a hang or just slow: the document cannot tell)")
            + (f" (rank {f.rank})" if f.rank is not None else "") + f": {f.message[:120]}",
            ["failure.kind = timeout", f"failure.message = {f.message[:160]!r}"],
        ))  # fmt: skip
    return out


def detect_tp_across_nodes(docs: list[Doc]) -> list[Finding]:
    out: list[Finding] = []
    for d in _ok(docs):
        doc = d.doc
        tp = int((doc.layout.get("mesh") or {}).get("tp") or 1)
        hw = doc.environment.get("hardware") or {}
        hosts = int(hw.get("host_count") or 1)
        local = int(hw.get("gpu_count") or 0)
        if tp > 1 and hosts > 1 and local and tp > local:
            out.append(_finding(
                d, "tp-across-nodes", "strong",
                f"tensor parallel degree {tp} is larger than the {local} GPUs of one host "
                f"({hosts} hosts): every layer's all-reduce crosses the network",
                [f"layout.mesh.tp = {tp}", f"environment.hardware.gpu_count = {local}",
                 f"environment.hardware.host_count = {hosts}"],
            ))  # fmt: skip
    return out


def detect_router_imbalance(docs: list[Doc]) -> list[Finding]:
    out: list[Finding] = []
    serving = [d for d in _ok(docs) if mper(d.doc, "requests_per_replica")]
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
        out.append(_finding(
            d, "router-imbalance", strength,
            f"router {doc.layout.get('policy', '?')}: requests per replica {[int(x) for x in per]} "
            f"(max/mean {imb:.2f}), p99 TTFT {p99:.0f} ms = {tail:.1f}x the median"
            + (f"; a balanced policy on the same trace had p99 "
               f"{min(mval(o.doc, 'p99_ttft_ms') or 0 for o in better):.0f} ms" if better else ""),
            [_f(d, "requests_per_replica"), _f(d, "p99_ttft_ms"), _f(d, "median_ttft_ms")],
            [o.path for o in better],
        ))  # fmt: skip
    return out


# ----- the collection -----------------------------------------------------------------------

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

BY_ID: dict[str, Case] = {c.id: c for c in CASES}
