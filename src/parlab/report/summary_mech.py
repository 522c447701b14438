"""The answers whose shape is not one baseline against its candidates on one job: model
internals (one job per cut, each against one GPU), MoE (routing laws against uniform routing)
and collectives (paths and ops against the link). ``BUILDERS`` maps every project to its
answer."""

from __future__ import annotations

from collections.abc import Sequence

from parlab.contract import Document
from parlab.report.blocks import Inline, Parts
from parlab.report.format import fmt_value
from parlab.report.groups import configs, job_title, jobs, labels, main_job
from parlab.report.summary import (
    QUESTIONS,
    Answer,
    Builder,
    all_labels,
    compare,
    decision_line,
    failures_line,
    fmt_spread,
    is_probe,
    level_of,
    pct,
    refs,
    unit_of,
)
from parlab.report.sweeps import curves, link_bw


def model_internal(docs: Sequence[Document]) -> Answer | None:
    """Per job (one cut: TP, PP, CP), the one-GPU run against the best split."""
    runs = [d for d in docs if d.role != "decision" and not is_probe(d)]
    base_parts: list[Inline] = ["one GPU runs each job's whole batch: "]
    cand_parts: list[Inline] = ["per job, the split with the largest speed-up over one GPU: "]
    best_all = None
    grouped = jobs(runs)
    for i, job in enumerate(g for g in grouped.values() if len(g) > 1):
        cfgs = configs(job)
        single = [c for c in cfgs if all(d.layout.get("world_size") == 1 for d in c.docs)]
        split = [c for c in cfgs if c not in single and c.spread("speedup_vs_single")]
        one = next((c for c in single if c.spread("tokens_per_s_per_gpu")), None)
        if one is None or not split:
            continue
        sep = "; " if i else ""
        s1, m1 = one.spread("tokens_per_s_per_gpu"), one.spread("peak_memory")
        assert s1 is not None
        mem1 = f" at {fmt_value(m1.median, 'B')}" if m1 else ""
        base_parts += [
            f"{sep}{job_title(job[0])}: {fmt_spread(s1, 'tokens/s')} per GPU{mem1}",
            *refs([one.nearest("tokens_per_s_per_gpu")], 1),
        ]
        best = max(split, key=lambda c: c.spread("speedup_vs_single").median)  # type: ignore[union-attr]
        sp, mem = best.spread("speedup_vs_single"), best.spread("peak_memory")
        assert sp is not None
        world = best.docs[0].layout.get("world_size") or 1
        mem_text = f", {fmt_value(mem.median, 'B')} per GPU" if mem else ""
        cand_parts += [
            f"{sep}{best.label} {sp.median:.2f}x ({100 * sp.median / world:.0f} % "
            f"scaling efficiency on {world} GPUs{mem_text})",
            *refs([best.nearest("speedup_vs_single")], 1),
        ]
        if best_all is None or sp.median > best_all[0]:
            best_all = (sp.median, best.label, best.nearest("speedup_vs_single"))
    if best_all is None:
        return compare("PAR-MODEL-INTERNAL", docs, objective="tokens_per_s_per_gpu", higher=True)
    title, question = QUESTIONS["PAR-MODEL-INTERNAL"]
    names = all_labels(grouped)
    return Answer(
        project="PAR-MODEL-INTERNAL",
        title=title,
        lines=(
            ("Question", (question,)),
            ("Baseline", (*base_parts, ".", *level_of(runs))),
            ("Candidates", (*cand_parts, ".", *level_of(runs))),
            ("Failures", failures_line(docs, names)),
            (
                "Decision",
                decision_line(
                    docs, (f"{best_all[1]} at {best_all[0]:.2f}x over one GPU", best_all[2]), names
                ),
            ),
        ),
    )


def _moe_numbers(c: object, job: Sequence[Document]) -> str:
    parts = []
    for metric, what in (
        ("slowest_rank_excess", "slowest rank over the mean"),
        ("overflow_rate", "assignments dropped"),
        ("a2a_busbw", "all-to-all busbw"),
        ("layer_time", "layer"),
    ):
        s = c.spread(metric)  # type: ignore[attr-defined]
        if s is not None:
            unit = unit_of(job, metric)
            value = f"+{s.median:.1f} %" if unit == "%" else fmt_value(s.median, unit)
            parts.append(f"{what} {value}")
    return ", ".join(parts)


def moe(docs: Sequence[Document]) -> Answer | None:
    """Uniform routing against each skewed law, in one job (one expert layout and capacity)."""
    runs = [
        d for d in docs if d.role != "decision" and d.workload.get("kind") in ("uniform", "zipf")
    ]
    job = main_job(runs, lambda d: d.metric("slowest_rank_excess") is not None)
    if job is None:
        return None
    cfgs = configs(job)
    base = next((c for c in cfgs if any(d.role == "baseline" for d in c.docs)), cfgs[0])
    others = [c for c in cfgs if c is not base]
    cand: list[Inline] = []
    for i, c in enumerate(others):
        cand += ["; " if i else "", f"{c.label}: {_moe_numbers(c, job)}", *refs([c.docs[-1]], 1)]
    title, question = QUESTIONS["PAR-MOE-EXPERT"]
    fallback: Parts = ("no decision document: a routing law is the workload, not a choice.",)
    timed = [(s.median, c) for c in others if (s := c.spread("layer_time")) is not None]
    if timed and (b := base.spread("layer_time")) is not None:
        t, c = max(timed, key=lambda tc: tc[0])
        excess = c.spread("slowest_rank_excess")
        fallback = (
            "no decision document: a routing law is the workload, not a choice; the costliest "
            f"law measured, {c.label}, makes the layer {pct(t, b.median)} slower than "
            f"{base.label} routing"
            + (f", its slowest rank {excess.median:.1f} % over the mean" if excess else ""),
            *refs([c.docs[-1]]),
            ".",
            *level_of(c.docs),
        )
    return Answer(
        project="PAR-MOE-EXPERT",
        title=title,
        lines=(
            ("Question", (question,)),
            (
                "Baseline",
                (
                    f"{base.label} routing on {job_title(job[0])}: {_moe_numbers(base, job)}",
                    *refs([base.docs[-1]]),
                    ".",
                    *level_of(base.docs),
                ),
            ),
            (
                "Candidates",
                (f"{len(others)} skewed law(s) on the same layer: ", *cand, ".", *level_of(job)),
            ),
            ("Failures", failures_line(docs, labels(job))),
            ("Decision", decision_line(docs, fallback, labels(job))),
        ),
    )


def collectives(docs: Sequence[Document]) -> Answer | None:
    """Each op's peak busbw on the default path against the link; the other paths' small-message
    time against the default's."""
    sweeps = [d for d in docs if d.workload.get("kind") == "collectives-sweep"]
    by_level: dict[str, list[Document]] = {}
    for d in sweeps:
        by_level.setdefault(d.evidence_level, []).append(d)
    if not by_level:
        return None
    level_docs = max(
        by_level.values(), key=lambda g: (g[0].evidence_level != "cpu-mechanism", len(g))
    )
    cs = curves(level_docs)
    link = link_bw(level_docs)
    default = [c for c in cs if c.path == "torch"]
    peak_parts: list[str] = []
    for c in sorted(default, key=lambda c: -max(s.median for s in c.busbw.values())):
        size, s = max(c.busbw.items(), key=lambda kv: kv[1].median)
        share = f" = {100 * s.median / link:.0f} % of the link" if link else ""
        peak_parts.append(f"{c.op} {s.median / 1e9:.0f} GB/s at {fmt_value(size, 'B')}{share}")
    small = [c for c in cs if c.op == "all_reduce" and c.time]
    smallest = min((min(c.time) for c in small), default=None)
    paths = []
    for c in sorted(
        small, key=lambda c: c.time.get(smallest or 0).median if smallest in c.time else 1.0
    ):
        if smallest in c.time:
            paths.append(f"{c.path} {c.time[smallest].median * 1e6:.1f} us")
    title, question = QUESTIONS["PAR-COLLECTIVES"]
    link_text = f" (link {link / 1e9:.0f} GB/s per direction)" if link else ""
    owners = [d for c in default for d in c.docs]
    return Answer(
        project="PAR-COLLECTIVES",
        title=title,
        lines=(
            ("Question", (question,)),
            (
                "Baseline",
                (
                    f"through torch's c10d, peak busbw per op{link_text}: " + "; ".join(peak_parts),
                    *refs(list({d.run_id: d for d in owners}.values())),
                    ".",
                    *level_of(level_docs),
                ),
            ),
            (
                "Candidates",
                (
                    f"{len({c.path for c in cs})} paths measured; the smallest "
                    f"all_reduce ({fmt_value(smallest or 0, 'B')}) takes " + ", ".join(paths),
                    *refs([d for c in small for d in c.docs[-1:]]),
                    ".",
                    *level_of(level_docs),
                ),
            ),
            ("Failures", failures_line(docs, {})),
            (
                "Decision",
                decision_line(docs, None, {})
                if any(d.role == "decision" for d in docs)
                else (
                    "no decision document: a sweep measures the machine; there is nothing to choose.",
                ),
            ),
        ),
    )


BUILDERS: dict[str, Builder] = {
    "PAR-TRAINING-STATE": lambda docs: compare(
        "PAR-TRAINING-STATE",
        docs,
        objective="tokens_per_s_per_gpu",
        higher=True,
        also="peak_memory",
    ),
    "PAR-MODEL-INTERNAL": model_internal,
    "PAR-MOE-EXPERT": moe,
    "PAR-DISTRIBUTED-INFERENCE": lambda docs: compare(
        "PAR-DISTRIBUTED-INFERENCE",
        docs,
        objective="p99_ttft_ms",
        higher=False,
        also="p99_tpot_ms",
    ),
    "PAR-COLLECTIVES": collectives,
}
"""Per project, the function that writes its answer."""
