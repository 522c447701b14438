"""The report's figures about routing and time: TTFT and TPOT tails by routing policy, the
MoE load of every expert with the slowest rank, and the overlap timeline of profiled steps."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean

from parlab.contract import Document
from parlab.report.blocks import Image
from parlab.report.figures import main_level
from parlab.report.groups import configs, job_title, jobs, main_job
from parlab.report.plots_comm import PHASES, StepRow, step_timeline
from parlab.report.plots_routing import STATS, LoadPanel, TailRow, expert_load, tail_rows

_PCT = {"p50": "median", "p90": "p90", "p99": "p99"}


def serving(docs: Sequence[Document]) -> Image | None:
    """p50 / p90 / p99 of TTFT and TPOT for each policy of the job with the most policies."""
    runs = [d for d in docs if d.role != "decision" and d.metric("p99_ttft_ms") is not None]
    level = main_level(runs)
    job = main_job([d for d in runs if d.evidence_level == level], lambda d: True)
    if not job:
        return None
    rows = []
    for c in configs(job):
        values = tuple(
            tuple(c.spread(f"{_PCT[stat]}_{kind}_ms") for stat, _ in STATS)
            for kind in ("ttft", "tpot")
        )
        rows.append(
            TailRow(
                label=f"{c.label}" + (f"  x{len(c.docs)}" if len(c.docs) > 1 else ""), values=values
            )
        )
    rows.sort(key=lambda r: r.values[0][-1].median if r.values[0][-1] else 0.0)
    first = rows[0]
    p99 = first.values[0][-1]
    return Image(
        key="serving",
        alt=f"TTFT and TPOT percentiles for {len(rows)} routing policies on one request trace; "
        f"the lowest p99 TTFT is {first.label.split()[0]}"
        + (f" at {p99.median:.1f} ms." if p99 else "."),
        title="Serving: TTFT and TPOT tails by routing policy",
        caption=f"Evidence level: {level}. One request trace ({job_title(job[0])}), "
        f"{len(job)} runs. Markers: the median, p90 and p99 of each run, the median over the "
        "policy's repeats (xN); grey: from the median to p99 (the tail); the black whisker under "
        "p99 spans its repeats. TTFT = time to the first token (queueing + prefill); TPOT = "
        "(end-to-end latency - TTFT) / (output tokens - 1), vLLM's definitions. Sorted by p99 "
        "TTFT.",
        svg=tail_rows(job_title(job[0]), rows, ("TTFT", "TPOT")),
        levels=(level,) if level else (),
    )


def _ints(v: object) -> tuple[int, ...] | None:
    if isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v):
        return tuple(int(x) for x in v)
    return None


def _load_panel(d: Document, job: str) -> LoadPanel | None:
    routed = _ints(d.workload.get("per_expert_routed"))
    if routed is None:
        return None
    placement = d.layout.get("expert_placement") or []
    owner = [0] * len(routed)
    for rank, experts in enumerate(placement):
        for e in experts if isinstance(experts, list) else []:
            if 0 <= e < len(owner):
                owner[e] = rank
    world = int(d.layout.get("world_size") or 1)
    cap = d.metric("capacity")
    rank_load = d.metrics.get("rank_load_max_over_mean") or None
    loads = (
        ", ".join(f"{int(v):,}" for v in (rank_load.per_rank or []) if v is not None)
        if (rank_load)
        else ""
    )
    slow, excess = d.metric("slowest_rank"), d.metric("slowest_rank_excess")
    note = (f"assignments per rank: {loads}; " if loads else "") + (
        f"slowest rank {int(slow)}: {excess:.1f} % over the mean time"
        if slow is not None and excess is not None
        else ""
    )
    overflow = d.metric("overflow_rate")
    title = (
        f"{d.workload.get('name') or d.workload.get('kind')} routing"
        + (f": {100 * overflow:.1f} % of assignments dropped" if overflow else "")
        + f"\n{job}"
    )
    return LoadPanel(
        title=title,
        routed=routed,
        kept=_ints(d.workload.get("per_expert_kept")),
        owner=tuple(owner),
        capacity=cap * world if cap else None,
        note=note,
    )


def moe(docs: Sequence[Document]) -> Image | None:
    """Per routing law of one job, tokens per expert (kept and dropped) and the slowest rank."""
    laws = [
        d
        for d in docs
        if d.workload.get("kind") in ("uniform", "zipf") and d.workload.get("per_expert_routed")
    ]
    level = main_level(laws)
    groups = sorted(
        jobs([d for d in laws if d.evidence_level == level]).values(),
        key=lambda g: (-len(configs(g)), g[-1].created),
    )[:2]
    panels = []
    for job in groups:
        for c in configs(job):
            if (p := _load_panel(c.docs[-1], job_title(job[0]))) is not None:
                panels.append(p)
    if not panels:
        return None
    return Image(
        key="moe",
        alt=f"Assignments routed to each expert under {len(panels)} routing law(s), coloured by "
        f"the rank that holds the expert; {panels[-1].title.replace(chr(10), ', ')}; "
        f"{panels[-1].note}.",
        title="MoE: load per expert and the slowest rank",
        caption=f"Evidence level: {level}. The newest run of each routing law, for the "
        f"{len(groups)} expert layout(s) with the most laws. "
        "A bar is the token-expert assignments routed to one expert (top-k counts each token k "
        "times), solid what it kept, pale what the capacity dropped; the dashed line is the "
        "capacity per expert summed over the source ranks. The rank holding the hot experts "
        "does the most expert compute and is the slowest rank; its excess is its time over the "
        "mean of the ranks.",
        svg=expert_load(panels),
        levels=(level,) if level else (),
    )


def _step_rows(d: Document) -> list[StepRow]:
    per_rank = d.workload.get("per_rank_steps")
    if not isinstance(per_rank, dict):
        return []
    out = []
    label = str(d.workload.get("label") or d.layout.get("strategy"))
    exposed = d.metric("exposed_comm_fraction")
    for i, (rank, steps) in enumerate(sorted(per_rank.items())):
        if not isinstance(steps, list) or not steps:
            continue

        def avg(key: str, steps: list = steps) -> float:
            return mean(float(s.get(key) or 0.0) for s in steps)

        overlap = avg("overlap_s")
        parts = (max(avg("compute_s") - overlap, 0.0), overlap, avg("exposed_s"), avg("idle_s"))
        note = f"exposed {exposed:.1f} % of the step" if i == 0 and exposed is not None else ""
        out.append(StepRow(label=f"{label} rank {rank}", parts=parts, note=note))
    return out


def overlap(docs: Sequence[Document]) -> Image | None:
    """For the newest profile sweep of each preset, every run's step per rank, as segments."""
    profiled = [d for d in docs if d.workload.get("per_rank_steps") and d.status == "ok"]
    level = main_level(profiled)
    sweeps: dict[str, list[Document]] = {}
    for d in profiled:
        if d.evidence_level == level and d.workload.get("sweep_run_id"):
            sweeps.setdefault(str(d.workload.get("preset")), []).append(d)
    sections = []
    for preset, group in sweeps.items():
        newest = group[-1].workload.get("sweep_run_id")
        runs = [d for d in group if d.workload.get("sweep_run_id") == newest]
        rows = [r for d in runs for r in _step_rows(d)]
        if rows:
            d0 = runs[0]
            sections.append(
                (
                    f"parlab profile {preset}: {d0.workload.get('model')}, batch "
                    f"{d0.workload.get('batch')}, seq {d0.workload.get('seq')}, "
                    f"{d0.layout.get('world_size')} ranks",
                    rows,
                )
            )
    if not sections:
        return None
    return Image(
        key="overlap",
        alt=f"Each profiled step split into compute alone, compute with communication hidden "
        f"under it, exposed communication and idle time, for {len(sections)} profile sweep(s).",
        title="Scheduling and overlap: where each rank's step went",
        caption=f"Evidence level: {level}. From each profile document's per-rank steps (means "
        "over the analysed steps): " + ", ".join(name for name, _ in PHASES) + ". Overlap = "
        "|comm and compute at once| / |comm| (Holistic Trace Analysis's definition); exposed = "
        "comm - overlap, the part that adds to the step. The segments are durations laid end to "
        "end, not the order on the trace: open each document's merged trace (its artifacts) in "
        "Perfetto for that.",
        svg=step_timeline(sections),
        levels=(level,) if level else (),
    )
