"""A folder of rank traces -> one ``distributed-benchmark/v1`` document and its artifacts.

``profile_folder`` analyses the traces (``analyze_folder``), writes beside the
document, in ``<results>/<project>/<run_id>/``: the merged multi-rank trace
(``merged.trace.json.gz``), the timeline PNG of a typical step
(``timeline.png``) and the hotspot text (``hotspots.txt``); then the document
(task T5; evidence ``real-training`` when the traces hold GPU kernels,
``cpu-mechanism`` for gloo runs) with per-rank metrics. Problems with
individual files (corrupt, truncated, foreign, missing ranks) become notes:
the rest is still analysed.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from parlab.contract import (
    PROJECTS,
    Document,
    Metric,
    Prediction,
    new_run_id,
    now_iso,
    write_result,
)
from parlab.errors import UsageError
from parlab.hardware.env import snapshot
from parlab.profile.analyze import analyze_folder
from parlab.profile.export import pick_step, write_merged_trace, write_timeline_png
from parlab.profile.profiles import RunProfile
from parlab.profile.summary import Summary, hotspot_text, summarize

DEFAULT_PROJECT = "PAR-TRAINING-STATE"


@dataclass(frozen=True, kw_only=True)
class ProfileOutcome:
    """What ``profile_folder`` produced."""

    doc: Document
    """The contract document."""
    path: Path
    """Where the document was written."""
    run: RunProfile
    """The analysis."""
    summary: Summary
    """Run-level figures."""
    text: str
    """The hotspot text (also in ``hotspots.txt``)."""
    artifacts: dict[str, Path]
    """Artifact name -> absolute path."""


def _metric(values: list[float | None], unit: str, scale: float = 1.0) -> Metric:
    known = [v for v in values if v is not None]
    mean = sum(known) / len(known) * scale if known else None
    return Metric(
        value=mean,
        unit=unit,
        per_rank=[None if v is None else v * scale for v in values] if len(values) > 1 else None,
    )


def build_metrics(s: Summary, run: RunProfile) -> dict[str, Metric]:
    """The document's metrics (means over steps, then over ranks; per rank beside them)."""
    exposed_frac = [
        (100.0 * e / w) if w > 0 else None for e, w in zip(s.exposed_s, s.step_time_s, strict=True)
    ]
    m = {
        "step_time": _metric(s.step_time_s, "s"),
        "compute_time": _metric(s.compute_s, "s"),
        "comm_time": _metric(s.comm_s, "s"),
        "overlap_fraction": _metric(s.overlap_pct, "%"),
        "exposed_comm_time": _metric(s.exposed_s, "s"),
        "exposed_comm_fraction": _metric(exposed_frac, "%"),
        "idle_time": _metric(s.idle_s, "s"),
        "comm_count_per_step": _metric(s.comm_count, "count"),
        "comm_bytes_per_step": _metric(s.comm_bytes, "B"),
        "straggler_rank": Metric(value=s.straggler_rank, unit="rank"),
        "straggler_lateness": Metric(value=s.straggler_lateness_s, unit="s"),
        "ranks_analysed": Metric(value=len(run.ranks), unit="count"),
        "ranks_missing": Metric(
            value=run.world_size - len({r.rank for r in run.ranks}), unit="count"
        ),
        "steps_analysed": Metric(value=len(s.steps), unit="count"),
    }
    return m


def _notes(run: RunProfile, gpu: bool, notes: list[str] | None) -> list[str]:
    """How overlap is defined, what a CPU run proves, the caller's notes, the files skipped."""
    cpu = [
        "CPU/gloo run: communication is gloo's transfer threads, compute is CPU ops; "
        "it proves the mechanism, not GPU timing"
    ]
    return [
        "overlap_fraction = |comm ∩ compute| / |comm| per step (Holistic Trace Analysis's "
        "definition); exposed = comm - overlap; means over steps, then ranks",
        *([] if gpu else cpu),
        *(notes or []),
        *[f"skipped: {p.message}" for p in run.problems],
    ]


def _document(
    run: RunProfile,
    summary: Summary,
    *,
    run_id: str,
    project: str,
    role: str,
    command: str,
    label: str | None,
    trace_dir: str | Path,
    workload: dict[str, Any] | None,
    layout: dict[str, Any] | None,
    predictions: dict[str, Prediction] | None,
    artifacts: dict[str, str],
    notes: list[str] | None,
) -> Document:
    """The T5 document of the analysed run (paths in ``artifacts`` relative to the project)."""
    gpu = _on_gpu(run)
    return Document(
        run_id=run_id,
        created=now_iso(),
        project=project,
        task="T5",
        role=role,
        evidence_level="real-training" if gpu else "cpu-mechanism",
        command=command,
        environment=snapshot(probe_links=gpu),
        workload={
            "label": label,
            "trace_dir": str(trace_dir),
            "profiled_run_id": run.run_id,
            "steps": summary.steps,
            **(workload or {}),
            "hotspots": [asdict(h) for h in summary.hotspots],
            "stragglers_by_step": summary.straggler_by_step,
            "per_rank_steps": {str(r.rank): [asdict(s) for s in r.steps] for r in run.ranks},
            "compute_hotspots_rank0": run.ranks[0].compute_hotspots[:5],
            "compute_by_kind_rank0_s": run.ranks[0].compute_by_kind,
        },
        layout={
            "world_size": run.world_size,
            "backend": next((r.backend for r in run.ranks if r.backend), None),
            "strategy": label,
            **(layout or {}),
        },
        metrics=build_metrics(summary, run),
        predictions=dict(predictions or {}),
        artifacts=artifacts,
        notes=_notes(run, gpu, notes),
    )


def _on_gpu(run: RunProfile) -> bool:
    return any(r.device == "cuda" for r in run.ranks)


def _timeline_and_hotspots(
    run: RunProfile, summary: Summary, out_dir: Path, label: str | None, step: int | None
) -> tuple[str, dict[str, Path]]:
    """Write the timeline PNG of ``step`` (default: the median one) and ``hotspots.txt``;
    returns the hotspot text and the files written by artifact name."""
    step = pick_step(run) if step is None else step
    artifacts: dict[str, Path] = {}
    png = write_timeline_png(
        run, out_dir / "timeline.png", step=step, title=f"{label or 'profile'}: step {step}"
    )
    if png is not None:
        artifacts["timeline_png"] = png
    where = "GPU" if _on_gpu(run) else "CPU/gloo"
    title = f"parlab profile {label or ''} ({where}, {run.folder})".replace("  ", " ")
    text = hotspot_text(summary, run, title=title)
    (out_dir / "hotspots.txt").write_text(text)
    artifacts["hotspots"] = out_dir / "hotspots.txt"
    return text, artifacts


def profile_folder(
    trace_dir: str | Path,
    *,
    results: Path,
    command: str,
    project: str | None = None,
    label: str | None = None,
    role: str = "baseline",
    workload: dict[str, Any] | None = None,
    layout: dict[str, Any] | None = None,
    notes: list[str] | None = None,
    run_id: str | None = None,
    timeline_step: int | None = None,
    predictions: dict[str, Prediction] | None = None,
) -> ProfileOutcome:
    """Analyse ``trace_dir`` and write the document and its artifacts under ``results``.

    ``timeline_step``: the step the PNG draws (default: the step of median length).
    ``predictions``: what the analytic side said the run would put on the wire.
    """
    if project is not None and project not in PROJECTS:
        raise UsageError(f"--project {project!r} is not one of {', '.join(PROJECTS)}")
    with tempfile.TemporaryDirectory(prefix="parlab-profile-") as tmp:
        run = analyze_folder(trace_dir, fragments_dir=tmp)
        steps = {st.step for r in run.ranks for st in r.steps}
        if timeline_step is not None and timeline_step not in steps:
            raise UsageError(
                f"--timeline-step {timeline_step} was not profiled: pick one of {sorted(steps)}"
            )
        project = project or next((r.project for r in run.ranks if r.project), None)
        project = project if project in PROJECTS else DEFAULT_PROJECT
        label = label or next((r.label for r in run.ranks if r.label), None)
        run_id = run_id or new_run_id(f"profile-{label or 'run'}")
        out_dir = results / project / run_id
        summary = summarize(run)
        artifacts: dict[str, Path] = {}
        artifacts["merged_trace"] = write_merged_trace(
            run, Path(tmp), out_dir / "merged.trace.json.gz"
        )
    text, written = _timeline_and_hotspots(run, summary, out_dir, label, timeline_step)
    artifacts |= written
    doc = _document(
        run,
        summary,
        run_id=run_id,
        project=project,
        role=role,
        command=command,
        label=label,
        trace_dir=trace_dir,
        workload=workload,
        layout=layout,
        predictions=predictions,
        artifacts={k: str(p.relative_to(results / project)) for k, p in artifacts.items()},
        notes=notes,
    )
    path = write_result(doc, results)
    return ProfileOutcome(
        doc=doc, path=path, run=run, summary=summary, text=text, artifacts=artifacts
    )
