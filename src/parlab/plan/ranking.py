"""The ranking step of ``parlab decide``: one class of configurations -> a choice, or a tie.

Each configuration's value is the median of its qualifying repeats; configurations are
ordered by it. The best is *chosen* when its lead over the runner-up is outside both spreads
(``compare.inside_spread``), a *tie* when inside (nothing chosen), *unconfirmed* when a spread
is unknown; with a single configuration it is the *only one*. ``summary`` turns the ranking,
and the runs left out, into the decision document's ``layout.comparison`` and ``rejected``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from parlab.contract import Document
from parlab.plan.compare import (
    ABSENT,
    Config,
    Spread,
    inside_spread,
    knob_differences,
    knob_text,
    knob_value,
    lead,
    short,
    workload_differences,
    workload_label,
)
from parlab.report.format import fmt_value

_SOFTWARE_KEYS = ("python", "torch", "cuda", "nccl")


@dataclass(frozen=True, kw_only=True)
class Choice:
    """What ``decide`` was asked: the project's runs and how to compare them."""

    project: str
    docs: list[Document]
    """The runs to decide among (no decisions, no probes)."""
    probes: list[Document]
    """The probe documents left out."""
    compare: str
    """The knob (or group) named by ``--compare`` (or the project's default)."""
    compared: tuple[str, ...]
    """Knobs allowed to differ between ranked configurations."""
    across: tuple[str, ...]
    """The ``--across`` knobs the user named."""
    objective: tuple[str, bool]
    """(metric, higher is better)."""
    memory_budget: float | None


@dataclass(frozen=True, kw_only=True)
class Others:
    """The runs not ranked: other configurations of the workload, other workloads."""

    workload: list[Config]
    """Configurations of the decided workload that differ in more than the compared knobs."""
    workloads: list[list[Document]]
    """The runs of every other workload, one list each."""


@dataclass(frozen=True, kw_only=True)
class Row:
    """One ranked configuration."""

    config: Config
    label: str
    peak: float | None
    """Highest peak memory over its repeats (bytes)."""
    spread: Spread | None
    lead: float | None = None
    """How much the best configuration beats this one (fraction); None for the best."""
    inside: bool | None = None
    """Whether that lead is inside their spreads (None: a spread unknown)."""


@dataclass(frozen=True, kw_only=True)
class Ranking:
    """The decided class, best first (configurations without a value last)."""

    rows: list[Row]
    baseline: Row
    """The class's baseline: the configuration with the most ``baseline`` documents."""
    verdict: str
    """``chosen``, ``unconfirmed``, ``only-one``, ``tie`` or ``none``."""
    reason: str
    unit: str
    higher: bool
    rejected: list[dict[str, str]]
    """Runs of the class rejected on their own (failed, no metric, over memory)."""

    @property
    def chosen(self) -> Row | None:
        return self.rows[0] if self.verdict in ("chosen", "unconfirmed", "only-one") else None

    @property
    def chosen_run(self) -> str | None:
        """The chosen configuration's repeat nearest its median."""
        rep = self.chosen.config.representative if self.chosen else None
        return rep.run_id if rep else None

    @property
    def reference(self) -> Document:
        """The run the decision document describes: the chosen one, else the baseline's."""
        row = self.chosen or self.baseline
        return row.config.representative or row.config.docs[-1]


def rank(configs: Sequence[Config], choice: Choice) -> Ranking:
    """Qualify each configuration's repeats, order by median, and decide (module docstring)."""
    name, higher = choice.objective
    budget = choice.memory_budget
    labels = _labels(configs, choice)
    rows: list[Row] = []
    rejected: list[dict[str, str]] = []
    for c, label in zip(configs, labels, strict=True):
        peaks = [p for p in (peak_memory(d) for d in c.docs if d.status == "ok") if p is not None]
        peak = max(peaks) if peaks else None
        values = []
        for d in c.docs:
            why = _rejection(d, name, peak, budget)
            if why is None:
                values.append((d, float(d.metric(name))))  # type: ignore[arg-type]
            else:
                rejected.append({"candidate": d.run_id, **why})
        filled = Config(knobs=c.knobs, docs=c.docs, values=tuple(values))
        rows.append(Row(config=filled, label=label, peak=peak, spread=filled.spread(higher)))
    measured = sorted(
        (r for r in rows if r.config.median is not None),
        key=lambda r: r.config.median if higher else -r.config.median,  # type: ignore[operator]
        reverse=True,
    )
    if measured:
        best = measured[0]
        measured = [best] + [
            Row(
                config=r.config, label=r.label, peak=r.peak, spread=r.spread,
                lead=lead(best.config.median, r.config.median, higher),  # type: ignore[arg-type]
                inside=inside_spread(
                    best.spread, r.spread, best.config.median, r.config.median  # type: ignore[arg-type]
                ),
            )
            for r in measured[1:]
        ]  # fmt: skip
    rest = [r for r in rows if r.config.median is None]
    ordered = measured + rest
    baseline = max(ordered, key=lambda r: sum(d.role == "baseline" for d in r.config.docs))
    unit = metric_unit([d for c in configs for d in c.docs], name)
    verdict, reason = _verdict(measured, baseline, name, unit, higher, budget)
    return Ranking(
        rows=ordered, baseline=baseline, verdict=verdict, reason=reason, unit=unit,
        higher=higher, rejected=rejected,
    )  # fmt: skip


def _rejection(
    d: Document, name: str, peak: float | None, budget: float | None
) -> dict[str, str] | None:
    if d.status != "ok":
        f = d.failure
        assert f is not None
        where = "" if f.rank is None else f" on rank {f.rank}"
        return {"kind": f.kind, "reason": f"failed: {f.kind}{where}: {f.message}"}
    if d.metric(name) is None:
        return {"kind": "no-metric", "reason": f"no {name} measured"}
    if budget is not None and peak is not None and peak > budget:
        return {
            "kind": "over-memory",
            "reason": f"peak memory {peak / 1e9:.2f} GB (highest of its repeats) over the budget "
            f"{budget / 1e9:.2f} GB by {(peak - budget) / 1e9:.2f} GB",
        }
    return None


def _verdict(
    measured: list[Row], baseline: Row, name: str, unit: str, higher: bool, budget: float | None
) -> tuple[str, str]:
    if not measured:
        return "none", (
            f"no configuration qualifies: every run failed, has no {name}"
            + (", or is over the memory budget" if budget else "")
        )
    best = measured[0]
    head = (
        f"{best.label} has the {'highest' if higher else 'lowest'} {name}, {value_line(best, unit)}"
    )
    if len(measured) == 1:
        return (
            "only-one",
            f"{head}; it is the only configuration measured: nothing to rank it against",
        )
    runner = measured[1]
    assert runner.lead is not None
    pct = f"{100 * runner.lead:+.1f} %"
    if runner.inside:
        tied = [r.label for r in measured if r is best or r.inside]
        who = ", ".join(tied) if len(tied) <= 3 else f"{len(tied)} configurations"
        return "tie", (
            f"tie: the lead of {best.label} over {runner.label}, {pct}, is inside their spread: "
            f"not a decision ({who} tie); repeat them, or compare another knob"
        )
    vs_base = ""
    if baseline not in (best, runner) and baseline.config.median is not None:
        gain = lead(best.config.median, baseline.config.median, higher)  # type: ignore[arg-type]
        vs_base = f", {100 * gain:+.1f} % over the baseline {baseline.label}"
    if runner.inside is None:
        return "unconfirmed", (
            f"{head}; it leads {runner.label} by {pct}{vs_base}, but a spread is unknown (one "
            "repeat without step times): repeat both before relying on the order"
        )
    return "chosen", f"{head}; it leads {runner.label} by {pct}, outside their spread{vs_base}"


def value_line(row: Row, unit: str) -> str:
    """``median 45,580 tokens/s of 2 repeats (min-max of 2 repeats 44,664-46,496)``."""
    c = row.config
    text = f"median {fmt_value(c.median, unit)} of {len(c.values)} repeat(s)"
    if row.spread is not None:
        s = row.spread
        text += f" ({s.kind} {fmt_value(s.lo, unit)}-{fmt_value(s.hi, unit)})"
    return text


def _labels(configs: Sequence[Config], choice: Choice) -> list[str]:
    """Each configuration named by the fewest compared knobs that tell the class apart, in
    their order, and by every ``--across`` knob that varies (the knob named by ``--compare``
    by its value alone, unless on/off)."""

    def distinct(names: list[str]) -> int:
        return len({tuple(repr(knob_value(c.knobs, n)) for n in names) for c in configs})

    names: list[str] = []
    for n in choice.compared:
        if distinct([*names, n]) > distinct(names) or (n in choice.across and distinct([n]) > 1):
            names.append(n)
    names = names or [n for n in choice.compared if any(n in c.knobs for c in configs)][:1]
    out = []
    for c in configs:
        parts = []
        for n in names:
            v = knob_value(c.knobs, n)
            if n == choice.compare and not isinstance(v, bool):
                parts.append(knob_text(v))
            elif v != ABSENT or n in choice.across:
                parts.append(f"{n}={short(knob_text(v), 24)}")
        out.append(" ".join(parts) or "the configuration")
    return out


def summary(
    choice: Choice, ranking: Ranking, others: Others
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The decision's ``layout.comparison`` and ``rejected`` list (every run not chosen)."""
    name = choice.objective[0]
    unit = ranking.unit
    base = ranking.baseline
    chosen = ranking.chosen
    rejected = list(ranking.rejected)
    for r in ranking.rows:
        if r is chosen or r.config.median is None:
            continue
        tied = r.inside or r.lead is None
        where = {True: "inside", False: "outside", None: "spread unknown"}[r.inside]
        behind = (
            "tied for first: the lead between the best is inside their spread"
            if r.lead is None
            else f"{100 * r.lead:.1f} % behind {ranking.rows[0].label} ({where} their spread)"
        )
        for d, _ in r.config.values:
            rejected.append({
                "candidate": d.run_id, "kind": "tie" if tied else "slower",
                "reason": f"{r.label}: {name} {value_line(r, unit)}, {behind}",
            })  # fmt: skip
    fixed = sorted(
        {n for c in [*others.workload, base.config] for n in c.knobs} - set(choice.compared)
    )
    left_out = []
    for c in others.workload:
        diff = knob_differences(c.knobs, base.config.knobs, fixed) or ["knobs"]
        first = diff[0].split(" (", 1)[0]
        label = ", ".join(diff)
        left_out.append({"differs_in": diff, "runs": [d.run_id for d in c.docs]})
        for d in c.docs:
            rejected.append({
                "candidate": d.run_id, "kind": "incomparable",
                "reason": f"differs from {base.label} in {label}: not ranked "
                f"(--across {first} ranks it)",
            })  # fmt: skip
    ref = ranking.reference
    other = []
    for docs in others.workloads:
        diff = workload_differences(ref, docs[0])
        other.append({"workload": workload_label(docs[0]), "differs_in": diff[:6],
                      "runs": [d.run_id for d in docs]})  # fmt: skip
        for d in docs:
            rejected.append({
                "candidate": d.run_id, "kind": "incomparable",
                "reason": f"another workload than {ref.run_id}: " + "; ".join(diff[:4])
                + (" ..." if len(diff) > 4 else ""),
            })  # fmt: skip
    details = {
        "objective": name, "unit": unit, "higher_is_better": ranking.higher,
        "compare": choice.compare, "compared": list(choice.compared),
        "across": list(choice.across),
        "workload": workload_label(ref), "verdict": ranking.verdict,
        "baseline": base.label,
        "fixed": _equal_knobs([r.config for r in ranking.rows]),
        "configurations": [_row_json(r, ranking) for r in ranking.rows],
        "left_out": left_out, "other_workloads": other,
        "probes": [d.run_id for d in choice.probes],
    }  # fmt: skip
    return details, rejected


def _equal_knobs(configs: Sequence[Config]) -> dict[str, str]:
    """The knobs every configuration of the class shares, as text."""
    names = sorted({n for c in configs for n in c.knobs})
    return {
        n: knob_text(knob_value(configs[0].knobs, n))
        for n in names
        if len({repr(knob_value(c.knobs, n)) for c in configs}) == 1
    }


def _row_json(r: Row, ranking: Ranking) -> dict[str, Any]:
    c = r.config
    if r is ranking.chosen:
        status = "chosen"
    elif c.median is None:
        status = "rejected"
    elif ranking.verdict == "tie" and (r.lead is None or r.inside):
        status = "tie"
    else:
        status = "slower"
    spread = r.spread
    return {
        "label": r.label,
        "status": status,
        "median": c.median,
        "spread": None
        if spread is None
        else {"lo": spread.lo, "hi": spread.hi, "kind": spread.kind},
        "repeats": len(c.values),
        "runs": [d.run_id for d in c.docs],
        "values": [v for _, v in c.values],
        "lead_of_best_pct": None if r.lead is None else 100 * r.lead,
        "inside_spread": r.inside,
        "peak_memory": r.peak,
        "knobs": {k: knob_text(v) for k, v in sorted(c.knobs.items())},
    }


def environment_differences(ref: Document, doc: Document) -> list[str]:
    """Environment differences that do not exclude a document but must be stated."""
    out: list[str] = []
    ea, eb = ref.environment or {}, doc.environment or {}
    ha, hb = ea.get("hardware") or {}, eb.get("hardware") or {}
    for key in ("gpu_count", "host_count"):
        if ha.get(key) != hb.get(key):
            out.append(f"environment.hardware.{key}: {ha.get(key)} vs {hb.get(key)}")
    sa, sb = ea.get("software") or {}, eb.get("software") or {}
    for key in _SOFTWARE_KEYS:
        if sa.get(key) != sb.get(key):
            out.append(f"environment.software.{key}: {sa.get(key)} vs {sb.get(key)}")
    va, vb = ea.get("variables") or {}, eb.get("variables") or {}
    for key in sorted(set(va) | set(vb)):
        if va.get(key) != vb.get(key):
            out.append(f"environment.variables.{key}: {va.get(key)} vs {vb.get(key)}")
    return out


def metric_unit(docs: Sequence[Document], name: str) -> str:
    """The unit the documents give ``name`` (empty if none measured it)."""
    return next((d.metrics[name].unit for d in docs if name in d.metrics), "")


def peak_memory(doc: Document) -> float | None:
    """The run's highest peak memory over its ranks (bytes), None if not measured."""
    m = doc.metrics.get("peak_memory")
    if m is None:
        return None
    vals = [v for v in (m.per_rank or []) if v is not None]
    return max(vals) if vals else m.value
