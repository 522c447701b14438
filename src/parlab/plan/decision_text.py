"""A decision document as lines a person reads: one screen by default, everything on demand.

Rendered from the document alone (``layout.comparison``, ``decision``, ``metrics``), so any
decision in a results folder prints the same way. Default: the workload, what was compared,
the verdict, the top configurations with their median, spread, repeats and the best's lead,
and one line per kind of run left out (with counts and the flag that brings them in).
``details``: every configuration, every run left out and why, every note and prediction error.
"""

from __future__ import annotations

from collections import Counter
from statistics import median
from typing import Any

from parlab.contract import Document
from parlab.report.format import fmt_value

TOP_ROWS = 6
"""Configurations the default view ranks (the rest are counted)."""


def decision_lines(doc: Document, *, details: bool = False) -> list[str]:
    """The decision as lines (see the module docstring)."""
    cmp: dict[str, Any] = doc.layout.get("comparison") or {}
    dec = doc.decision
    assert dec is not None
    unit = str(cmp.get("unit", ""))
    lines = [f"workload: {cmp.get('workload', '?')}"]
    name = str(cmp.get("compare", ""))
    members = [k for k in cmp.get("compared") or [] if k != name]
    lines.append(f"compared: {name}" + (f" (with {', '.join(members)})" if members else ""))
    fixed = ", ".join(f"{k} {v}" for k, v in (cmp.get("fixed") or {}).items())
    if fixed:
        lines.append("equal: " + (fixed if details or len(fixed) <= 140 else fixed[:137] + "..."))
    if cmp.get("across"):
        lines.append(f"ranked across {', '.join(cmp['across'])}: these may differ too")
    lines.append(f"decision: {dec.reason}")
    if dec.chosen:
        lines.append(f"chosen run: {dec.chosen}")
    rows = cmp.get("configurations") or []
    lines += _table(rows if details else rows[:TOP_ROWS], unit)
    if not details and len(rows) > TOP_ROWS:
        lines.append(f"  ... {len(rows) - TOP_ROWS} more configuration(s) (--details)")
    lines += _rejected(dec.rejected, details)
    lines += _left_out(cmp, details)
    lines += _predictions(doc, str(cmp.get("objective", "")), details)
    if details:
        lines += [f"- {n}" for n in doc.notes]
    return lines


def _table(rows: list[dict[str, Any]], unit: str) -> list[str]:
    if not rows:
        return []
    labels = [str(r["label"]) for r in rows]
    w = max(13, *(len(x) for x in labels))
    out = [
        f"  {'#':>2}  {'configuration':<{w}}  {'median':>16}  {'spread':<34} {'n':>3}  best leads by"
    ]
    for i, (r, label) in enumerate(zip(rows, labels, strict=True), 1):
        s = r.get("spread")
        spread = (
            f"{_num(s['lo'], unit)}-{_num(s['hi'], unit)} ({s['kind'].split(' of ')[0]})"
            if s
            else ("unknown" if r.get("median") is not None else "")
        )
        lead = r.get("lead_of_best_pct")
        inside = {True: "inside spread", False: "outside spread", None: "spread unknown"}
        lead_text = "" if lead is None else f"{lead:+.1f} % ({inside[r.get('inside_spread')]})"
        if r["status"] == "rejected":
            lead_text = "rejected"
        med = fmt_value(r.get("median"), unit) if r.get("median") is not None else "-"
        out.append(
            f"  {i:>2}  {label:<{w}}  {med:>16}  {spread:<34} {r['repeats']:>3}  {lead_text}"
        )
    return out


def _num(v: float, unit: str) -> str:
    return fmt_value(v, unit).removesuffix(f" {unit}") if unit else fmt_value(v, unit)


def _rejected(rejected: list[dict[str, str]], details: bool) -> list[str]:
    own = [r for r in rejected if r.get("kind") not in ("slower", "tie", "incomparable")]
    if not own:
        return []
    if details:
        return [f"rejected: {r['candidate']}: {r['reason']}" for r in own]
    kinds = Counter(r.get("kind", "?") for r in own)
    return ["rejected: " + ", ".join(f"{n} {k}" for k, n in kinds.most_common())]


def _left_out(cmp: dict[str, Any], details: bool) -> list[str]:
    out = []
    left = cmp.get("left_out") or []
    if left:
        runs = sum(len(x["runs"]) for x in left)
        knobs = Counter(d.split(" (", 1)[0] for x in left for d in x["differs_in"])
        out.append(
            f"left out, other knobs differ: {len(left)} configuration(s), {runs} run(s): "
            + ", ".join(f"{k} {n}" for k, n in knobs.most_common(6))
            + " (--across KNOB ranks them)"
        )
        if details:
            out += [
                f"  {', '.join(x['differs_in'])}: {', '.join(x['runs'])}"
                for x in sorted(left, key=lambda x: len(x["differs_in"]))
            ]
    other = cmp.get("other_workloads") or []
    if other:
        runs = sum(len(x["runs"]) for x in other)
        out.append(
            f"left out, other workloads: {len(other)} workload(s), {runs} run(s) "
            "(--baseline RUN_ID decides one)"
        )
        if details:
            for x in other:
                out.append(f"  {x['workload']}: {len(x['runs'])} run(s), e.g. {x['runs'][0]}")
    probes = cmp.get("probes") or []
    if probes:
        out.append(f"left out, not runs: {len(probes)} probe document(s) (calibrations, profiles)")
    return out


def _predictions(doc: Document, objective: str, details: bool) -> list[str]:
    runs = sorted((doc.decision.rests_on if doc.decision else []), key=len, reverse=True)
    errs: list[tuple[str, str, float]] = []
    for key, m in doc.metrics.items():
        rest = key.removeprefix("prediction_error.")
        run = next((r for r in runs if rest.startswith(f"{r}.")), None)
        if rest != key and run is not None and m.value is not None:
            errs.append((run, rest[len(run) + 1 :], m.value))
    if not errs:
        return []
    if details:
        return ["prediction error, (predicted - measured) / measured:"] + [
            f"  {run}  {name}  {value:+.1f} %" for run, name, value in errs
        ]
    by_name: dict[str, list[float]] = {}
    for _, name, value in errs:
        by_name.setdefault(name, []).append(abs(value))
    first = (objective, "step_time", "peak_memory")
    top = sorted(
        by_name.items(), key=lambda x: (first.index(x[0]) if x[0] in first else 3, -len(x[1]))
    )[:3]
    return [
        "prediction error, median |error| (predictions): "
        + ", ".join(f"{n} {median(v):.1f} % ({len(v)})" for n, v in top)
        + (f", {len(by_name) - 3} more metric(s)" if len(by_name) > 3 else "")
        + " (--details lists them)"
    ]
