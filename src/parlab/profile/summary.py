"""From per-rank profiles to run-level figures: means, stragglers, hotspots and what to try.

No I/O and no process group: ``summarize`` takes a ``RunProfile`` and returns
plain numbers; ``hotspot_text`` turns them into a few lines a person reads.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from parlab.profile.profiles import RunProfile
from parlab.units import format_bytes, format_seconds

SMALL_MESSAGE_BYTES = 4 * 1024 * 1024
"""Collectives averaging less than this are latency-bound: fewer, bigger ones help."""


@dataclass(frozen=True, kw_only=True)
class Hotspot:
    """One collective's totals over all analysed ranks and steps."""

    name: str
    """Normalised collective."""
    count_per_step: float
    """How many run per step on one rank (mean over ranks)."""
    bytes_per_step: float | None
    """Payload per step on one rank; ``None`` when unknown."""
    time_per_step_s: float
    """Its time per step on one rank."""
    exposed_per_step_s: float
    """The part of it no compute covers, per step on one rank."""
    advice: str
    """What to try."""


@dataclass(frozen=True, kw_only=True)
class Summary:
    """Run-level figures (means over ranks of per-step means)."""

    steps: list[int]
    """Steps analysed."""
    step_time_s: list[float]
    """Per rank: mean step window."""
    compute_s: list[float]
    """Per rank: mean compute time per step."""
    comm_s: list[float]
    """Per rank: mean communication time per step."""
    overlap_s: list[float]
    """Per rank: mean overlapped communication per step."""
    exposed_s: list[float]
    """Per rank: mean exposed communication per step."""
    idle_s: list[float]
    """Per rank: mean idle time per step."""
    comm_count: list[float]
    """Per rank: collectives per step."""
    comm_bytes: list[float]
    """Per rank: payload per step."""
    overlap_pct: list[float | None]
    """Per rank: overlapped ÷ communication time, %; None without communication."""
    straggler_rank: int | None
    """The rank most often last to start its last collective of a step."""
    straggler_lateness_s: float | None
    """Mean over steps of (latest - earliest) start of the last collective."""
    straggler_by_step: list[dict[str, Any]]
    """Per step: straggler rank and lateness."""
    hotspots: list[Hotspot]
    """Collectives, most exposed first."""

    def mean(self, name: str) -> float | None:
        vals = [v for v in getattr(self, name) if v is not None]
        return sum(vals) / len(vals) if vals else None


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def advice_for(name: str, count: float, nbytes: float | None, exposed_frac: float) -> str:
    """A short suggestion for one collective (rule of thumb, stated as one)."""
    avg = (nbytes / count) if nbytes and count else None
    small = avg is not None and avg < SMALL_MESSAGE_BYTES
    if name == "all_reduce":
        if small and count > 2:
            return (
                f"many small all-reduces ({count:.3g} per step, {format_bytes(avg)} each): "
                "bigger DDP buckets (bucket_cap_mb) or fewer syncs (gradient accumulation "
                "with no_sync)"
            )
        if small:
            return (
                f"small all-reduce ({format_bytes(avg)}): latency-bound; sync less often "
                "(gradient accumulation with no_sync) or overlap it with backward"
            )
        if exposed_frac > 0.3:
            return "exposed gradient all-reduce: start it during backward (DDP buckets, smaller last bucket) or accumulate gradients to sync less often"
        return "mostly overlapped: little to gain; fewer syncs (gradient accumulation) if any"
    if name == "all_gather":
        if exposed_frac > 0.3:
            return "exposed parameter all-gather: FSDP prefetch (forward/backward prefetch), or reshard_after_forward=False for the last blocks"
        return "overlapped all-gather: keep prefetch on"
    if name == "reduce_scatter":
        if exposed_frac > 0.3:
            return "exposed gradient reduce-scatter: let it run under the next layer's backward (FSDP backward prefetch), or larger wrapping units"
        return "overlapped reduce-scatter: fine"
    if name == "all_to_all":
        return "all-to-all on the critical path: overlap dispatch with shared-expert compute, or cut the capacity factor"
    if name in ("send", "recv", "send_recv"):
        return "pipeline send/recv: more micro-batches or an interleaved schedule to hide it"
    if name == "broadcast":
        return "broadcast in the step: do it once at start-up instead of every step"
    if name == "barrier":
        return "barrier in the step: remove it (it only waits for the slowest rank)"
    return "overlap it with compute, or run it less often"


def summarize(run: RunProfile) -> Summary:
    """Means per rank, stragglers per step, hotspots across ranks."""
    ranks = run.ranks
    steps = sorted({s.step for r in ranks for s in r.steps})

    def per_rank(attr: str) -> list[float]:
        return [_mean([float(getattr(s, attr)) for s in r.steps]) for r in ranks]

    comm = per_rank("comm_s")
    overlap = per_rank("overlap_s")
    overlap_pct: list[float | None] = [
        100.0 * o / c if c > 0 else None for o, c in zip(overlap, comm, strict=True)
    ]
    # stragglers: per step, who starts the last collective last
    by_step: list[dict[str, Any]] = []
    for step in steps:
        starts = {
            r.rank: s.last_comm_start_us
            for r in ranks
            for s in r.steps
            if s.step == step and s.last_comm_start_us is not None
        }
        if len(starts) < 2:
            continue
        late = max(starts, key=lambda k: starts[k])
        lateness = (starts[late] - min(starts.values())) / 1e6
        by_step.append({"step": step, "rank": late, "lateness_s": lateness})
    straggler = None
    lateness_mean = None
    if by_step:
        counts = Counter(b["rank"] for b in by_step)
        straggler = max(counts, key=lambda k: (counts[k], -k))
        lateness_mean = _mean([b["lateness_s"] for b in by_step])
    # hotspots: per collective name, per step per rank
    agg: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0, 1.0])
    n_rank_steps = sum(len(r.steps) for r in ranks) or 1
    for r in ranks:
        for c in r.collectives:
            a = agg[c.name]
            a[0] += c.count
            a[1] += c.bytes
            a[2] += c.time_s
            a[3] += c.exposed_s
            if not c.bytes_known:
                a[4] = 0.0
    hotspots = []
    for name, a in agg.items():
        count = a[0] / n_rank_steps
        nbytes = a[1] / n_rank_steps if a[4] else None
        time = a[2] / n_rank_steps
        exposed = a[3] / n_rank_steps
        hotspots.append(
            Hotspot(
                name=name,
                count_per_step=count,
                bytes_per_step=nbytes,
                time_per_step_s=time,
                exposed_per_step_s=exposed,
                advice=advice_for(name, count, nbytes, exposed / time if time > 0 else 0.0),
            )
        )
    hotspots.sort(key=lambda h: (-h.exposed_per_step_s, -h.time_per_step_s, h.name))
    return Summary(
        steps=steps,
        step_time_s=per_rank("window_s"),
        compute_s=per_rank("compute_s"),
        comm_s=comm,
        overlap_s=overlap,
        exposed_s=per_rank("exposed_s"),
        idle_s=per_rank("idle_s"),
        comm_count=per_rank("comm_count"),
        comm_bytes=per_rank("comm_bytes"),
        overlap_pct=overlap_pct,
        straggler_rank=straggler,
        straggler_lateness_s=lateness_mean,
        straggler_by_step=by_step,
        hotspots=hotspots,
    )


def hotspot_text(summary: Summary, run: RunProfile, *, title: str = "") -> str:
    """A short text: the figures, the top three hotspots and what to try."""
    lines = []
    if title:
        lines.append(title)
    n = len(run.ranks)
    st = summary.mean("step_time_s") or 0.0
    ex = summary.mean("exposed_s") or 0.0
    ov = summary.mean("overlap_pct")
    lines.append(
        f"{n} of {run.world_size} rank(s), steps {summary.steps}: step {format_seconds(st)}, "
        f"compute {format_seconds(summary.mean('compute_s') or 0.0)}, "
        f"communication {format_seconds(summary.mean('comm_s') or 0.0)} "
        f"(overlapped {'n/a' if ov is None else f'{ov:.1f}%'}), "
        f"exposed {format_seconds(ex)} ({100 * ex / st if st else 0:.1f}% of the step), "
        f"idle {format_seconds(summary.mean('idle_s') or 0.0)}"
    )
    if summary.straggler_rank is not None:
        lines.append(
            f"straggler: rank {summary.straggler_rank} starts its last collective "
            f"{format_seconds(summary.straggler_lateness_s or 0.0)} after the earliest rank "
            "(mean over steps)"
        )
    if not summary.hotspots:
        lines.append("no communication found in the profiled steps")
    else:
        lines.append("top hotspots (exposed communication per step and rank):")
    for i, h in enumerate(summary.hotspots[:3], 1):
        size = "payload unknown" if h.bytes_per_step is None else format_bytes(h.bytes_per_step)
        lines.append(
            f"  {i}. {h.name}: {h.count_per_step:.3g} per step, {size}, "
            f"{format_seconds(h.time_per_step_s)} ({format_seconds(h.exposed_per_step_s)} exposed)"
        )
        lines.append(f"     try: {h.advice}")
    kinds = run.ranks[0].compute_by_kind if run.ranks else {}
    total = sum(kinds.values())
    if total > 0:
        lines.append(
            f"compute by kind per step (rank {run.ranks[0].rank}, kernel time): "
            + ", ".join(
                f"{k} {format_seconds(v)} ({100 * v / total:.0f}%)" for k, v in kinds.items()
            )
        )
    for p in run.problems:
        lines.append(f"warning: {p.message}")
    return "\n".join(lines) + "\n"
