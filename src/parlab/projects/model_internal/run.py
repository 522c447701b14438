"""Launch model-internal runs and compare them with one rank: the comparison set, its report.

``run_project`` runs a comparison set: each parallel layout (candidate) and, for each, a
one-rank run of the same global batch (baseline), so scaling efficiency is
``t_1 / (n * t_n)`` at the same global batch. One contract document per run and a Markdown
report with the layout tables, the pipeline schedule grid and the per-axis communication.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from parlab.contract import Document, Failure, write_result
from parlab.errors import UsageError
from parlab.hardware.env import snapshot
from parlab.parallel.pipeline_schedules import SCHEDULES, build, format_grid
from parlab.projects.model_internal.config import (
    BASELINE_LAST,
    NAMES,
    PROJECT,
    RunConfig,
    comparison_set,
)
from parlab.projects.model_internal.documents import add_scaling, document, outcome
from parlab.projects.model_internal.report import TITLE, blocks
from parlab.report.blocks import Report
from parlab.report.markdown import write_markdown
from parlab.runtime.launch import LaunchConfig, LaunchResult, launch


def _partial(tmp: str, runs: int, width: int) -> dict[int, list[dict[str, Any] | None]]:
    """The runs a launch that died finished: those whose every rank wrote its outcome."""
    got: dict[int, list[dict[str, Any] | None]] = {}
    for n in range(runs):
        files = [Path(tmp) / f"run{n}.rank{r}.json" for r in range(width)]
        if all(f.exists() for f in files):
            got[n] = [json.loads(f.read_text())["result"] for f in files]
    return got


def _one_launch(
    configs: list[RunConfig], width: int, backend: str, timeout_s: float, left: float | None
) -> tuple[LaunchResult, dict[int, list[dict[str, Any] | None]]]:
    """One launch of ``mi_many`` over ``configs``; what came back per run."""
    with tempfile.TemporaryDirectory(prefix="parlab-mi-") as tmp:
        kwargs = {
            "runs": [c.to_json() for c in configs],
            "partial_dir": tmp,
            "deadline": None if left is None else time.time() + left - 10,
        }
        lc = LaunchConfig(nproc=width, backend=backend, timeout_s=timeout_s, deadline_s=left)
        res = launch("parlab.projects.model_internal.many:mi_many", kwargs, lc)
        if res.ok:
            return res, {n: [r[n] for r in res.results] for n in range(len(configs))}
        return res, _partial(tmp, len(configs), width)


def launch_set(
    configs: list[RunConfig], *, gpu: bool, timeout_s: float, budget_s: float | None = None
) -> tuple[list[list[dict[str, Any]] | None], list[Failure | None], str]:
    """Run configs in as few launches as possible (one start-up each; one-rank baselines
    run on rank 0 alone). Each run is isolated inside the launch (``mi_many``); if the
    launch itself dies (a rank killed, a collective timed out), the runs it finished are
    kept, the run it died in gets the launch's failure and the rest go to a new launch
    while the budget lasts. Per-config results (or ``None``) and failure."""
    backend = "nccl" if gpu else "gloo"
    width = max(c.nproc for c in configs)
    start = time.monotonic()
    outs: list[list[dict[str, Any]] | None] = [None] * len(configs)
    fails: list[Failure | None] = [None] * len(configs)
    pending = list(range(len(configs)))
    while pending:
        left = None if budget_s is None else budget_s - (time.monotonic() - start)
        if left is not None and left < 20:
            for k in pending:
                fails[k] = Failure(
                    kind="timeout", message="not run: the set's time budget (--budget) was spent"
                )
            break
        res, got = _one_launch([configs[k] for k in pending], width, backend, timeout_s, left)
        done = []
        for n, k in enumerate(pending):
            if n in got:
                outs[k], fails[k] = outcome(configs[k], got[n])
                done.append(k)
        rest = [k for k in pending if k not in done]
        if not res.ok and rest:  # the launch died in the first run it did not finish
            fails[rest[0]] = res.failure or Failure(kind="crash", message="the launch failed")
            rest = rest[1:]
        pending = rest
    return outs, fails, backend


def _workload_key(b: RunConfig) -> str:
    """What two baselines must share to be the same run (all but name and schedule)."""
    return str({k: v for k, v in b.to_json().items() if k not in ("name", "schedule")})


def _in_order(
    pairs: list[tuple[RunConfig, RunConfig]],
) -> tuple[list[RunConfig], dict[str, RunConfig]]:
    """Every run to launch, each baseline before its first candidate (after it for
    ``BASELINE_LAST``), baselines shared by runs of the same workload; and those baselines."""
    singles: dict[str, RunConfig] = {}
    group: list[RunConfig] = []
    for b, c in pairs:
        key = _workload_key(b)
        first = key not in singles
        singles.setdefault(key, b)
        if first and c.name not in BASELINE_LAST:
            group.append(b)
        group.append(c)
        if first and c.name in BASELINE_LAST:
            group.append(b)
    return group, singles


def _schedule_grid(cfg: RunConfig, out_dir: Path) -> dict[str, str]:
    """A pipeline run's schedule as a step x rank grid beside the documents (its artifact)."""
    if cfg.pp == 1 or cfg.schedule not in SCHEDULES:
        return {}
    grid = out_dir / f"schedule-{cfg.name}.txt"
    grid.write_text(format_grid(build(cfg.schedule, cfg.pp, cfg.microbatches, cfg.vpp)) + "\n")
    return {"schedule_grid": grid.name}


def run_project(
    results: Path,
    *,
    console: Any = None,
    preset: str = "cpu",
    nproc: int = 2,
    only: list[str] | None = None,
    seq: int | None = None,
    steps: int | None = None,
    timeout_s: float = 600.0,
    budget_s: float | None = None,
) -> dict[str, Path]:
    """``parlab project model-internal``: run the set, write documents, render the report.

    ``budget_s`` caps the wall time of the launches (documents are still written for
    every run: the ones not run are failures of kind ``timeout``)."""
    if nproc != 2:
        raise UsageError(f"--nproc {nproc}: the comparison set is the 2-rank set (TP2, PP2, CP2)")
    bad = [o for o in only or [] if o not in NAMES]
    if bad:
        raise UsageError(f"unknown run {bad[0]!r}: use one of {', '.join(NAMES)}")
    gpu = preset == "gpu"
    if gpu and not (torch.cuda.is_available() and torch.cuda.device_count() >= 2):
        raise UsageError("--preset gpu needs 2 CUDA GPUs: use --preset cpu here")
    pairs = [
        p for p in comparison_set(preset, seq=seq, steps=steps) if not only or p[1].name in only
    ]
    group, singles = _in_order(pairs)
    env = snapshot(probe_links=gpu)
    out_dir = results / PROJECT
    out_dir.mkdir(parents=True, exist_ok=True)
    outs, fails, backend = launch_set(group, gpu=gpu, timeout_s=timeout_s, budget_s=budget_s)
    docs: dict[str, Document] = {}
    for cfg, res, fail in zip(group, outs, fails, strict=True):
        cmd = (
            f"parlab project model-internal --preset {preset}"
            + (f" --seq {seq}" if seq else "")
            + f" --only {cfg.name}"
        )
        docs[cfg.name] = document(
            cfg,
            res,
            fail,
            command=cmd,
            backend=backend,
            environment=env,
            artifacts=_schedule_grid(cfg, out_dir),
        )
    for b, cand in pairs:  # scaling against the one-rank run of the same global batch
        add_scaling(docs[cand.name], docs[singles[_workload_key(b)].name], cand.nproc)
    for d in docs.values():
        path = write_result(d, results)
        if console is not None:
            st = "ok" if d.failure is None else f"failed ({d.failure.kind}: {d.failure.message})"
            console.print(f"{d.layout['strategy']}: {st} -> {path}")
    return render_report(list(docs.values()), out_dir, pairs=pairs)


def render_report(
    docs: list[Document], out_dir: Path, *, pairs: list[tuple[RunConfig, RunConfig]]
) -> dict[str, Path]:
    """``model-internal.md`` beside the documents: results, per-axis comm, layouts, schedules."""
    return write_markdown(
        Report(title=TITLE, blocks=blocks(docs, pairs)), out_dir / "model-internal.md", "."
    )
