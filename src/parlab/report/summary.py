"""The report's answers: per project, the question, the baseline, the candidates, the failures
and the decision, one sentence each with its numbers, its evidence level and links to the
documents it rests on (their rows in the asset table).

Comparisons are like for like (``groups``): the baseline and the candidates are runs of one
job at one evidence level, repeats folded into a median and a range. The decision is read
from the project's newest ``decision`` document when there is one; otherwise the sentence says
there is none and names the best candidate among runs of the same job.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from parlab.contract import Document
from parlab.report.blocks import Badge, Inline, Link, Parts, doc_anchor
from parlab.report.format import fmt_value
from parlab.report.groups import Spread, configs, job_title, jobs, labels, main_job

QUESTIONS: dict[str, tuple[str, str]] = {
    "PAR-TRAINING-STATE": (
        "Training state",
        "How far does sharding params, grads and optimizer state (DDP, ZeRO-1/2/3, FSDP) cut "
        "memory per GPU, and what does it cost in throughput?",
    ),
    "PAR-MODEL-INTERNAL": (
        "Model internal",
        "What do tensor, pipeline and context parallelism buy over one GPU running the same "
        "batch, in speed and in memory per GPU?",
    ),
    "PAR-MOE-EXPERT": (
        "MoE",
        "What does skewed routing cost an expert-parallel layer: tokens dropped at the "
        "capacity, the slowest rank, the all-to-all's bandwidth?",
    ),
    "PAR-DISTRIBUTED-INFERENCE": (
        "Serving",
        "Which routing policy keeps the time-to-first-token and time-per-output-token tails "
        "lowest for the same requests?",
    ),
    "PAR-COLLECTIVES": (
        "Collectives",
        "What bus bandwidth and latency does each collective reach on this machine, against "
        "its links?",
    ),
}
"""Per project (in the order the summary answers them): its name and its question."""


@dataclass(frozen=True, kw_only=True)
class Answer:
    """One project's answer: named sentences (Question, Baseline, Candidates, ...)."""

    project: str
    title: str
    lines: tuple[tuple[str, Parts], ...]


def refs(docs: Sequence[Document], most: int = 3) -> Parts:
    """Links to the asset-table rows of ``docs`` (the run id's tail), ``+N`` beyond ``most``."""
    out: list[Inline] = [" ("]
    for i, d in enumerate(docs[:most]):
        out += [", " if i else "", Link(d.run_id.rsplit("-", 1)[-1], "#" + doc_anchor(d.run_id))]
    if len(docs) > most:
        out.append(f", +{len(docs) - most}")
    out.append(")")
    return tuple(out)


def level_of(docs: Sequence[Document]) -> Parts:
    levels = sorted({d.evidence_level for d in docs})
    return tuple(p for lvl in levels for p in (" ", Badge(lvl)))


def fmt_spread(s: Spread, unit: str, what: str = "runs") -> str:
    text = fmt_value(s.median, unit)
    if s.n > 1:
        text += f" (median of {s.n} {what}, {fmt_value(s.lo, unit)} to {fmt_value(s.hi, unit)})"
    return text


def unit_of(docs: Sequence[Document], metric: str) -> str:
    return next((d.metrics[metric].unit for d in docs if metric in d.metrics), "")


def is_probe(doc: Document) -> bool:
    """A calibration or a profile of a run: it measures an instrument or another run."""
    w = doc.workload or {}
    return str(w.get("kind") or "").endswith("-calibration") or "profiled_run_id" in w


def failures_line(docs: Sequence[Document], names: dict[str, str]) -> Parts:
    """How many runs failed, of what kind, and the first two messages."""
    runs = [d for d in docs if d.role != "decision"]
    failed = [d for d in runs if d.status == "failed" and d.failure is not None]
    if not failed:
        return (f"none of the {len(runs)} runs failed.",)
    kinds = Counter(d.failure.kind for d in failed if d.failure)
    text = (
        f"{len(failed)} of {len(runs)} runs failed ("
        + ", ".join(f"{n} {k}" for k, n in kinds.most_common())
        + ")"
    )
    parts: list[Inline] = [text]
    for d in failed[-2:]:
        f = d.failure
        assert f is not None
        msg = f.message if len(f.message) <= 150 else f.message[:147] + "..."
        rank = "" if f.rank is None else f" on rank {f.rank}"
        parts += [
            f"; {names.get(d.run_id, d.layout.get('strategy') or d.run_id)} "
            f"({job_title(d)}): {f.kind}{rank}: {msg}",
            *refs([d]),
        ]
    parts.append(".")
    return (*parts, *level_of(failed))


def decision_line(
    docs: Sequence[Document], best: tuple[str, Document] | Parts | None, names: dict[str, str]
) -> Parts:
    """The newest decision document (its chosen run named by ``names``, run id -> configuration);
    without one, ``best``: the best candidate of the job in words and its document, or the whole
    sentence."""
    decisions = [d for d in docs if d.role == "decision" and d.decision is not None]
    if decisions:
        dd = decisions[-1]
        dec = dd.decision
        assert dec is not None
        by_id = {d.run_id: d for d in docs}
        chosen = by_id.get(dec.chosen or "")
        name = names.get(dec.chosen or "") or (chosen.layout.get("strategy") if chosen else None)
        name = name or dec.chosen or "none"
        value = next(
            (
                f" ({k.removeprefix('chosen.')} {fmt_value(m.value, m.unit)})"
                for k, m in dd.metrics.items()
                if k.startswith("chosen.")
            ),
            "",
        )
        return (
            f"parlab decide ({dd.created[:16].replace('T', ' ')}) chose {name}{value} among "
            f"{len(dec.rests_on)} document(s), rejecting {len(dec.rejected)}",
            *refs([dd] + ([chosen] if chosen else [])),
            ".",
            *level_of([dd]),
        )
    if best is None:
        return ("no decision document, and no candidate to set against the baseline.",)
    if not (len(best) == 2 and isinstance(best[1], Document)):
        return best  # type: ignore[return-value]
    return (
        "no decision document (parlab decide writes one); among runs of the same job the best "
        f"is {best[0]}",
        *refs([best[1]]),
        ".",
        *level_of([best[1]]),
    )


def all_labels(grouped: dict[tuple[Any, ...], list[Document]]) -> dict[str, str]:
    """run id -> configuration name, each named inside its own job (``jobs``' groups)."""
    return {k: v for g in grouped.values() for k, v in labels(g).items()}


def pct(a: float, b: float) -> str:
    return f"{100 * (a - b) / b:+.1f} %" if b else "n/a"


def compare(
    project: str,
    docs: Sequence[Document],
    *,
    objective: str,
    higher: bool,
    also: str | None = None,
) -> Answer | None:
    """Baseline against candidates on one job: the answer shape of training and serving."""
    runs = [d for d in docs if d.role != "decision" and not is_probe(d)]
    grouped = jobs(runs)
    job = main_job(grouped, lambda d: d.metric(objective) is not None)
    title, question = QUESTIONS[project]
    if job is None:
        return None
    cfgs = [c for c in configs(job) if c.spread(objective) is not None]
    base = max(cfgs, key=lambda c: sum(d.role == "baseline" for d in c.docs))
    bs = base.spread(objective)
    assert bs is not None
    unit = unit_of(job, objective)
    others = sorted(
        (c for c in cfgs if c is not base),
        key=lambda c: c.spread(objective).median if c.spread(objective) else 0.0,
        reverse=higher,
    )
    line_base: list[Inline] = [
        f"{base.label} on {job_title(job[0])}: {objective} {fmt_spread(bs, unit)}"
    ]
    if also and (a := base.spread(also)) is not None:
        line_base.append(f", {also} {fmt_value(a.median, unit_of(job, also))}")
    cand: list[Inline] = [f"{len(others)} other configuration(s) of the same job: "]
    for i, c in enumerate(others[:4]):
        s = c.spread(objective)
        assert s is not None
        extra = (
            f", {also} {fmt_value(a.median, unit_of(job, also))}"
            if also and (a := c.spread(also)) is not None
            else ""
        )
        cand += [
            "; " if i else "",
            f"{c.label} {fmt_value(s.median, unit)} ({pct(s.median, bs.median)}{extra})",
            *refs([c.nearest(objective)], 1),
        ]
    if len(others) > 4:
        cand.append(f"; {len(others) - 4} more in the figures")
    rest = [g for g in grouped.values() if g[0].run_id != job[0].run_id]
    if rest:
        cand.append(
            f". {len(rest)} other job(s), {sum(map(len, rest))} run(s), are in the "
            "figures and the asset table"
        )
    best = None
    if others and (s0 := others[0].spread(objective)) is not None:
        best = (
            f"{others[0].label} at {fmt_value(s0.median, unit)} ({pct(s0.median, bs.median)} "
            f"against {base.label})",
            others[0].nearest(objective),
        )
    names = all_labels(grouped)
    return Answer(
        project=project,
        title=title,
        lines=(
            ("Question", (question,)),
            ("Baseline", (*line_base, *refs([base.nearest(objective)]), ".", *level_of(base.docs))),
            ("Candidates", (*cand, ".", *level_of(job))),
            ("Failures", failures_line(docs, names)),
            ("Decision", decision_line(docs, best, names)),
        ),
    )


Builder = Callable[[Sequence[Document]], Answer | None]


def answers(by_project: dict[str, list[Document]], builders: dict[str, Builder]) -> list[Answer]:
    """The answer of every project that has documents, in ``QUESTIONS`` order."""
    out = []
    for project in QUESTIONS:
        docs = by_project.get(project) or []
        if docs and (a := builders[project](docs)) is not None:
            out.append(a)
    return out
