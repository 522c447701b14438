"""``parlab decide``: one project's measured documents -> a ``decision`` document.

Reads the project's baseline, candidate and failure documents (never other
decisions) from a results folder, and:

0. Leaves out the probe documents filed beside the runs (``is_probe``: a probe's calibration,
   a profile of a run): they measure an instrument or another run, and are no run to choose.
1. Picks the reference: the newest baseline (else candidate, else failure) of
   the largest group of mutually comparable documents (groups that measured
   the objective first, measured before ``analytic``, then by size, then by
   the newest document), so one odd newer run does not orphan the rest.
2. Checks comparability against it. A document is *incomparable* -- left out,
   and named with what differs -- when its evidence level differs (a CPU
   mechanism run is not a GPU measurement), its GPU model differs, or its
   ``workload`` differs (every key except the run-specific ones in
   ``IGNORED_WORKLOAD_KEYS``: raw measurement rows, step counts, seeds, loss
   curves, and the micro-batch size, a layout knob under a fixed global batch).
   Other environment differences (GPU count, hosts, software versions, NCCL/
   TORCH variables) do not exclude a document: the decision states them in its
   notes. When run ids are given explicitly, any incomparable one is bad input.
3. Rejects, with a reason and a ``kind``: a failed run (its failure kind:
   ``oom``, ``timeout``, ``crash``, ...), a run without the objective metric
   (``no-metric``), a run whose peak memory exceeds ``memory_budget``
   (``over-memory``, by how much), and every qualifying run but the best
   (``slower``, with its value against the chosen one's).
4. Chooses the best qualifying run by the objective: the first metric of the
   project's ``OBJECTIVES`` list that some comparable run measured
   (``tokens_per_s_per_gpu`` for training, ``busbw_peak`` for collectives,
   goodput/throughput for serving), or ``metric`` when given.
5. Notes a close call: when the chosen run leads the runner-up by less than either run's own
   step-to-step spread (the interquartile range of ``workload.step_times`` over its median),
   the order may not survive a repeat.
6. Records each measured run's prediction errors (every ``predictions`` entry
   beside a measured metric: ``100 * (predicted - measured) / measured``, %).

Evidence level rule: the decision carries the level of the documents it
compares -- step 2 makes them all one level -- so a decision over real
training runs is ``real-training``; a decision over analytic documents only
is ``analytic``. The decision rests on (``rests_on``) every comparable
document, failures included. Nothing crosses any wire: documents in, one
document out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parlab.contract import (
    PROJECTS,
    Decision,
    Document,
    Entry,
    Metric,
    new_run_id,
    now_iso,
    read_results,
    write_result,
)
from parlab.errors import UsageError
from parlab.hardware import catalog

RUN_RECORDS = frozenset({"losses", "step_times", "phase_times", "host_probe"})
"""Workload keys a training run records of itself (every step's loss and time, its phases, its
host probe): they differ from run to run of the same job."""

IGNORED_WORKLOAD_KEYS = RUN_RECORDS | frozenset(
    {
        "measurements",
        "partial",
        "bad_lines",
        "steps",
        "warmup_steps",
        "measure_steps",
        "warmup",
        "micro_batch",
        "seed",
        "target",
        "records",
        "trace",
    }
)
"""Workload keys that vary from run to run without changing the job."""

OBJECTIVES: dict[str, tuple[tuple[str, bool], ...]] = {
    "PAR-TRAINING-STATE": (
        ("tokens_per_s_per_gpu", True),
        ("tokens_per_s", True),
        ("step_time", False),
    ),
    "PAR-MODEL-INTERNAL": (
        ("tokens_per_s_per_gpu", True),
        ("tokens_per_s", True),
        ("step_time", False),
    ),
    "PAR-MOE-EXPERT": (
        ("tokens_per_s_per_gpu", True),
        ("step_time", False),
        ("layer_time", False),
    ),
    "PAR-DISTRIBUTED-INFERENCE": (
        ("request_goodput", True),
        ("output_throughput", True),
        ("total_token_throughput", True),
    ),
    "PAR-COLLECTIVES": (("busbw_peak", True),),
    "PAR-ENV": (),
}
"""Per project: (metric, higher is better), first measured one wins."""

_SOFTWARE_KEYS = ("python", "torch", "cuda", "nccl")


@dataclass(frozen=True, kw_only=True)
class DecideOutcome:
    """What ``decide`` produced."""

    doc: Document
    """The decision document."""
    path: Path | None
    """Where it was written (None when not written)."""
    compared: tuple[str, ...]
    """Run ids of the comparable documents."""
    incomparable: tuple[tuple[str, str], ...]
    """(run id, what differs) of each document left out."""
    objective: str | None
    """The metric the choice was made on."""


def _fmt(value: float | None, unit: str) -> str:
    from parlab.report.format import fmt_value

    return fmt_value(value, unit)


def _diff(a: Any, b: Any, where: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if where == "workload" and k in IGNORED_WORKLOAD_KEYS:
                continue
            if k not in a:
                out.append(f"{where}.{k}: absent vs {_short(b[k])}")
            elif k not in b:
                out.append(f"{where}.{k}: {_short(a[k])} vs absent")
            else:
                _diff(a[k], b[k], f"{where}.{k}", out)
    elif a != b:
        out.append(f"{where}: {_short(a)} vs {_short(b)}")


def _short(v: Any) -> str:
    text = json.dumps(v, default=str) if isinstance(v, (dict, list)) else str(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _gpu_models(doc: Document) -> list[str]:
    gpus = ((doc.environment or {}).get("hardware") or {}).get("gpus") or []
    names = []
    for g in gpus:
        spec = catalog.lookup(str(g.get("name", "")))
        names.append(spec.name if spec else str(g.get("name")))
    return sorted(set(names))


def incomparable_reasons(ref: Document, doc: Document) -> list[str]:
    """What makes ``doc`` incomparable with ``ref`` (empty: comparable)."""
    out: list[str] = []
    if doc.evidence_level != ref.evidence_level:
        out.append(f"evidence level: {ref.evidence_level} vs {doc.evidence_level}")
    a, b = _gpu_models(ref), _gpu_models(doc)
    if a != b:
        out.append(f"GPU model: {', '.join(a) or 'none'} vs {', '.join(b) or 'none'}")
    _diff(ref.workload, doc.workload, "workload", out)
    return out


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


def comparability_key(doc: Document) -> str:
    """Documents with equal keys are comparable (level, GPU model, workload less run noise)."""
    workload = {k: v for k, v in doc.workload.items() if k not in IGNORED_WORKLOAD_KEYS}
    return json.dumps([doc.evidence_level, _gpu_models(doc), workload], sort_keys=True, default=str)


def _pick_reference(project: str, docs: Sequence[Document], metric: str | None) -> Document:
    """The newest baseline (else candidate, else failure) of the largest comparable group.

    Groups whose documents measured the objective come first; then measured over analytic;
    then the most documents; then the group holding the newest document.
    """
    groups: dict[str, list[Document]] = {}
    for d in docs:
        groups.setdefault(comparability_key(d), []).append(d)

    def rank(group: list[Document]) -> tuple[bool, bool, int, int]:
        measurable = _objective(project, group, metric, None) is not None
        measured = group[0].evidence_level != "analytic"
        newest = max(docs.index(d) for d in group)
        return measurable, measured, len(group), newest

    best = max(groups.values(), key=rank)
    for role in ("baseline", "candidate", "failure"):
        in_role = [d for d in best if d.role == role]
        if in_role:
            return in_role[-1]
    raise AssertionError("a group is never empty")


def is_probe(doc: Document) -> bool:
    """A document that measures an instrument or another run, not a run to choose: a probe's
    calibration (``workload.kind`` ``...-calibration``: GEMM shapes, host dispatch, the
    per-parameter work) or a profile of a run (``workload.profiled_run_id``)."""
    w = doc.workload or {}
    return str(w.get("kind") or "").endswith("-calibration") or "profiled_run_id" in w


def _objective(
    project: str, docs: Sequence[Document], metric: str | None, higher: bool | None
) -> tuple[str, bool] | None:
    if metric is not None:
        if higher is None:
            higher = not (metric.endswith("_time") or metric.endswith("_ms"))
        return metric, higher
    for name, better_high in OBJECTIVES.get(project, ()):
        if any(d.status == "ok" and d.metric(name) is not None for d in docs):
            return name, better_high
    return None


def step_spread(doc: Document) -> float | None:
    """The spread of a run's measured steps (``workload.step_times``): interquartile range over
    the median, robust to one slow step (a garbage-collection pause); None under 4 steps."""
    from statistics import median, quantiles

    ts = [float(t) for t in doc.workload.get("step_times") or []]
    if len(ts) < 4 or median(ts) <= 0:
        return None
    q1, _, q3 = quantiles(ts, n=4)
    return (q3 - q1) / median(ts)


def margin_within_spread(
    chosen: Document, qualifying: Sequence[tuple[Document, float]], higher: bool
) -> str | None:
    """A note when the chosen run beats the runner-up by less than either run's own
    step-to-step spread: the order may not survive a repeat. None when the margin is clear or
    the runs do not keep their steps."""
    best = next(v for d, v in qualifying if d is chosen)
    rest = [(d, v) for d, v in qualifying if d is not chosen]
    if not rest or not best:
        return None
    runner, v = (max if higher else min)(rest, key=lambda x: x[1])
    spreads = [x for x in (step_spread(chosen), step_spread(runner)) if x is not None]
    margin = abs(best - v) / abs(best)
    if not spreads or margin >= max(spreads):
        return None
    return (
        f"close call: the chosen {chosen.run_id} leads {runner.run_id} by {100 * margin:.1f} %, "
        f"less than the runs' own step-to-step spread ({100 * max(spreads):.1f} %, "
        "interquartile range of workload.step_times over the median): repeat both before "
        "relying on the order"
    )


def _peak_memory(doc: Document) -> float | None:
    m = doc.metrics.get("peak_memory")
    if m is None:
        return None
    vals = [v for v in (m.per_rank or []) if v is not None]
    return max(vals) if vals else m.value


def _label(doc: Document) -> str:
    from parlab.report.format import layout_label

    return f"{doc.run_id} ({layout_label(doc.layout)})"


def eligible_projects(entries: Sequence[Entry]) -> list[str]:
    """Projects holding two or more baseline, candidate or failure documents and an objective."""
    out = []
    for p in PROJECTS:
        docs = [e.doc for e in entries if e.doc.project == p and e.doc.role != "decision"]
        if len(docs) >= 2 and _objective(p, docs, None, None) is not None:
            out.append(p)
    return out


def decide(
    results_dir: str | Path,
    *,
    project: str | None = None,
    run_ids: Sequence[str] | None = None,
    metric: str | None = None,
    lower_is_better: bool | None = None,
    memory_budget: float | None = None,
    command: str,
    write: bool = True,
    out_dir: str | Path | None = None,
) -> DecideOutcome:
    """Decide among one project's documents under ``results_dir`` (see the module docstring)."""
    entries, _skipped = read_results(results_dir)
    if project is None:
        projects = eligible_projects(entries)
        if len(projects) != 1:
            raise UsageError(
                "give --project: "
                + (
                    f"{len(projects)} projects can be decided ({', '.join(projects)})"
                    if projects
                    else f"no project under {results_dir} has documents to decide on"
                )
            )
        project = projects[0]
    if project not in PROJECTS:
        raise UsageError(f"unknown project {project!r}: use one of {', '.join(PROJECTS)}")
    if memory_budget is not None and memory_budget <= 0:
        raise UsageError(f"memory budget {memory_budget} must be positive: give e.g. 80GB")
    docs = [e.doc for e in entries if e.doc.project == project and e.doc.role != "decision"]
    probes = [] if run_ids else [d for d in docs if is_probe(d)]
    docs = [d for d in docs if run_ids or not is_probe(d)]
    if run_ids:
        by_id = {d.run_id: d for d in docs}
        missing = [r for r in run_ids if r not in by_id]
        if missing:
            raise UsageError(
                f"run id(s) {', '.join(missing)} not found among {project}'s baseline, "
                f"candidate and failure documents under {results_dir}"
            )
        docs = [by_id[r] for r in run_ids]
    if not docs:
        raise UsageError(
            f"{project} has no baseline, candidate or failure document under {results_dir}: "
            "run its benchmark first"
        )
    ref = _pick_reference(project, docs, metric)
    comparable: list[Document] = []
    incomparable: list[tuple[Document, str]] = []
    for d in docs:
        why = incomparable_reasons(ref, d)
        if why:
            incomparable.append((d, "; ".join(why[:4]) + (" ..." if len(why) > 4 else "")))
        else:
            comparable.append(d)
    if run_ids and incomparable:
        named = "; ".join(f"{d.run_id} ({why})" for d, why in incomparable)
        raise UsageError(
            f"incomparable with the reference {ref.run_id}: {named}; "
            "decide between runs of one workload, level and GPU model"
        )
    higher_wanted = None if lower_is_better is None else not lower_is_better
    objective = _objective(project, comparable, metric, higher_wanted)
    if objective is None:
        raise UsageError(
            f"{project}: no objective metric measured by its documents: pass --metric NAME"
        )
    obj_name, higher = objective

    rejected: list[dict[str, str]] = []
    qualifying: list[tuple[Document, float]] = []
    for d in comparable:
        if d.status != "ok":
            f = d.failure
            assert f is not None
            rank = "" if f.rank is None else f" on rank {f.rank}"
            rejected.append(
                {
                    "candidate": d.run_id,
                    "kind": f.kind,
                    "reason": f"failed: {f.kind}{rank}: {f.message}",
                }
            )
            continue
        value = d.metric(obj_name)
        if value is None:
            rejected.append(
                {
                    "candidate": d.run_id,
                    "kind": "no-metric",
                    "reason": f"no {obj_name} measured",
                }
            )
            continue
        peak = _peak_memory(d)
        if memory_budget is not None and peak is not None and peak > memory_budget:
            rejected.append(
                {
                    "candidate": d.run_id,
                    "kind": "over-memory",
                    "reason": f"peak memory {peak / 1e9:.2f} GB over the budget "
                    f"{memory_budget / 1e9:.2f} GB by {(peak - memory_budget) / 1e9:.2f} GB",
                }
            )
            continue
        qualifying.append((d, value))

    chosen: Document | None = None
    unit = ""
    if qualifying:
        chosen, best = (max if higher else min)(qualifying, key=lambda x: x[1])
        unit = chosen.metrics[obj_name].unit
        for d, v in qualifying:
            if d is chosen:
                continue
            rel = (v - best) / best if best else 0.0
            rejected.append(
                {
                    "candidate": d.run_id,
                    "kind": "slower",
                    "reason": f"{obj_name} {_fmt(v, unit)} vs {_fmt(best, unit)} of the chosen "
                    f"({100 * rel:+.1f} %)",
                }
            )
    for d, why in incomparable:
        rejected.append(
            {
                "candidate": d.run_id,
                "kind": "incomparable",
                "reason": f"incomparable with {ref.run_id}: {why}",
            }
        )

    metrics: dict[str, Metric] = {}
    notes: list[str] = []
    if probes:
        notes.append(
            f"not runs, left out: {len(probes)} probe document(s) (calibrations, profiles of "
            f"runs): {', '.join(d.run_id for d in probes)}"
        )
    if chosen is not None:
        best_val = chosen.metric(obj_name)
        metrics[f"chosen.{obj_name}"] = Metric(value=best_val, unit=unit)
        peak = _peak_memory(chosen)
        if peak is not None:
            metrics["chosen.peak_memory"] = Metric(value=peak, unit="B")
        base = ref if ref.status == "ok" and ref is not chosen else None
        gain = ""
        if base is not None and base.metric(obj_name):
            b = base.metric(obj_name)
            assert b is not None and best_val is not None
            metrics[f"chosen_vs_reference.{obj_name}"] = Metric(
                value=100.0 * (best_val - b) / b, unit="%"
            )
            gain = f", {100.0 * (best_val - b) / b:+.1f} % against the reference {base.run_id}"
        reason = (
            f"{_label(chosen)} has the {'highest' if higher else 'lowest'} {obj_name} "
            f"({_fmt(best_val, unit)}{gain}) of {len(qualifying)} qualifying run(s) among "
            f"{len(comparable)} comparable document(s)"
            + (
                f", all within the memory budget {memory_budget / 1e9:.2f} GB"
                if memory_budget
                else ""
            )
        )
    else:
        reason = (
            f"no candidate qualifies: {len(comparable)} comparable document(s), all failed, "
            f"without {obj_name}, or over the memory budget"
        )
    if chosen is not None:
        close = margin_within_spread(chosen, qualifying, higher)
        if close is not None:
            notes.append(close)
    n_errors = 0
    for d in comparable:
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
            f"for {n_errors} prediction(s) of the comparable runs"
        )
    env_notes = sorted({x for d in comparable for x in environment_differences(ref, d)})
    if env_notes:
        notes.append(
            f"environments differ from the reference {ref.run_id} (runs still compared): "
            + "; ".join(env_notes)
        )
    for d, why in incomparable:
        notes.append(f"left out as incomparable: {d.run_id}: {why}")
    notes.append(
        f"objective: {obj_name} ({'higher' if higher else 'lower'} is better); "
        f"evidence level: that of the {len(comparable)} compared document(s)"
    )
    layout = dict((chosen or ref).layout)
    layout["candidates"] = [
        {
            "run_id": d.run_id,
            "role": d.role,
            "status": d.status,
            "layout": _label(d),
            obj_name: d.metric(obj_name),
            "peak_memory": _peak_memory(d),
        }
        for d in comparable
    ]
    workload = {k: v for k, v in ref.workload.items() if k not in IGNORED_WORKLOAD_KEYS}
    doc = Document(
        run_id=new_run_id(f"decide-{project.lower()}"),
        created=now_iso(),
        project=project,
        task="T6",
        role="decision",
        evidence_level=ref.evidence_level,
        command=command,
        environment=ref.environment,
        workload=workload,
        layout=layout,
        metrics=metrics,
        decision=Decision(
            chosen=chosen.run_id if chosen else None,
            rejected=rejected,
            rests_on=[d.run_id for d in comparable],
            reason=reason,
        ),
        notes=notes,
    )
    path = write_result(doc, out_dir or results_dir) if write else None
    return DecideOutcome(
        doc=doc,
        path=path,
        compared=tuple(d.run_id for d in comparable),
        incomparable=tuple((d.run_id, why) for d, why in incomparable),
        objective=obj_name,
    )
