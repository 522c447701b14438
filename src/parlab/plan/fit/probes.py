"""The planner's calibration probes' documents: how a probe writes one, and which ones count.

Each probe under ``benchmarks/`` (``gemm_shapes_probe.py``, ``param_work_probe.py``) measures
one part of a step apart from any training run and writes a ``distributed-benchmark/v1`` document whose ``workload`` holds its
``kind`` (``*-calibration``) and its ``calibration`` body, with no ``step_time`` metric, so it is
never taken for a training run (``parlab decide`` leaves such documents out). Its reader in
``parlab.plan.fit`` (``shapes``, ``paramwork``) takes the GPU ones of the newest device.
Nothing here imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parlab.contract import Document, new_run_id, now_iso, read_document
from parlab.errors import UsageError


def probe_document(
    *,
    prefix: str,
    project: str,
    kind: str,
    body: dict[str, Any],
    gpu: bool,
    layout: dict[str, Any],
    metrics: dict[str, Any],
    notes: list[str],
    command: str,
    environment: dict[str, Any],
) -> Any:
    """A probe's contract document (task T6, role baseline; evidence ``real-training`` on a GPU,
    ``cpu-mechanism`` on the CPU) holding its calibration ``body``."""
    return Document(
        run_id=new_run_id(prefix),
        created=now_iso(),
        project=project,
        task="T6",
        role="baseline",
        evidence_level="real-training" if gpu else "cpu-mechanism",
        command=command,
        environment=environment,
        workload={"kind": kind, "calibration": body},
        layout=layout,
        metrics=metrics,
        notes=notes,
    )


def newest_device_calibrations(root: Any, project: str, prefix: str, load: Any) -> list[Any]:
    """``load(doc)`` of every GPU (``real-training``) document ``prefix-*.json`` under
    ``root``/``project`` made on the newest one's device (its ``device``), oldest first; empty
    without one (the probes whose repeats are averaged: ``parlab.plan.fit.shapes``,
    ``parlab.plan.fit.paramwork``)."""
    found: list[tuple[str, Any]] = []
    for path in sorted((Path(root) / project).glob(f"{prefix}-*.json")):
        try:
            doc = read_document(path)
            cal = load(doc)
        except (ValueError, KeyError, TypeError, ZeroDivisionError, UsageError):
            continue
        if doc.evidence_level == "real-training":
            found.append((doc.created, cal))
    if not found:
        return []
    found.sort(key=lambda f: f[0])
    device = found[-1][1].device
    return [cal for _, cal in found if cal.device == device]
