"""The serving project's ``distributed-benchmark/v1`` documents (``run`` writes them atomically,
``contract.write_result``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from parlab.contract import Document, Failure, Metric, Prediction, new_run_id, now_iso
from parlab.hardware.env import snapshot
from parlab.projects.serving.config import PROJECT, Preset


def env() -> dict[str, Any]:
    return snapshot(probe_links=False)


def with_metrics(doc: Document, **changes: Any) -> Document:
    """``doc`` with metrics added (``metrics=``) and other fields replaced."""
    extra = changes.pop("metrics", {})
    return dataclasses.replace(doc, metrics={**doc.metrics, **extra}, **changes)


def replica_metrics(reps: list[dict[str, Any]]) -> dict[str, Metric]:
    """Requests the router sent to each replica (max over replicas) and the failures there."""
    return {
        "replica_load_routed": Metric(
            value=float(max(r["routed"] for r in reps)),
            unit="count",
            per_rank=[float(r["routed"]) for r in reps],
        ),
        "replica_failed": Metric(
            value=float(sum(r["failed"] for r in reps)),
            unit="count",
            per_rank=[float(r["failed"]) for r in reps],
        ),
    }


def kv_transfer_document(
    rows: list[dict[str, Any]] | None,
    failure: Failure | None,
    *,
    workload: dict[str, Any],
    backend: str,
    command: str,
) -> Document:
    """The KV transfer sweep's document: time and bandwidth per length, the fit."""
    from parlab.serve import kvxfer  # lazy: torch

    level = "real-nccl" if backend == "nccl" else "cpu-mechanism"
    base = {
        "run_id": new_run_id("serve-kvxfer"),
        "created": now_iso(),
        "project": PROJECT,
        "task": "T4",
        "evidence_level": level,
        "command": command,
        "environment": env(),
        "layout": {
            "world_size": 2,
            "strategy": "kv-transfer",
            "backend": backend,
            "src": 0,
            "dst": 1,
        },
    }
    if rows is None:
        failure = failure or Failure(kind="crash", message="KV transfer failed")
        return Document(
            **base, role="failure", workload=workload, metrics={}, status="failed", failure=failure
        )
    f = kvxfer.fit(rows)
    wrong = sum(r["wrong"] for r in rows)
    metrics = {
        "kv_transfer_bandwidth": Metric(
            value=None if f["bandwidth"] is None else f["bandwidth"] / 1e9, unit="GB/s"
        ),
        "kv_transfer_algbw_peak": Metric(
            value=max(r["bytes"] / r["time_s"] for r in rows) / 1e9, unit="GB/s"
        ),
        "kv_transfer_base": Metric(value=f["base_s"], unit="s"),
        "kv_bytes_per_token": Metric(value=float(workload["kv_bytes_per_token"]), unit="B"),
        "kv_transfer_wrong": Metric(value=float(wrong), unit="count"),
    }
    for r in rows:
        metrics[f"kv_transfer_time_{r['tokens']}tok"] = Metric(value=r["time_s"], unit="s")
        metrics[f"kv_transfer_algbw_{r['tokens']}tok"] = Metric(
            value=r["bytes"] / r["time_s"] / 1e9, unit="GB/s"
        )
    ok = wrong == 0
    return Document(
        **base,
        role="baseline" if ok else "failure",
        workload={**workload, "rows": rows},
        metrics=metrics,
        status="ok" if ok else "failed",
        failure=None if ok else Failure(kind="crash", message=f"{wrong} KV elements arrived wrong"),
        notes=[
            "time: receiver's dist.recv + device sync after a barrier, mean of the timed "
            "iterations; fit time = base + bytes / bandwidth (least squares)"
        ],
    )


def policy_document(
    doc: Document,
    *,
    stats: dict[str, Any],
    engine_stats: list[dict[str, Any]] | None,
    pred: dict[str, Any] | None,
    pred_run: tuple[dict[str, Any], str] | None,
    profile: dict[str, Any] | None,
    name: str,
) -> Document:
    """A policy run's bench document with the router's view, the replicas' batches and the
    simulator's predictions (``sim:profile``: from the idle profile; ``@in_run``: from the
    step costs the first policy's run showed)."""
    reps = stats["replicas"]
    extra = {
        "router_est_cache_hit_rate": Metric(value=stats["est_cache_hit_rate"], unit="fraction"),
        "router_decision_p99_ms": Metric(value=stats["decision"]["p99_ms"], unit="ms"),
        "router_pre_forward_p99_ms": Metric(value=stats["pre_forward"]["p99_ms"], unit="ms"),
        **replica_metrics(reps),
    }
    if engine_stats is not None:
        batches = [e.get("decode_mean_batch") for e in engine_stats]
        extra["replica_decode_batch_mean"] = Metric(
            value=None if None in batches else max(batches),  # type: ignore[type-var]
            unit="count",
            per_rank=batches,
        )
    predictions: dict[str, Prediction] = {}
    if pred is not None:
        for k in ("mean_ttft_ms", "mean_tpot_ms", "p99_ttft_ms", "mean_e2el_ms"):
            predictions[k] = Prediction(value=pred[k], unit="ms", model="sim:profile")
        predictions["cache_hit_rate"] = Prediction(
            value=pred["cache_hit_rate"], unit="fraction", model="sim:profile"
        )
    if pred_run is not None:
        run, source = pred_run
        for k in ("mean_ttft_ms", "mean_tpot_ms"):
            predictions[f"{k}@in_run"] = Prediction(
                value=run[k],
                unit="ms",
                model=f"sim:serving-step-costs-from-{source}"
                + ("-in-sample" if source == name else ""),
            )
    workload = dict(doc.workload)
    if profile is not None:
        workload["replica_profile"] = {k: v for k, v in profile.items() if k != "samples"}
    return with_metrics(doc, metrics=extra, predictions=predictions, workload=workload)


def failover_metrics(
    stats: dict[str, Any], unaccounted: int, late: int, late_ok: int, rejoined: int
) -> dict[str, Metric]:
    """The failover run's own metrics: every request accounted for, the ones after the kill,
    and the requests the restarted replica served once it rejoined."""
    reps = stats["replicas"]
    return {
        "requests_unaccounted": Metric(value=float(unaccounted), unit="count"),
        "requests_after_kill": Metric(value=float(late), unit="count"),
        "requests_after_kill_ok": Metric(value=float(late_ok), unit="count"),
        "requests_to_rejoined_replica": Metric(value=float(rejoined), unit="count"),
        **replica_metrics(reps),
        "replica_taken_out": Metric(
            value=float(sum(r["taken_out"] for r in reps)),
            unit="count",
            per_rank=[float(r["taken_out"]) for r in reps],
        ),
    }


def disagg_document(
    sim_results: tuple[dict[str, Any], dict[str, Any]],
    *,
    workload: dict[str, Any],
    kv: Document,
    p: Preset,
    n: int,
    command: str,
) -> Document:
    """Colocated vs prefill/decode split, simulated from the measured profile and transfer."""
    col, dis = sim_results
    metrics = {}
    for k in ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "request_throughput"):
        unit = "req/s" if k == "request_throughput" else "ms"
        metrics[f"colocated_{k}"] = Metric(value=col[k], unit=unit)
        metrics[f"disaggregated_{k}"] = Metric(value=dis[k], unit=unit)
    return Document(
        run_id=new_run_id("serve-disagg-sim"),
        created=now_iso(),
        project=PROJECT,
        task="T4",
        role="candidate",
        evidence_level="analytic",
        command=command,
        environment=env(),
        workload={**workload, "kv_transfer_run": kv.run_id},
        layout={
            "world_size": n,
            "strategy": "prefill-decode-split",
            "prefill_replicas": n // 2,
            "decode_replicas": n - n // 2,
        },
        metrics=metrics,
        notes=[
            "simulation (parlab.serve.sim) resting on the measured replica profile and the "
            f"measured KV transfer of run {kv.run_id}; no caching across groups assumed beyond "
            "each replica's own prefix cache"
        ],
    )
