"""The decision document: a ranking and the runs left out, with every detail.

``summary`` writes ``layout.comparison`` (the compared knobs, the knobs every ranked
configuration shares, each configuration with its repeats, values, median, spread and the
best's lead; the configurations of the workload left out with the knobs they differ in; the
other workloads with what differs; the probes) and the ``rejected`` list (every run not
chosen, with its ``kind``: a failure kind, ``no-metric``, ``over-memory``, ``slower``, ``tie``,
``incomparable``). ``decision_document`` adds the metrics, prediction errors and notes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from parlab.contract import Decision, Document, Metric, new_run_id, now_iso
from parlab.plan.compare import (
    IGNORED_WORKLOAD_KEYS,
    Config,
    knob_differences,
    knob_text,
    knob_value,
    workload_differences,
    workload_label,
)
from parlab.plan.ranking import Choice, Others, Ranking, Row, value_line

_SOFTWARE_KEYS = ("python", "torch", "cuda", "nccl")


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


def decision_document(choice: Choice, ranking: Ranking, others: Others, command: str) -> Document:
    obj, higher = choice.objective
    ref = ranking.reference
    details, rejected = summary(choice, ranking, others)
    metrics: dict[str, Metric] = {}
    chosen = ranking.chosen
    if chosen is not None:
        metrics[f"chosen.{obj}"] = Metric(value=chosen.config.median, unit=ranking.unit)
        metrics["chosen.repeats"] = Metric(value=len(chosen.config.values), unit="count")
        if chosen.peak is not None:
            metrics["chosen.peak_memory"] = Metric(value=chosen.peak, unit="B")
        if len(ranking.rows) > 1 and ranking.rows[1].lead is not None:
            lead = 100 * ranking.rows[1].lead
            metrics[f"lead_over_runner_up.{obj}"] = Metric(value=lead, unit="%")
    notes: list[str] = []
    if choice.probes:
        notes.append(
            f"not runs, left out: {len(choice.probes)} probe document(s) (calibrations, "
            f"profiles of runs): {', '.join(d.run_id for d in choice.probes)}"
        )
    n_errors = 0
    for d in (d for r in ranking.rows for d in r.config.docs):
        for name, p in d.predictions.items():
            measured = d.metric(name)
            if p.value is None or measured is None or measured == 0:
                continue
            err = 100.0 * (p.value - measured) / measured
            metrics[f"prediction_error.{d.run_id}.{name}"] = Metric(value=err, unit="%")
            n_errors += 1
    if n_errors:
        notes.append(
            f"prediction_error.<run_id>.<metric> = 100 * (predicted - measured) / measured, "
            f"for {n_errors} prediction(s) of the compared runs"
        )
    env = sorted({x for r in ranking.rows for d in r.config.docs
                  for x in environment_differences(ref, d)})  # fmt: skip
    if env:
        notes.append(
            f"environments differ from {ref.run_id} (runs still compared): " + "; ".join(env)
        )
    if choice.across:
        notes.append(
            f"ranked across {', '.join(choice.across)}: the ranked configurations may differ "
            "in these knobs too"
        )
    notes.append(
        f"objective: {obj} ({'higher' if higher else 'lower'} is better), each configuration's "
        "median over its repeats; spread: the interquartile range of 4 or more repeats, the "
        "min-max of 2 or 3, for one repeat the interquartile range of its measured steps "
        "(workload.step_times)"
    )
    return Document(
        run_id=new_run_id(f"decide-{choice.project.lower()}"),
        created=now_iso(),
        project=choice.project,
        task="T6",
        role="decision",
        evidence_level=ref.evidence_level,
        command=command,
        environment=ref.environment,
        workload={k: v for k, v in ref.workload.items() if k not in IGNORED_WORKLOAD_KEYS},
        layout={**ref.layout, "comparison": details},
        metrics=metrics,
        decision=Decision(
            chosen=ranking.chosen_run,
            rejected=rejected,
            rests_on=[d.run_id for r in ranking.rows for d in r.config.docs],
            reason=ranking.reason,
        ),
        notes=notes,
    )
