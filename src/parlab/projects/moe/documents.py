"""A ``parlab project moe`` run's contract documents: one per routing workload, the
capacity-factor sweep, the learned routing, or the failure.

busbw follows nccl-tests: an all-to-all of S bytes per rank has busbw = S / t x (n - 1) / n.
For an exchange with uneven splits S is the mean per-rank send buffer and t the slowest rank's
time. Evidence level ``real-nccl`` (``real-training`` for learned routing) on NCCL,
``cpu-mechanism`` on gloo.
"""

from __future__ import annotations

import statistics
from typing import Any

from parlab.comm.model import busbw
from parlab.contract import Document, Metric, Prediction, new_run_id, now_iso
from parlab.ledger.traffic import traffic
from parlab.models import MoESpec
from parlab.models.router import load_stats
from parlab.models.spec import ModelSpec
from parlab.projects.moe.calibration import calibrated
from parlab.projects.moe.config import PROJECT, MoERunConfig
from parlab.projects.moe.workloads import hot_order
from parlab.topology import Topology

WORKLOAD_NOTES = [
    "tokens_routed and effective_tokens count token-expert assignments (tokens x k) before and "
    "after capacity; unserved_tokens are tokens that lost all k (only the residual carries them)",
    "times are medians over the timed forwards; each phase starts after a barrier and a device "
    "synchronisation, so a collective's time excludes waiting for a late peer and nothing overlaps",
    "busbw = S / t x (n-1)/n (nccl-tests all-to-all): S the mean per-rank send buffer, "
    "t the slowest rank's time; dispatch + combine: both buffers over both times",
    "reference all-to-all: a plain all_to_all_single with equal splits at the dispatch's mean "
    "payload, measured in the same run with the same timing",
    "unsharded_max_abs_diff: largest difference between the expert-parallel output and the "
    "unsharded layer (every expert on one device, same weights) on the same tokens",
    "layer_time: the sum over phases of the slowest rank's time (phases separated by barriers)",
]
"""What every workload document says of how it measured."""


def _evidence(backend: str, training: bool = False) -> str:
    if backend != "nccl":
        return "cpu-mechanism"
    return "real-training" if training else "real-nccl"


def _busbw(nbytes: float, seconds: float, n: int) -> float | None:
    """nccl-tests busbw of an all-to-all in GB/s; None where it does not apply (one rank)."""
    if n < 2 or seconds <= 0:
        return None
    return busbw("all_to_all", nbytes, n, seconds) / 1e9


def _document(
    cfg: MoERunConfig,
    backend: str,
    world: int,
    *,
    command: str,
    environment: dict[str, Any],
    training: bool = False,
    **fields: Any,
) -> Document:
    """A T4 document of this project: its evidence level and layout from the backend and the
    world size; ``fields``: the rest (run id, role, workload, metrics, ...)."""
    return Document(
        created=now_iso(),
        project=PROJECT,
        task="T4",
        evidence_level=_evidence(backend, training),
        command=command,
        environment=environment,
        layout=_layout(cfg, world, backend),
        **fields,
    )


def _per_rank(ranks: list[dict[str, Any]], i: int, key: str, phase: str) -> list[float]:
    return [float(r["workloads"][i][key].get(phase, 0.0)) for r in ranks]


def _loads(cfg: MoERunConfig, ranks: list[dict[str, Any]], i: int) -> dict[str, Metric]:
    """Tokens routed and kept, overflow, and the load per expert and per rank (rows computed)."""
    w0 = ranks[0]["workloads"][i]
    routed, kept = w0["routed_E"], w0["kept_E"]
    rows = [float(r["workloads"][i]["rows_computed"] or 0) for r in ranks]
    total_routed, total_kept = sum(routed), sum(kept)
    e_stats, r_stats = load_stats(routed), load_stats(rows)
    unserved = [r["workloads"][i]["unserved_tokens"] for r in ranks]
    return {
        "tokens": Metric(value=cfg.tokens * len(ranks), unit="count"),
        "tokens_routed": Metric(value=total_routed, unit="count"),
        "effective_tokens": Metric(value=total_kept, unit="count"),
        "unsharded_max_abs_diff": Metric(
            value=_max(ranks, i, "unsharded_max_abs_diff"), unit="abs"
        ),
        "output_max_abs": Metric(value=_max(ranks, i, "output_max_abs"), unit="abs"),
        "unserved_tokens": Metric(value=sum(unserved), unit="count", per_rank=unserved),
        "overflow_rate": Metric(
            value=1 - total_kept / total_routed if total_routed else 0.0, unit="fraction"
        ),
        "capacity": Metric(value=w0["capacity"], unit="count"),
        "expert_load_max_over_mean": Metric(value=e_stats["max_over_mean"], unit="ratio"),
        "expert_load_max_vio": Metric(value=e_stats["max_vio"], unit="ratio"),
        "rank_load_max_over_mean": Metric(
            value=r_stats["max_over_mean"], unit="ratio", per_rank=rows
        ),
        "rank_load_max_vio": Metric(value=r_stats["max_vio"], unit="ratio", per_rank=rows),
    }


def _max(ranks: list[dict[str, Any]], i: int, key: str) -> float:
    return max(float(r["workloads"][i][key]) for r in ranks)


def _exchanges(ranks: list[dict[str, Any]], i: int) -> dict[str, Metric]:
    """Dispatch and combine (bytes, slowest rank's time, busbw), the reference all-to-all, the
    expert compute and its slowest rank, the layer's time by phase."""
    n = len(ranks)
    w0 = ranks[0]["workloads"][i]
    d_bytes = _per_rank(ranks, i, "bytes", "dispatch")
    c_bytes = _per_rank(ranks, i, "bytes", "combine")
    d_time = _per_rank(ranks, i, "phases", "dispatch")
    c_time = _per_rank(ranks, i, "phases", "combine")
    comp = _per_rank(ranks, i, "phases", "experts")
    phase_max = {p: max(_per_rank(ranks, i, "phases", p)) for p in w0["phases"]}
    mean_comp = statistics.fmean(comp)
    d_mean, c_mean = statistics.fmean(d_bytes), statistics.fmean(c_bytes)
    ref = w0["reference_a2a"]
    a2a_bw = _busbw(d_mean + c_mean, max(d_time) + max(c_time), n)
    ref_bw = _busbw(ref["bytes"], ref["seconds"], n)
    m = {
        "dispatch_bytes": Metric(value=d_mean, unit="B", per_rank=d_bytes),
        "dispatch_time": Metric(value=max(d_time), unit="s", per_rank=d_time),
        "dispatch_busbw": Metric(value=_busbw(d_mean, max(d_time), n), unit="GB/s"),
        "combine_bytes": Metric(value=c_mean, unit="B", per_rank=c_bytes),
        "combine_time": Metric(value=max(c_time), unit="s", per_rank=c_time),
        "combine_busbw": Metric(value=_busbw(c_mean, max(c_time), n), unit="GB/s"),
        "a2a_busbw": Metric(value=a2a_bw, unit="GB/s"),
        "reference_a2a_bytes": Metric(value=ref["bytes"], unit="B"),
        "reference_a2a_time": Metric(value=ref["seconds"], unit="s"),
        "reference_a2a_busbw": Metric(value=ref_bw, unit="GB/s"),
        "a2a_busbw_vs_reference": Metric(
            value=100 * a2a_bw / ref_bw if a2a_bw and ref_bw else None, unit="%"
        ),
        "expert_compute_time": Metric(value=max(comp), unit="s", per_rank=comp),
        "slowest_rank": Metric(value=max(range(n), key=lambda r: comp[r]), unit="rank"),
        "slowest_rank_excess": Metric(
            value=100 * (max(comp) - mean_comp) / mean_comp if mean_comp > 0 else 0.0, unit="%"
        ),
        "layer_time": Metric(value=sum(phase_max.values()), unit="s"),
    }
    for p in ("route", "permute", "plan", "regroup", "ungroup", "unpermute"):
        if p in phase_max:
            m[f"{p}_time"] = Metric(value=phase_max[p], unit="s")
    return m


def _naive(ranks: list[dict[str, Any]], i: int, layer_time: float | None) -> dict[str, Metric]:
    """The naive (all-gather + reduce-scatter) layer's time, bytes and difference."""
    w0 = ranks[0]["workloads"][i]
    if "naive_phases" not in w0:
        return {}
    nv = {
        p: max(float(r["workloads"][i]["naive_phases"][p]) for r in ranks)
        for p in w0["naive_phases"]
    }
    m = {
        "naive_layer_time": Metric(value=sum(nv.values()), unit="s"),
        "naive_gather_time": Metric(value=nv.get("gather"), unit="s"),
        "naive_scatter_time": Metric(value=nv.get("scatter"), unit="s"),
        "naive_gather_bytes": Metric(value=float(w0["naive_bytes"].get("gather", 0)), unit="B"),
        "naive_scatter_bytes": Metric(value=float(w0["naive_bytes"].get("scatter", 0)), unit="B"),
        "naive_max_abs_diff": Metric(value=_max(ranks, i, "naive_max_abs_diff"), unit="abs"),
    }
    if layer_time:
        m["naive_over_a2a_time"] = Metric(value=sum(nv.values()) / layer_time, unit="ratio")
    return m


def workload_document(
    cfg: MoERunConfig,
    ranks: list[dict[str, Any]],
    i: int,
    *,
    tag: str,
    command: str,
    environment: dict[str, Any],
    calibration: dict[str, Any] | None = None,
) -> Document:
    """The document of workload ``i`` (uniform or zipf:s) from every rank's results."""
    n = len(ranks)
    w0 = ranks[0]["workloads"][i]
    name = w0["name"]
    m = {**_loads(cfg, ranks, i), **_exchanges(ranks, i)}
    m |= _naive(ranks, i, m["layer_time"].value)
    notes = list(WORKLOAD_NOTES)
    if n == 1:
        notes.append("one rank: the exchanges are local copies, so busbw does not apply (unknown)")
    predictions: dict[str, Prediction] = {}
    ledger = ledger_dispatch_bytes(cfg, ranks[0]["dtype"])
    if ledger is not None:
        predictions["dispatch_bytes"] = Prediction(
            value=ledger, unit="B", model="ledger.traffic (dropless, all-to-all@ep forward)"
        )
    from_sweep, cal_workload = calibrated(ranks, m, calibration)
    predictions |= from_sweep
    return _document(
        cfg,
        ranks[0]["backend"],
        n,
        command=command,
        environment=environment,
        run_id=f"{tag}-{name.replace(':', '')}",
        role="baseline" if name == "uniform" else "candidate",
        workload={
            "kind": "uniform" if name == "uniform" else "zipf",
            "name": name,
            "zipf_s": w0["skew"],
            "routing": "expert choices drawn from Zipf(s) over experts; gate weights are the "
            "router's scores at the drawn experts",
            "hot_experts": cfg.hot,
            "zipf_rank_to_expert": hot_order(cfg.experts, cfg.ep, cfg.hot),
            "tokens_per_rank": cfg.tokens,
            "hidden": cfg.hidden,
            "ffn_hidden": cfg.ffn_hidden,
            "dtype": ranks[0]["dtype"],
            "warmup": cfg.warmup,
            "iters": cfg.iters,
            "per_expert_routed": w0["routed_E"],
            "per_expert_kept": w0["kept_E"],
            "dispatch_plan": [r["workloads"][i]["send_counts"] for r in ranks],
            "expert_impl": w0.get("expert_impl"),
            "phases": {p: _per_rank(ranks, i, "phases", p) for p in w0["phases"]},
            "reference_a2a_curve": ranks[0]["reference_a2a"],
            "calibration_a2a": cal_workload,
        },
        metrics=m,
        predictions=predictions,
        notes=notes,
    )


def ledger_dispatch_bytes(cfg: MoERunConfig, dtype: str) -> int | None:
    """The analytic ledger's all-to-all payload per rank for this layer (None if unavailable)."""
    try:
        spec = ModelSpec(
            name="moe-layer", vocab_size=8, hidden=cfg.hidden, layers=1, heads=1,
            ffn_hidden=cfg.ffn_hidden, max_seq_len=cfg.tokens,
            moe=MoESpec(num_experts=cfg.experts, top_k=cfg.topk, expert_ffn_hidden=cfg.ffn_hidden),
        )  # fmt: skip
        topo = Topology(world_size=cfg.ep, dp=cfg.ep, ep=cfg.ep)
        policy = "bf16-mixed" if dtype == "bf16" else "fp32"
        items = traffic(spec, topo, "ddp", micro_batch=1, seq_len=cfg.tokens, dtype=policy)
    except (ValueError, TypeError, AttributeError):
        return None
    for it in items:
        if it.collective == "all-to-all" and it.axis == "ep" and it.phase == "forward":
            return it.payload_bytes
    return None


def _layout(cfg: MoERunConfig, n: int, backend: str) -> dict[str, Any]:
    L = cfg.experts // cfg.ep
    return {
        "world_size": n,
        "mesh": {"ep": cfg.ep},
        "strategy": "expert-parallel (all_to_all dispatch/combine)",
        "backend": backend,
        "experts": cfg.experts,
        "top_k": cfg.topk,
        "gating": cfg.gating,
        "capacity_factor": cfg.capacity_factor if cfg.drop != "none" else None,
        "drop_policy": cfg.drop,
        "experts_per_rank": L,
        "expert_placement": [list(range(r * L, (r + 1) * L)) for r in range(cfg.ep)],
    }


def sweep_document(
    cfg: MoERunConfig,
    ranks: list[dict[str, Any]],
    *,
    tag: str,
    command: str,
    environment: dict[str, Any],
) -> Any:
    rows = ranks[0]["sweep"]
    for r in rows:
        r["overflow_rate"] = 1 - r["kept"] / r["routed"] if r["routed"] else 0.0
    m: dict[str, Metric] = {}
    for name, _ in cfg.workloads():
        mine = [r for r in rows if r["workload"] == name]
        clean = [r["capacity_factor"] for r in mine if r["kept"] == r["routed"]]
        key = name.replace(":", "")
        m[f"min_dropless_capacity_factor_{key}"] = Metric(
            value=min(clean) if clean else None, unit="factor"
        )
        for r in mine:
            m[f"overflow_rate_{key}_cf{r['capacity_factor']:g}"] = Metric(
                value=r["overflow_rate"], unit="fraction"
            )
    policy = cfg.drop if cfg.drop != "none" else "position"
    return _document(
        cfg,
        ranks[0]["backend"],
        len(ranks),
        command=command,
        environment=environment,
        run_id=f"{tag}-capacity-sweep",
        role="baseline",
        workload={
            "kind": "capacity-factor sweep",
            "tokens_per_rank": cfg.tokens,
            "drop_policy": policy,
            "sweep": rows,
        },
        metrics=m,
        notes=[
            "overflow = 1 - kept / routed assignments, capacity counted per rank's tokens; routing only "
            "(the same draws as the workloads' law, no exchange); 'min_dropless' is the smallest swept "
            "factor with no drop (unknown if none)"
        ],
    )


def training_document(
    cfg: MoERunConfig,
    ranks: list[dict[str, Any]],
    *,
    tag: str,
    command: str,
    environment: dict[str, Any],
) -> Any:
    runs = ranks[0]["training"]
    m: dict[str, Metric] = {}
    for j, run in enumerate(runs):
        st = run["steps"]
        mode = run["mode"]
        m[f"max_vio_first_{mode}"] = Metric(value=st[0]["max_vio"], unit="ratio")
        m[f"max_vio_last_{mode}"] = Metric(value=st[-1]["max_vio"], unit="ratio")
        m[f"overflow_rate_last_{mode}"] = Metric(value=st[-1]["overflow"], unit="fraction")
        m[f"loss_last_{mode}"] = Metric(value=st[-1]["loss"], unit="mse")
        slow = [max(r["training"][j]["steps"][k]["seconds"] for r in ranks) for k in range(len(st))]
        m[f"step_time_{mode}"] = Metric(value=statistics.median(slow[1:] or slow), unit="s")
    return _document(
        cfg,
        ranks[0]["backend"],
        len(ranks),
        command=command,
        environment=environment,
        training=True,
        run_id=f"{tag}-learned-routing",
        role="candidate",
        workload={
            "kind": "learned routing",
            "data": f"tokens from {4 * cfg.experts} Gaussian clusters, cluster frequencies "
            f"Zipf({cfg.skews[0] if cfg.skews else 1.0:g}); target tanh(x A)",
            "tokens_per_rank": cfg.tokens,
            "steps": cfg.train_steps,
            "optimizer": f"Adam lr {cfg.train_lr:g} on the mean loss of the ep ranks (the "
            "replicated router's gradient summed over them)",
            "aux_coeff": cfg.aux_coeff,
            "bias_rate": cfg.bias_rate,
            "per_step": {run["mode"]: run["steps"] for run in runs},
        },
        metrics=m,
        notes=["MaxVio = (max - mean) / mean of the tokens routed to each expert, over all ranks"],
    )


def failure_document(
    cfg: MoERunConfig, failure: Any, *, command: str, environment: dict[str, Any], backend: str
) -> Any:
    return _document(
        cfg,
        backend,
        cfg.ep,
        command=command,
        environment=environment,
        run_id=new_run_id(f"moe-ep{cfg.ep}-failed"),
        role="failure",
        workload={
            "tokens_per_rank": cfg.tokens,
            "hidden": cfg.hidden,
            "ffn_hidden": cfg.ffn_hidden,
        },
        metrics={},
        status="failed",
        failure=failure,
    )
