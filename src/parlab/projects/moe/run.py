"""Launch a ``parlab project moe`` run on ``ep`` ranks; its documents and report.

``run_moe_project(config, ...)`` launches ``rank.moe_rank`` on ``config.ep`` ranks through
torchrun (NCCL on GPUs, gloo on CPU), finds what ``parlab collectives`` measured for
all_to_all beside it (``calibration.find_calibration``), and writes one document per routing
workload, the capacity sweep, the learned routing and the report; or one failure document.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parlab.contract import Document, new_run_id, write_result
from parlab.hardware.env import snapshot
from parlab.projects.moe.calibration import find_calibration
from parlab.projects.moe.config import PROJECT, MoERunConfig
from parlab.projects.moe.documents import (
    failure_document,
    sweep_document,
    training_document,
    workload_document,
)
from parlab.projects.moe.report import blocks, figures
from parlab.report.blocks import Report
from parlab.report.markdown import write_markdown
from parlab.runtime.launch import LaunchConfig, launch


@dataclass
class MoEOutcome:
    """What a run wrote."""

    documents: list[Any] = field(default_factory=list)
    """The contract documents, in the order written."""
    paths: list[Path] = field(default_factory=list)
    """Where they were written."""
    report: Path | None = None
    """The Markdown report."""
    ok: bool = True
    """False when the ranks failed (a failure document was written)."""


def render_report(docs: list[Document], folder: Path, stem: str) -> dict[str, str]:
    """Write ``<stem>-report.md`` and its SVGs into ``folder``; return artifact name -> file name."""
    images = figures(docs, stem)
    title = f"MoE expert parallelism: {stem}"
    write_markdown(
        Report(title=title, blocks=blocks(docs, images)), folder / f"{stem}-report.md", "."
    )
    art = {name: f"{image.key}.svg" for name, image in images.items()}
    return {**art, "report": f"{stem}-report.md"}


def run_moe_project(
    cfg: MoERunConfig,
    *,
    results: Path,
    command: str,
    calibration: Path | None = None,
) -> MoEOutcome:
    """Launch the ranks, write the documents and the report; see the module docstring."""
    launch_cfg = LaunchConfig(nproc=cfg.ep, backend=cfg.backend, timeout_s=cfg.timeout_s)
    backend = launch_cfg.resolved_backend()
    cal = find_calibration(results, calibration, cfg.ep, backend)
    res = launch("parlab.projects.moe.rank:moe_rank", cfg.to_json(), launch_cfg)
    env = snapshot()
    outcome = MoEOutcome()
    if not res.ok:
        assert res.failure is not None
        doc = failure_document(cfg, res.failure, command=command, environment=env, backend=backend)
        outcome.documents.append(doc)
        outcome.paths.append(write_result(doc, results))
        outcome.ok = False
        return outcome
    ranks = sorted(res.results, key=lambda r: r["ep_rank"])
    tag = new_run_id(f"moe-ep{cfg.ep}")
    kw = {"tag": tag, "command": command, "environment": env}
    docs = [
        workload_document(cfg, ranks, i, calibration=cal, **kw) for i in range(len(cfg.workloads()))
    ]
    docs.append(sweep_document(cfg, ranks, **kw))
    if cfg.train_steps:
        docs.append(training_document(cfg, ranks, **kw))
    if cal is not None:
        used = [f"all_to_all sweep {cal['run_id']}" if "run_id" in cal else "",
                f"all_to_all fit {cal['fit_label']}" if "fit_label" in cal else ""]  # fmt: skip
        note = "parlab collectives reference: " + ", ".join(u for u in used if u)
        docs = [dataclasses.replace(d, notes=[*d.notes, note]) for d in docs]
    folder = results / PROJECT
    art = render_report(docs, folder, tag)
    for d in docs:
        d = dataclasses.replace(d, artifacts=dict(art))
        outcome.documents.append(d)
        outcome.paths.append(write_result(d, results))
    outcome.report = folder / art["report"]
    return outcome
