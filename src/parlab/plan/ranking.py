"""The ranking step of ``parlab decide``: one class of configurations -> a choice, or a tie.

Each configuration's value is the median of its qualifying repeats; configurations are
ordered by it. The best is *chosen* when its lead over the runner-up is outside both spreads
(``compare.inside_spread``), a *tie* when inside (nothing chosen), *unconfirmed* when a spread
is unknown; with a single configuration it is the *only one*. ``decision_doc`` writes the
ranking, and the runs left out, into the decision document.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from parlab.contract import Document
from parlab.plan.compare import (
    ABSENT,
    Config,
    Spread,
    inside_spread,
    knob_text,
    knob_value,
    lead,
    short,
)
from parlab.report.format import fmt_value


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
            if (n == choice.compare and not isinstance(v, bool)) or n == "mesh":
                parts.append(knob_text(v))
            elif v != ABSENT or n in choice.across:
                parts.append(f"{n}={short(knob_text(v), 24)}")
        out.append(" ".join(parts) or "the configuration")
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
