"""A model-internal run's contract document: its measurements, the ledger's and the bubble
formula's predictions, and its scaling against the one-rank run of the same global batch.

Evidence level ``real-training`` on NCCL, ``cpu-mechanism`` on gloo; role ``baseline`` for the
one-rank runs, ``candidate`` for the layouts, ``failure`` when a rank failed.
"""

from __future__ import annotations

from typing import Any

from parlab.contract import Document, Failure, Metric, Prediction, new_run_id, now_iso
from parlab.hardware.catalog import peak_flops
from parlab.ledger import Implementation, models_compiled, predict
from parlab.ledger.traffic import traffic
from parlab.models import flops, get_spec
from parlab.models.flops import training_flops_per_token
from parlab.models.reference import norm_kernel
from parlab.parallel.pipeline_schedules import SCHEDULES, formula
from parlab.projects.model_internal.config import PROJECT, RunConfig
from parlab.runtime import meters
from parlab.topology import Topology

NOTE_MEASURED = (
    "activation_bytes: the metered step's peak above what was live before it; "
    "comm_bytes_per_step.<axis>: parlab's own transfers on that axis, nccl-tests sizes for "
    "collectives and the bytes this rank sent for send/recv (received bytes not added); "
    "comm_time.<axis>: that step's transfers replayed alone on the axis's group (time on the "
    "wire, not the exposed time); c10d_bytes_per_step.<op>: every c10d collective of that step "
    "on any axis (the shared comm meter), DDP's gradient all-reduce over CP ranks included"
)
NOTE_BUBBLE = (
    "pp_bubble: idle / step time of the busiest stage (1 - busy/step, busy = forward + "
    "backward compute timed per action), i.e. fill and drain only; pp_idle_mean adds the "
    "other stages' wait for it (stage imbalance)"
)


def implementation(cfg: RunConfig, norm: str, sp_gather: str = "shared") -> Implementation:
    """How the run ``cfg`` is built, with its blocks' ``norm`` kernel: parlab's TP splits the
    output layer and the loss over the vocabulary, torch's plan (``apply_torch_tensor_parallel``)
    keeps embeddings and output whole, the logits replicated; parlab's SP saves the gathered
    sequence as its linears' input (``tensor_comm``; ``sp_gather`` as ``predictions`` takes it);
    the step without a schedule keeps the model's output (``out``) through backward."""
    parlab_sp = cfg.sp and cfg.impl == "parlab"
    return Implementation(
        norm_kernel=norm,
        sp_saves_gathered=parlab_sp,
        sp_gather=sp_gather if parlab_sp else "shared",
        vocab_parallel=cfg.impl == "parlab",
        loss_parallel=cfg.tp > 1 and cfg.impl == "parlab",
        logits_held=cfg.pp == 1 and cfg.microbatches == 1,
    )


def predictions(
    cfg: RunConfig, backend: str = "nccl", norm: str | None = None, sp_gather: str = "shared"
) -> tuple[dict[str, Prediction], list[str]]:
    """Ledger (bytes, wire table per axis) and bubble-formula predictions for ``cfg``
    (``backend`` nccl: CUDA kernels, e.g. the fused RMSNorm; gloo: CPU; ``norm`` overrides
    the ledger's ``norm_kernel``; ``sp_gather="per-linear"``: parlab's SP as it was before
    commit 02e7fd8, each linear saving its own copy of the gathered sequence -- the runs whose
    documents record no ``sp_saved_input``)."""
    spec = get_spec(cfg.model)
    topo = Topology(world_size=cfg.nproc, tp=cfg.tp, pp=cfg.pp, cp=cfg.cp)
    out: dict[str, Prediction] = {}
    notes: list[str] = []
    dt = "bf16" if cfg.dtype == "bf16" else "fp32"
    kw = {
        "topology": topo,
        "micro_batch": cfg.micro_batch,
        "seq_len": cfg.seq,
        "microbatches": cfg.microbatches,
        "sp": cfg.sp,
        "loss_parallel": cfg.tp > 1 and cfg.impl == "parlab",
    }
    if cfg.pp > 1 and cfg.schedule not in SCHEDULES:
        notes.append(
            f"no ledger prediction: the ledger places stages as parlab's schedules do, not "
            f"{cfg.schedule!r}'s V (rank 0 holds the first and the last stage)"
        )
        return out, notes
    eager = norm_kernel("cuda" if backend == "nccl" else "cpu")
    # the ledger's compiled blocks where it models them, else eager
    if norm == "compiled" and not models_compiled(spec, dtype=dt, strategy="ddp", recompute="none"):
        notes.append(
            "torch.compile: the ledger's eager blocks (it models compiled blocks of dense SwiGLU "
            "models)"
        )
        norm = eager
    try:
        led = predict(
            spec,
            strategy="ddp",
            dtype=dt,
            pp_schedule="interleaved" if cfg.vpp > 1 else cfg.schedule,
            virtual_stages=cfg.vpp,
            impl=implementation(cfg, norm or eager, sp_gather),
            **{k: v for k, v in kw.items() if k != "loss_parallel"},
        )
        per = led.per_rank("params")
        out["param_bytes"] = Prediction(value=float(max(per)), unit="B", model="ledger")
        act = led.per_rank("activations")
        out["activation_bytes"] = Prediction(value=float(max(act)), unit="B", model="ledger")
        out["peak_memory"] = Prediction(value=float(led.peak_bytes), unit="B", model="ledger")
    except (ValueError, KeyError, TypeError) as exc:
        notes.append(f"ledger prediction unavailable: {exc}")
    try:
        wire = traffic(spec, strategy="ddp", dtype=dt, virtual_stages=cfg.vpp, **kw)
        for axis in ("tp", "pp", "cp"):
            total = sum(w.total_bytes for w in wire if w.axis == axis)
            if total:
                out[f"comm_bytes_per_step.{axis}"] = Prediction(
                    value=float(total), unit="B", model="ledger wire table"
                )
    except (ValueError, KeyError, TypeError) as exc:
        notes.append(f"wire table unavailable: {exc}")
    if cfg.pp > 1 and cfg.schedule in SCHEDULES:  # (no formula for torch's zero-bubble V)
        f = formula(cfg.schedule, cfg.pp, cfg.microbatches, cfg.vpp)
        out["pp_bubble"] = Prediction(
            value=f["of_step"],
            unit="fraction",
            model="(p-1)/(v*m+p-1) (idle / step time; v = 1 unless interleaved)",
        )
    return out, notes


def _losses(results: list[dict[str, Any]]) -> list[float | None]:
    """The losses of the rank holding the last pipeline stage (the last rank; rank 0 in
    torch's V schedule): the first rank, from the end, that has them."""
    for r in reversed(results):
        if any(v is not None for v in r["losses"]):
            return r["losses"]
    return results[-1]["losses"]


def _per_rank(results: list[dict[str, Any]], field: str, key: str, what: str) -> list[float]:
    """Every rank's ``r[field][key][what]`` (0 where a rank has none)."""
    return [float(r.get(field, {}).get(key, {}).get(what, 0)) for r in results]


def _comm(results: list[dict[str, Any]]) -> dict[str, Metric]:
    """The metered step's transfers per axis (bytes, calls, replayed time), per axis and op,
    and every c10d collective by op."""
    m: dict[str, Metric] = {}
    for a in sorted({a for r in results for a in r["comm"]}):
        b, n = _per_rank(results, "comm", a, "bytes"), _per_rank(results, "comm", a, "count")
        s = _per_rank(results, "comm", a, "time_s")
        m[f"comm_bytes_per_step.{a}"] = Metric(value=max(b), unit="B", per_rank=b)
        m[f"comm_count_per_step.{a}"] = Metric(value=max(n), unit="count", per_rank=n)
        m[f"comm_time.{a}"] = Metric(value=max(s), unit="s", per_rank=s)
    for k in sorted({k for r in results for k in r["comm_ops"]}):
        b = _per_rank(results, "comm_ops", k, "bytes")
        m[f"comm_op_bytes.{k}"] = Metric(value=max(b), unit="B", per_rank=b)
    for op in sorted({k for r in results for k in r.get("c10d_by_op", {})}):
        b = _per_rank(results, "c10d_by_op", op, "bytes")
        n = _per_rank(results, "c10d_by_op", op, "count")
        m[f"c10d_bytes_per_step.{op}"] = Metric(value=max(b), unit="B", per_rank=b)
        m[f"c10d_count_per_step.{op}"] = Metric(value=max(n), unit="count", per_rank=n)
    return m


def _measured(
    cfg: RunConfig, results: list[dict[str, Any]], backend: str, notes: list[str]
) -> dict[str, Metric]:
    """Every rank's ``mi_rank`` returns as metrics (``notes`` gains what they mean)."""
    r0 = results[0]
    t = meters.median(meters.slowest_rank_steps(results))
    tps = r0["tokens_per_step"] / t / cfg.nproc if t > 0 else None
    dt = "bf16" if cfg.dtype == "bf16" else "fp32"
    fpt = training_flops_per_token(get_spec(cfg.model), cfg.seq)  # 6 N + 12 L H Q T
    mfu = flops.mfu(tps, fpt, 1, peak_flops(r0["device"], dt)) if tps else None
    if mfu is None:
        notes.append(f"mfu unknown: device {r0['device']!r} has no catalog peak for {dt}")
    m = {
        "step_time": Metric(value=t, unit="s"),
        "tokens_per_s_per_gpu": Metric(value=tps, unit="tokens/s"),
        "mfu": Metric(value=mfu, unit="fraction"),
    }
    for key in ("peak_memory", "param_bytes", "activation_bytes"):
        per = [float(r[key]) for r in results]
        m[key] = Metric(value=max(per), unit="B", per_rank=per)
    m |= _comm(results)
    if cfg.pp > 1 and all(r["bubble"] is not None for r in results):
        bub = [r["bubble"] for r in results]
        # the bottleneck stage idles only in fill and drain: its idle fraction is the
        # pipeline bubble; the other stages also wait for it (stage imbalance)
        m["pp_bubble"] = Metric(value=min(bub), unit="fraction", per_rank=bub)
        m["pp_idle_mean"] = Metric(value=sum(bub) / len(bub), unit="fraction")
        notes.append(NOTE_BUBBLE)
    losses = _losses(results)
    m["loss_first"] = Metric(value=losses[0], unit="nats")
    m["loss_last"] = Metric(value=losses[-1], unit="nats")
    notes.append(f"peak memory: {r0['memory_source']}; {NOTE_MEASURED}")
    if backend == "gloo":
        notes.append("gloo CPU ranks: proves the mechanism and its bytes, not GPU speed")
    for r in results:
        notes += [f"context parallel: {f}" for f in r.get("fallbacks", [])]
    return m


def _layout(cfg: RunConfig, backend: str) -> dict[str, Any]:
    return {
        "world_size": cfg.nproc,
        "mesh": {"pp": cfg.pp, "dp": 1, "cp": cfg.cp, "tp": cfg.tp},
        "strategy": cfg.name,
        "sequence_parallel": cfg.sp,
        **({"sp_saved_input": "gathered"} if cfg.sp and cfg.impl == "parlab" else {}),
        "loss_parallel": cfg.tp > 1,
        "cp_variant": cfg.cp_variant if cfg.cp > 1 else None,
        "pp_schedule": cfg.schedule if cfg.pp > 1 else None,
        "vpp": cfg.vpp,
        "implementation": cfg.impl,
        "backend": backend,
        "norm_kernel": norm_kernel("cuda" if backend == "nccl" else "cpu"),
        "compile": cfg.compile,
        # the step whose peak and comm the document reports ran compiled (documents before
        # this knob: that step ran eager under the comm meter's dispatch mode)
        **({"metered_step": "compiled"} if cfg.compile else {}),
    }


def document(
    cfg: RunConfig,
    results: list[dict[str, Any]] | None,
    failure: Failure | None,
    *,
    command: str,
    backend: str,
    environment: dict[str, Any],
    artifacts: dict[str, str] | None = None,
) -> Document:
    """The contract document of one run (``results``: every rank's ``mi_rank`` return)."""
    preds, notes = predictions(cfg, backend, "compiled" if cfg.compile else None)
    metrics = _measured(cfg, results, backend, notes) if results else {}
    times = meters.slowest_rank_steps(results) if results else []
    return Document(
        run_id=new_run_id(f"mi-{cfg.name}"),
        created=now_iso(),
        project=PROJECT,
        task="T3",
        role=cfg.role if failure is None else "failure",
        evidence_level="real-training" if backend == "nccl" else "cpu-mechanism",
        command=command,
        environment=environment,
        workload={
            "model": cfg.model,
            "micro_batch": cfg.micro_batch,
            "microbatches": cfg.microbatches,
            "global_batch": cfg.global_batch,
            "seq": cfg.seq,
            "steps": cfg.steps,
            "warmup": cfg.warmup,
            "dtype": cfg.dtype,
            "dataset": "synthetic tokens (seed 0)",
            **({"losses": _losses(results)} if results else {}),
            # every measured step (its slowest rank): the spread behind the median step_time
            **({"step_times": times} if times else {}),
        },
        layout=_layout(cfg, backend),
        metrics=metrics,
        predictions=preds,
        status="ok" if failure is None else "failed",
        failure=failure,
        notes=notes,
        artifacts=artifacts or {},
    )


def outcome(
    c: RunConfig, per_rank: list[dict[str, Any] | None]
) -> tuple[list[dict[str, Any]] | None, Failure | None]:
    """One run's results (every rank's ``mi_rank`` return) or its failure."""
    per = per_rank[: c.nproc]
    fails = [(r, p["failure"]) for r, p in enumerate(per) if p and "failure" in p]
    if fails:
        own = [(r, f) for r, f in fails if not f.get("peer")] or fails
        r, f = own[0]
        return None, Failure(kind=f["kind"], message=f["message"], rank=f.get("rank", r))
    if any(p is None for p in per):
        return None, Failure(kind="crash", message="a rank returned no result for this run")
    return per, None  # type: ignore[return-value]


def add_scaling(doc: Document, base: Document, nproc: int) -> None:
    """Scaling efficiency ``t1 / (n tn)``, speedup and memory saved against ``base``, the
    one-rank run of the same global batch."""
    t1, tn = base.metric("step_time"), doc.metric("step_time")
    if t1 and tn:
        doc.metrics["scaling_efficiency"] = Metric(value=t1 / (nproc * tn), unit="fraction")
        doc.metrics["speedup_vs_single"] = Metric(value=t1 / tn, unit="x")
    m1, mn = base.metric("peak_memory"), doc.metric("peak_memory")
    if m1 and mn:
        doc.metrics["memory_saved_vs_single"] = Metric(value=m1 - mn, unit="B")
    doc.notes.append(f"baseline: {base.run_id} ({base.layout['strategy']}, 1 rank)")
