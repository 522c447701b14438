"""``parlab decide``: one project's measured documents -> a ``decision`` document.

Reads the project's baseline, candidate and failure documents (never other decisions) from a
results folder and compares like with like (``parlab.plan.compare``):

0. Leaves out the probe documents filed beside the runs (``is_probe``): they measure an
   instrument or another run, and are no run to choose.
1. Groups the runs by workload, each workload's runs by configuration (a configuration's runs
   are its repeats), and the configurations into classes that differ only in the compared
   knobs (``--compare``, default per project: the strategy for training state, the layout for
   model internals and MoE, the routing policy for serving; ``--across`` lets more knobs
   differ).
2. Decides one class: the one holding ``baseline`` when given, else the one with the most
   configurations to rank (then measured before ``analytic``, the most runs, the newest run).
   Every other configuration of its workload is named with the knobs it differs in; every
   other workload is named with what differs.
3. Rejects, with a reason and a ``kind``: a failed run (its failure kind: ``oom``,
   ``timeout``, ``crash``, ...), a run without the objective metric (``no-metric``), a
   configuration whose peak memory exceeds ``memory_budget`` (``over-memory``, by how much).
4. Ranks the qualifying configurations by their median over repeats of the objective (the
   first metric of the project's ``OBJECTIVES`` that some run measured, or ``metric``). The
   best is chosen when its lead over the runner-up is outside both spreads; a lead inside the
   spread is a ``tie``: nothing is chosen, and the decision says so. With a spread unknown
   (one repeat, no step times) the choice stands, marked unconfirmed.
5. Records each compared run's prediction errors (every ``predictions`` entry beside a
   measured metric: ``100 * (predicted - measured) / measured``, %).

The decision carries the evidence level of the workload it decided (one level: it is part of
the workload) and rests on the class's runs, failures included. Its ``layout.comparison``
holds every detail: the configurations with their repeats, values and spreads, the runs left
out and why. Nothing crosses any wire: documents in, one document out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from parlab.contract import (
    PROJECTS,
    Document,
    Entry,
    read_results,
    write_result,
)
from parlab.errors import UsageError
from parlab.plan.compare import RUN_RECORDS as RUN_RECORDS  # read by benchmarks/plan_accuracy
from parlab.plan.compare import (
    Config,
    group_configs,
    is_probe,
    key_of,
    knob_differences,
    knob_names,
    project_knobs,
    workload_differences,
    workload_key,
)
from parlab.plan.decision_doc import decision_document
from parlab.plan.ranking import Choice, Others, rank

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


@dataclass(frozen=True, kw_only=True)
class DecideOutcome:
    """What ``decide`` produced."""

    doc: Document
    """The decision document."""
    path: Path | None
    """Where it was written (None when not written)."""
    compared: tuple[str, ...]
    """Run ids of the runs ranked against each other (the decided class)."""
    incomparable: tuple[tuple[str, str], ...]
    """(run id, what differs) of each run left out."""
    objective: str | None
    """The metric the choice was made on."""


def read_projects(results_dir: str | Path) -> list[Entry]:
    """The documents under a results folder that holds project folders (bad input if none)."""
    root = Path(results_dir)
    entries, _skipped = read_results(root)
    if not any((root / p).is_dir() for p in PROJECTS):
        above = f" (e.g. {root.parent})" if root.name in PROJECTS else ""
        raise UsageError(
            f"{root} holds no project folder ({PROJECTS[0]}/, ...): pass the results folder "
            f"that holds them{above}"
        )
    return entries


def eligible_projects(entries: Sequence[Entry]) -> list[str]:
    """Projects holding two or more baseline, candidate or failure documents and an objective."""
    out = []
    for p in PROJECTS:
        docs = [e.doc for e in entries if e.doc.project == p and e.doc.role != "decision"]
        if len(docs) >= 2 and _objective(p, docs, None, None) is not None:
            out.append(p)
    return out


def knob_choices(project: str, docs: Sequence[Document]) -> list[str]:
    """What ``--compare`` and ``--across`` accept for a project: its knob groups and knobs."""
    return sorted(set(project_knobs(project).groups) | set(knob_names(docs)))


def decide(
    results_dir: str | Path,
    *,
    project: str | None = None,
    run_ids: Sequence[str] | None = None,
    baseline: str | None = None,
    compare: str | None = None,
    across: Sequence[str] = (),
    metric: str | None = None,
    lower_is_better: bool | None = None,
    memory_budget: float | None = None,
    command: str,
    write: bool = True,
    out_dir: str | Path | None = None,
) -> DecideOutcome:
    """Decide among one project's documents under ``results_dir`` (see the module docstring)."""
    entries = read_projects(results_dir)
    choice = _choice(
        entries, results_dir, project, run_ids, baseline, compare, across, metric,
        lower_is_better, memory_budget,
    )  # fmt: skip
    decided, others = _classes(choice, run_ids, baseline)
    ranking = rank(decided, choice)
    doc = decision_document(choice, ranking, others, command)
    path = write_result(doc, out_dir or results_dir) if write else None
    assert doc.decision is not None
    incomparable = tuple(
        (r["candidate"], r["reason"]) for r in doc.decision.rejected if r["kind"] == "incomparable"
    )
    return DecideOutcome(
        doc=doc,
        path=path,
        compared=tuple(d.run_id for c in decided for d in c.docs),
        incomparable=incomparable,
        objective=choice.objective[0],
    )


def _choice(
    entries: Sequence[Entry],
    results_dir: str | Path,
    project: str | None,
    run_ids: Sequence[str] | None,
    baseline: str | None,
    compare: str | None,
    across: Sequence[str],
    metric: str | None,
    lower_is_better: bool | None,
    memory_budget: float | None,
) -> Choice:
    project = _project(
        entries, results_dir, project, [*(run_ids or []), *([baseline] if baseline else [])]
    )
    if project not in PROJECTS:
        raise UsageError(f"unknown project {project!r}: use one of {', '.join(PROJECTS)}")
    if memory_budget is not None and memory_budget <= 0:
        raise UsageError(f"memory budget {memory_budget} must be positive: give e.g. 80GB")
    docs = [e.doc for e in entries if e.doc.project == project and e.doc.role != "decision"]
    probes = [] if run_ids else [d for d in docs if is_probe(d)]
    docs = [d for d in docs if run_ids or not is_probe(d)]
    by_id = {d.run_id: d for d in docs}
    for given, what in (
        (run_ids or [], "--run-id"),
        ([baseline] if baseline else [], "--baseline"),
    ):
        missing = [r for r in given if r not in by_id]
        if missing:
            raise UsageError(
                f"{what} {', '.join(missing)} not found among {project}'s baseline, candidate "
                f"and failure documents under {results_dir}: see `parlab results {results_dir}`"
            )
    if run_ids:
        docs = [by_id[r] for r in dict.fromkeys(run_ids)]
    if not docs:
        raise UsageError(
            f"{project} has no baseline, candidate or failure document under {results_dir}: "
            "run its benchmark first"
        )
    compared = _compared(project, docs, compare, across)
    higher_wanted = None if lower_is_better is None else not lower_is_better
    objective = _objective(project, docs, metric, higher_wanted)
    if objective is None:
        raise UsageError(
            f"{project}: no objective metric measured by its documents: pass --metric NAME"
        )
    return Choice(
        project=project,
        compare=compare or project_knobs(project).compare,
        docs=docs,
        probes=probes,
        compared=compared,
        across=tuple(across),
        objective=objective,
        memory_budget=memory_budget,
    )


def _project(
    entries: Sequence[Entry], results_dir: str | Path, project: str | None, named: list[str]
) -> str:
    """The project asked for; else that of the runs named; else the only one to decide."""
    if project is None and named:
        found = {e.doc.project for e in entries if e.doc.run_id in named}
        if not found:
            raise UsageError(
                f"run id(s) {', '.join(named)} not found under {results_dir}: "
                f"see `parlab results {results_dir}`"
            )
        project = found.pop() if len(found) == 1 else None
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
    return project


def _compared(
    project: str, docs: Sequence[Document], compare: str | None, across: Sequence[str]
) -> tuple[str, ...]:
    """The knobs ``--compare`` and ``--across`` let differ (groups expanded); bad input when
    the project records no such knob."""
    spec = project_knobs(project)
    known = knob_choices(project, docs)
    for name, flag in [(compare, "--compare"), *((a, "--across") for a in across)]:
        if name is not None and name not in known:
            raise UsageError(
                f"unknown {flag} knob {name!r} for {project}: use one of {', '.join(known)}"
            )
    names = (compare or spec.compare, *across)
    return tuple(dict.fromkeys(m for n in names for m in spec.groups.get(n, (n,))))


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


def _classes(
    choice: Choice, run_ids: Sequence[str] | None, baseline: str | None
) -> tuple[list[Config], Others]:
    """The decided class and what is left out (see the module docstring, step 2)."""
    workloads: dict[str, list[Document]] = {}
    for d in choice.docs:
        workloads.setdefault(workload_key(d), []).append(d)
    if run_ids and len(workloads) > 1:
        ref, *rest = (w[0] for w in workloads.values())
        named = "; ".join(f"{d.run_id} ({'; '.join(workload_differences(ref, d)[:3])})"
                          for d in rest)  # fmt: skip
        raise UsageError(
            f"incomparable with the reference {ref.run_id}: {named}; "
            "decide between runs of one workload, level and GPU model"
        )
    classes: list[tuple[str, list[Config]]] = []
    for key, wdocs in workloads.items():
        fixed = [n for n in knob_names(wdocs) if n not in choice.compared]
        split: dict[str, list[Config]] = {}
        for c in group_configs(wdocs):
            split.setdefault(key_of(c.knobs, fixed), []).append(c)
        classes += [(key, cs) for cs in split.values()]
    if run_ids and len(classes) > 1:
        raise UsageError(_differ_line(classes, choice))
    if baseline:
        key, decided = next(
            (k, cs) for k, cs in classes if any(d.run_id == baseline for c in cs for d in c.docs)
        )
    else:
        key, decided = max(classes, key=lambda kc: _class_rank(kc[1], choice))
    return decided, Others(
        workload=[c for k, cs in classes if k == key and cs is not decided for c in cs],
        workloads=[w for k, w in workloads.items() if k != key],
    )


def _class_rank(configs: list[Config], choice: Choice) -> tuple[int, bool, int, str]:
    name = choice.objective[0]
    docs = [d for c in configs for d in c.docs]
    measured = sum(any(d.status == "ok" and d.metric(name) is not None for d in c.docs)
                   for c in configs)  # fmt: skip
    newest = max(d.created for d in docs)
    return measured, docs[0].evidence_level != "analytic", len(docs), newest


def _differ_line(classes: list[tuple[str, list[Config]]], choice: Choice) -> str:
    a, b = classes[0][1][0], classes[1][1][0]
    names = sorted((set(a.knobs) | set(b.knobs)) - set(choice.compared))
    diffs = knob_differences(b.knobs, a.knobs, names)
    knobs = ",".join(d.split(" (", 1)[0] for d in diffs)
    return (
        f"{b.docs[0].run_id} and {a.docs[0].run_id} differ in {', '.join(diffs)} besides "
        f"{choice.compare}: add --across {knobs} to rank them anyway"
    )
