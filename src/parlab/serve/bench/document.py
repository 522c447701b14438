"""The ``serving-benchmark`` contract document of one ``parlab bench serve`` run."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from parlab.contract import Document, Failure, Metric, new_run_id, now_iso
from parlab.hardware.env import snapshot
from parlab.serve.bench.config import BenchConfig, BenchResult
from parlab.serve.datasets import Dataset

PROJECT = "PAR-DISTRIBUTED-INFERENCE"


def _unit(name: str) -> str:
    if name.endswith("_ms"):
        return "ms"
    if name == "duration":
        return "s"
    if name in ("request_throughput", "request_goodput"):
        return "req/s"
    if name.endswith("_throughput"):
        return "tokens/s"
    if name == "cache_hit_rate":
        return "fraction"
    return "count"


def _metrics(result: BenchResult) -> dict[str, Metric]:
    """The summary's metrics, the dispatch lag and, where a router names them, the replicas."""
    none_done = result.summary["completed"] == 0  # no latency was measured: unknown, not 0 ms
    metrics = {
        k: Metric(
            value=None if v is None or (none_done and k.endswith("_ms")) else float(v),
            unit=_unit(k),
        )
        for k, v in result.summary.items()
    }
    metrics["dispatch_lag_p99_ms"] = Metric(value=result.dispatch_lag_ms["p99"], unit="ms")
    metrics["dispatch_lag_max_ms"] = Metric(value=result.dispatch_lag_ms["max"], unit="ms")
    if result.replicas:
        names = sorted(result.replicas)
        metrics["requests_per_replica"] = Metric(
            value=float(max(result.replicas.values())),
            unit="count",
            per_rank=[float(result.replicas[n]) for n in names],
        )
    return metrics


def _failure(result: BenchResult) -> Failure | None:
    """The ``Failure`` of a run in which no request succeeded, else None."""
    if result.summary["completed"] != 0:
        return None
    top = next(iter(result.errors), "no request was sent")
    return Failure(
        kind="timeout" if top.startswith(("timeout", "cancelled")) else "crash",
        message=f"no request succeeded ({len(result.outcomes)} sent); most common error: {top}",
    )


def _notes(result: BenchResult, dataset: Dataset, notes: Sequence[str]) -> list[str]:
    """``notes``, then the dataset's skipped lines and the most common request failures."""
    all_notes = list(notes)
    if dataset.bad_lines:
        shown = ", ".join(f"line {n}: {why}" for n, why in dataset.bad_lines[:5])
        all_notes.append(f"{len(dataset.bad_lines)} bad dataset line(s) skipped ({shown})")
    if result.errors:
        all_notes.append(
            "failed requests: "
            + "; ".join(f"{n} x {e}" for e, n in list(result.errors.items())[:5])
        )
    return all_notes


def _workload(result: BenchResult, cfg: BenchConfig, dataset: Dataset) -> dict[str, Any]:
    """What was sent: the dataset, the API, the arrival settings, the SLOs and the target."""
    return {
        "dataset": dataset.name,
        "dataset_params": dataset.params,
        "num_requests": len(dataset.requests),
        "bad_lines": [{"line": n, "reason": why} for n, why in dataset.bad_lines],
        "api": cfg.api,
        "stream": cfg.stream,
        "model": result.model,
        "request_rate": None if math.isinf(cfg.request_rate) else cfg.request_rate,
        "burstiness": cfg.burstiness,
        "max_concurrency": cfg.max_concurrency,
        "seed": cfg.seed,
        "slo_ms": cfg.slo.to_json() if cfg.slo else {},
        "percentiles": list(cfg.percentiles),
        "target": cfg.base_url,
    }


def to_document(
    result: BenchResult,
    cfg: BenchConfig,
    dataset: Dataset,
    *,
    command: str,
    role: str = "baseline",
    layout: dict[str, Any] | None = None,
    notes: Sequence[str] = (),
    artifacts: dict[str, str] | None = None,
    run_id: str | None = None,
) -> Document:
    """The ``serving-benchmark`` contract document of one run."""
    failure = _failure(result)
    return Document(
        run_id=run_id or new_run_id("serve-bench"),
        created=now_iso(),
        project=PROJECT,
        task="T4",
        role="failure" if failure is not None else role,
        evidence_level="serving-benchmark",
        command=command,
        environment=snapshot(probe_links=False),
        workload=_workload(result, cfg, dataset),
        layout={"world_size": 1, "strategy": "serving", **(layout or {})},
        metrics=_metrics(result),
        status="failed" if failure is not None else "ok",
        failure=failure,
        notes=_notes(result, dataset, notes),
        artifacts=artifacts or {},
    )
