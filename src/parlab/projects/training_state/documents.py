"""A training-state run's contract document: its measurements and the ledger's predictions.

Role ``baseline`` for ``ddp``, ``candidate`` for the rest, ``failure`` when a rank failed (an
``oom`` carries the ledger's prediction too). Evidence level: ``real-training`` on NCCL,
``cpu-mechanism`` on gloo.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from parlab.contract import Document, Failure, Metric, Prediction, new_run_id, now_iso
from parlab.errors import UsageError
from parlab.hardware.catalog import peak_flops
from parlab.hardware.env import snapshot
from parlab.ledger import DtypePolicy, Implementation, models_compiled, predict
from parlab.ledger.traffic import traffic
from parlab.models import flops, get_spec
from parlab.models.flops import training_flops_per_token
from parlab.models.reference import norm_kernel
from parlab.parallel.deepspeed import REDUCE_BUCKET, deepspeed_version, ds_config
from parlab.plan.fit.calibrate import predict_planned
from parlab.plan.fit.requests import request_of
from parlab.profile.capture import ENV_DIR as PROFILE_ENV_DIR
from parlab.projects.training_state.config import (
    MASTER_ITEMS,
    PROJECT,
    STATE_ITEMS,
    TrainConfig,
    ledger_strategy,
)
from parlab.runtime import meters
from parlab.topology import Topology

FP32_MASTER = DtypePolicy(
    name="fp32-master", param_bytes=4, grad_bytes=4, master_bytes=4, state_bytes=4,
    compute_bytes=4, residual_bytes=4, autocast=False,
)  # fmt: skip
"""The ledger's policy for DeepSpeed's ZeRO in fp32: an fp32 master partition cloned beside the
fp32 parameters (seen on gloo CPU ranks in all three stages)."""
DEEPSPEED_NOTES = [
    "deepspeed: ledger zero1/2/3 with DeepSpeed's master partition (bf16-params, or fp32 "
    "params with an fp32 master) and its gradient bucket as the ledger's explicit "
    "allocator_overhead (reduce_bucket_size elements); stage 1 reduces in buckets during "
    "backward and keeps only this rank's gradient partition, where the ledger's zero1 keeps "
    "them whole; it flattens each parameter group into one padded buffer "
    "(the ledger pads per unit), partitions ZeRO-3 parameters one by one and keeps those under "
    "stage3_param_persistence_threshold (1e5 elements) whole on every rank, and may keep "
    "gathered ZeRO-3 parameters for reuse in backward (stage3_max_live_parameters, "
    "stage3_max_reuse_distance: 1e9 elements), which the ledger does not model",
    "deepspeed: grads are what backward leaves, master_grads the fp32 gradient at the optimizer "
    "step (DeepSpeed frees both in its step; the metered step holds them until counted; stage 3 "
    "steps sub-groups of 1e9 elements one at a time: its largest, where the ledger counts the "
    "whole partition); its "
    "collectives are its own (bucketed gradient all-reduce or reduce-scatter, ZeRO-3 gathers "
    "per module): the ledger's comm table is parlab's ZeRO's",
]


def implementation(cfg: TrainConfig, backend: str) -> Implementation:
    """How ``parlab train`` builds the run ``cfg``: the blocks' kernels (``torch.compile``'d, or
    the reference model's eager norm on this backend), DDP's gradients as views of its buckets,
    kept on one rank too (torch DDP and parlab's bucketed DDP), torch DDP's one bucket rebuild
    (the loop releases the first step's buckets: ``TorchDDP.release_first_buckets``), and the
    model's output kept in ``logits`` through backward."""
    return Implementation(
        norm_kernel="compiled" if cfg.compile else norm_kernel(_device(backend)),
        bucket_view=True,
        ddp_one_rank=cfg.strategy in ("ddp", "ddp-bucket"),
        ddp_rebuild=cfg.strategy == "ddp",
        logits_held=True,
    )


def _device(backend: str) -> str:
    return "cuda" if backend == "nccl" else "cpu"


def ledger_predictions(cfg: TrainConfig, backend: str) -> tuple[dict[str, Prediction], list[str]]:
    """The ledger's predictions for this run: state bytes per item, peak memory, comm per step.

    Comm predictions are left out for the naive forms (they move different collectives
    than the ledger's table, on purpose).
    """
    spec = get_spec(cfg.model)
    topo = Topology(world_size=cfg.nproc, dp=cfg.dp)
    strategy = ledger_strategy(cfg.strategy)
    shard = cfg.shard_size if strategy == "fsdp-hybrid" else None
    dtype: Any = cfg.dtype  # the ledger's recipes are train's (parlab.dtypes)
    deepspeed = cfg.strategy.startswith("deepspeed")
    if deepspeed:
        # DeepSpeed's ZeRO keeps an fp32 master partition apart from the parameters: bf16
        # parameters and gradients with it (bf16-params), or, in fp32, a second fp32 copy
        dtype = "bf16-params" if cfg.dtype == "bf16-params" else FP32_MASTER
    optimizer = "adamw-fused" if cfg.optimizer == "adamw" and backend == "nccl" else cfg.optimizer
    common = {"micro_batch": cfg.per_rank_batch, "seq_len": cfg.seq, "dtype": dtype}
    # parlab train's "selective" keeps every matmul and attention output: the ledger's
    # op-selective policy
    recompute = "op-selective" if cfg.recompute == "selective" else cfg.recompute
    impl = implementation(cfg, backend)
    # torch.compile: the compiled blocks where the ledger models them, else the eager ones
    compiled = cfg.compile and models_compiled(
        spec, dtype=dtype, strategy=strategy, recompute=recompute
    )
    if cfg.compile and not compiled:
        impl = replace(impl, norm_kernel=norm_kernel(_device(backend)))
    led = predict(
        spec, strategy=strategy, topology=topo, optimizer=optimizer, recompute=recompute,
        shard_size=shard, reshard_after_forward=cfg.reshard_after_forward, impl=impl,
        # DeepSpeed: its gradient bucket (reduce_bucket_size elements in the gradient dtype),
        # alive through backward (stages 1/2) or for good (stage 3)
        overhead_bytes=REDUCE_BUCKET * (2 if cfg.dtype == "bf16-params" else 4) if deepspeed else 0,
        **common,
    )  # fmt: skip
    model = f"ledger:{strategy}"
    preds = {
        f"state_bytes.{item}": Prediction(value=led.value(item), unit="B", model=model)
        for item in STATE_ITEMS + (MASTER_ITEMS if cfg.dtype == "bf16-params" or deepspeed else ())
    }
    preds["peak_memory"] = Prediction(value=led.peak_bytes, unit="B", model=model)
    notes = [f"ledger peak phase: {led.peak_phase[0]}"]
    if cfg.compile:
        notes.append(
            "torch.compile: the ledger's compiled blocks (SwiGLU's silu output recomputed)"
            if compiled
            else f"torch.compile: the ledger's eager blocks ({impl.norm_kernel}; it models "
            "compiled blocks for dense SwiGLU models without autocast)"
        )
    if deepspeed:
        notes += DEEPSPEED_NOTES
    if cfg.strategy.endswith("-naive"):
        notes.append("naive form: no comm prediction (the ledger tables the real mechanism)")
        return preds, notes
    return preds | _comm_predictions(cfg, topo, shard=shard, **common), notes


def _comm_predictions(
    cfg: TrainConfig, topo: Topology, *, shard: int | None, **common: Any
) -> dict[str, Prediction]:
    """The ledger's wire table for the run: bytes per step, in all and per collective."""
    strategy = ledger_strategy(cfg.strategy)
    wire = traffic(
        get_spec(cfg.model),
        topo,
        strategy,
        shard_size=shard,
        reshard_after_forward=cfg.reshard_after_forward,
        bucket_bytes=int(cfg.bucket_mb * 2**20),
        **common,
    )
    by_op: dict[str, int] = {}
    for w in wire:
        op = w.collective.replace("-", "_")
        by_op[op] = by_op.get(op, 0) + w.total_bytes
    model = f"ledger.traffic:{strategy}"
    preds = {"comm_bytes_per_step": Prediction(value=sum(by_op.values()), unit="B", model=model)}
    for op, b in by_op.items():
        preds[f"comm_bytes_per_step.{op}"] = Prediction(value=b, unit="B", model=model)
    return preds


def _deepspeed_knobs(cfg: TrainConfig) -> dict[str, Any]:
    """DeepSpeed's version and the config the run passed to ``deepspeed.initialize``."""
    config = ds_config(
        int(cfg.strategy[-1]), cfg.per_rank_batch, cfg.dp, bf16=cfg.dtype == "bf16-params"
    )
    return {"version": deepspeed_version(), "config": config}


def _per_rank(results: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in results]


def _slowest(results: list[dict[str, Any]], key: str, unit: str) -> Metric:
    """The metric ``key`` of every rank, its value the largest (the rank that sets the run)."""
    per = _per_rank(results, key)
    return Metric(value=max(per), unit=unit, per_rank=per)


def layout(cfg: TrainConfig, backend: str) -> dict[str, Any]:
    """The document's ``layout``: the strategy over the data-parallel mesh, and its knobs."""
    mesh = (
        {"dp_replicate": cfg.nproc // cfg.shard_size, "dp_shard": cfg.shard_size}
        if cfg.strategy == "fsdp-hybrid"
        else {"dp": cfg.dp}
    )
    return {
        "world_size": cfg.nproc,
        "mesh": mesh,
        "strategy": cfg.strategy,
        "knobs": {
            "recompute": cfg.recompute,
            "compile": cfg.compile,
            "reshard_after_forward": cfg.reshard_after_forward,
            "bucket_mb": cfg.bucket_mb,
            "dtype": cfg.dtype,
            "memory_cap": cfg.memory_cap,
            "norm_kernel": norm_kernel(_device(backend)),
            **(
                {"deepspeed": _deepspeed_knobs(cfg)} if cfg.strategy.startswith("deepspeed") else {}
            ),
            # torch DDP: the first step's buckets are released before the second step
            **({"ddp_first_buckets": "released"} if cfg.strategy == "ddp" else {}),
            # under ``parlab profile run``: the profiled steps' times include the profiler's
            **({"profiled": True} if os.environ.get(PROFILE_ENV_DIR) else {}),
            # Python's garbage collection by hand every N steps (0/absent: automatic)
            **({"manual_gc": cfg.manual_gc} if cfg.manual_gc else {}),
            # ranks bound to the CPUs near their GPUs (GPU runs; CPU ranks are never bound)
            **(
                {"numa_binding": cfg.numa_binding} if cfg.numa_binding and backend == "nccl" else {}
            ),
        },
    }


def _workload(cfg: TrainConfig) -> dict[str, Any]:
    spec = get_spec(cfg.model)
    return {
        "model": spec.to_json(),
        "preset": cfg.model,
        "params": spec.num_params(),
        "global_batch": cfg.batch,
        "micro_batch": cfg.per_rank_batch,
        "seq": cfg.seq,
        "steps": cfg.steps,
        "warmup": cfg.warmup,
        "optimizer": cfg.optimizer,
        "lr": cfg.lr,
        "dataset": {"kind": "text-bytes", "path": cfg.data}
        if cfg.data
        else {"kind": "synthetic", "seed": cfg.seed, "vocab_size": spec.vocab_size},
    }


def _speed(cfg: TrainConfig, results: list[dict[str, Any]], notes: list[str]) -> dict[str, Metric]:
    """Step time, throughput and MFU (the slowest rank's steps), peak memory and the
    allocator's retries."""
    r0 = results[0]
    step_time = meters.median(meters.slowest_rank_steps(results))
    tps = r0["tokens_per_step"] / step_time if step_time > 0 else None
    fpt = training_flops_per_token(get_spec(cfg.model), cfg.seq)  # 6 N + 12 L H Q T
    dtype = "fp32" if cfg.dtype == "fp32" else "bf16"
    mfu = flops.mfu(tps, fpt, 1, peak_flops(r0["device"], dtype)) if tps else None
    if mfu is None:
        notes.append(f"mfu unknown: device {r0['device']!r} has no peak in the catalog")
    m = {
        "tokens_per_s_per_gpu": Metric(value=tps, unit="tokens/s"),
        "step_time": Metric(value=step_time, unit="s", per_rank=None),
        "peak_memory": _slowest(results, "peak_memory", "B"),
        "mfu": Metric(value=mfu, unit="fraction"),
    }
    if r0.get("alloc_retries") is not None:  # CUDA: the caching allocator's own counters
        m["peak_reserved"] = _slowest(results, "peak_reserved", "B")
        m["alloc_retries"] = _slowest(results, "alloc_retries", "count")
    if r0.get("alloc_retries"):
        notes.append(
            f"the caching allocator retried {int(max(_per_rank(results, 'alloc_retries')))} "
            "allocation(s) in the timed steps (freed its cache, synchronizing the device): "
            "the run is at its memory edge and its step time includes those stalls"
        )
    return m


def _comm_and_state(results: list[dict[str, Any]], notes: list[str]) -> dict[str, Metric]:
    """The metered step's collectives per op, their replayed time, the state bytes per item."""
    r0 = results[0]
    m: dict[str, Metric] = {}
    if r0.get("comm_metered", True):
        m["comm_time"] = _slowest(results, "comm_time", "s")
        m["comm_bytes_per_step"] = _slowest(results, "comm_bytes_per_step", "B")
        for op in sorted(r0["comm_by_op"]):
            per = [float(r["comm_by_op"].get(op, {}).get("bytes", 0)) for r in results]
            m[f"comm_bytes_per_step.{op}"] = Metric(value=max(per), unit="B", per_rank=per)
            cnt = [float(r["comm_by_op"].get(op, {}).get("count", 0)) for r in results]
            m[f"comm_count_per_step.{op}"] = Metric(value=max(cnt), unit="count", per_rank=cnt)
    else:
        m["comm_time"] = Metric(value=None, unit="s")
        m["comm_bytes_per_step"] = Metric(value=None, unit="B")
        notes.append("comm not metered: the run uses torch.compile")
    for item in r0["state_bytes"]:
        per = [float(r["state_bytes"][item]) for r in results]
        m[f"state_bytes.{item}"] = Metric(value=max(per), unit="B", per_rank=per)
    return m


def _measured(
    cfg: TrainConfig, results: list[dict[str, Any]], backend: str, notes: list[str]
) -> tuple[dict[str, Metric], dict[str, Any]]:
    """Every rank's returns as metrics, and what the workload records of the run itself."""
    r0 = results[0]
    metrics = {**_speed(cfg, results, notes), **_comm_and_state(results, notes)}
    losses = r0["losses"]
    metrics["loss_first"] = Metric(value=losses[0], unit="nats")
    metrics["loss_last"] = Metric(value=losses[-1], unit="nats")
    notes.append(
        f"peak memory source: {r0['memory_source']}; comm_time: the metered step's "
        "collectives replayed alone, one after another (not the exposed time)"
    )
    if backend == "gloo":
        notes.append("gloo CPU ranks: proves the mechanism and its bytes, not GPU speed")
    recorded = {
        "losses": losses,
        # every measured step (its slowest rank): the spread behind the median step_time
        "step_times": meters.slowest_rank_steps(results),
        # rank 0's timed steps by phase: the host's time to issue each, the device's
        **({"phase_times": r0["phase_times"]} if "phase_times" in r0 else {}),
    }
    return metrics, recorded


def document(
    cfg: TrainConfig,
    results: list[dict[str, Any]] | None,
    failure: Failure | None,
    *,
    command: str,
    backend: str,
    environment: dict[str, Any] | None = None,
    step_prediction: tuple[Prediction | None, str] | None = None,
) -> Document:
    """The contract document of one run (``results``: every rank's ``train_rank`` return;
    ``step_prediction``: the step time predicted before the run, or None and why not)."""
    try:
        preds, notes = ledger_predictions(cfg, backend)
    except ValueError as exc:  # the ledger cannot model this layout: say so, predict nothing
        preds, notes = {}, [f"no ledger prediction: {exc}"]
    if step_prediction is not None:
        made, why = step_prediction
        if made is not None:
            preds["step_time"] = made
        if why:
            notes.append(why)
    metrics, recorded = _measured(cfg, results, backend, notes) if results else ({}, {})
    return Document(
        run_id=new_run_id(f"train-{cfg.strategy}-{cfg.model}"),
        created=now_iso(),
        project=PROJECT,
        task="T2",
        role=cfg.role if failure is None else "failure",
        evidence_level="real-training" if backend == "nccl" else "cpu-mechanism",
        command=command,
        environment=environment or snapshot(probe_links=backend == "nccl"),
        workload={**_workload(cfg), **recorded},
        layout=layout(cfg, backend),
        metrics=metrics,
        predictions=preds,
        status="ok" if failure is None else "failed",
        failure=failure,
        notes=notes,
    )


def predict_step(
    cfg: TrainConfig, *, command: str, backend: str, environment: dict[str, Any], root: Path
) -> tuple[Prediction | None, str]:
    """The step time the lab predicts for ``cfg`` before it runs, from the documents under
    ``root``: the plan request and candidate of its configuration
    (``parlab.plan.fit.requests.request_of``) under the roofline fitted there
    (``predict_planned``), as ``benchmarks/plan_accuracy.py`` predicts a run; and a note.
    (None, why) where they do not describe the run."""
    gpus = (environment.get("hardware") or {}).get("gpus") or []
    if not gpus:
        return None, "no step-time prediction: no GPU here (CPU ranks)"
    rc = "op-selective" if cfg.recompute == "selective" else cfg.recompute  # the runtime's
    impl = implementation(cfg, backend)
    try:
        req, cand, sp = request_of(
            model=cfg.model, gpu=str(gpus[0]["name"]), gpus_per_node=len(gpus), world=cfg.nproc,
            strategy=cfg.strategy, mesh={"dp": cfg.nproc}, micro_batch=cfg.micro_batch,
            global_batch=cfg.global_batch or cfg.micro_batch * cfg.nproc, seq=cfg.seq,
            dtype=cfg.dtype, recompute=rc, impl=impl,
        )  # fmt: skip
        made = predict_planned(req, cand, sp=sp, root=root)
    except UsageError as exc:
        return None, f"no step-time prediction from {root}: {exc}"
    if made is None:
        return (
            None,
            f"no step-time prediction: the roofline fitted under {root} does not describe this "
            "run (another GPU, or CPU ranks)",
        )
    step, how = made
    return (
        Prediction(value=step, unit="s", model=f"roofline: {how}"),
        f"step time predicted before the run: {step:.3f} s ({how})",
    )
