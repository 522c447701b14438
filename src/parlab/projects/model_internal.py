"""PAR-MODEL-INTERNAL: TP/SP, PP and CP runs of the reference model, against one GPU.

``run_project`` runs a comparison set: each parallel layout (candidate) and,
for each, a one-rank run of the same global batch (baseline), so scaling
efficiency is ``t_1 / (n * t_n)`` at the same global batch. One contract
document per run (``real-training`` on NCCL, ``cpu-mechanism`` on gloo) and a
Markdown report with the layout tables, the pipeline schedule grid and the
per-axis communication.

On every rank, one run (``mi_rank``): build the model from its preset (same
seed everywhere), cut its pipeline stage, apply ``compose.parallelize`` (TP with
SP and loss parallel, CP with the ring, DDP over CP ranks), AdamW; ``warmup``
steps, one *metered* step (parlab's comm log records every TP/CP/PP transfer
with its axis and payload; activation bytes are the step's peak above what
was live before it), then ``steps`` timed steps (CUDA events, no meter). Each
logged transfer is then replayed alone on its axis's group to time it
(``comm_time.<axis>``: the time on the wire, not the exposed time).
Predictions come from the ledger (``parlab.ledger``: parameter and activation
bytes, the wire table per axis) and from the bubble formula.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from parlab.contract import Document, Failure, Metric, Prediction, new_run_id, now_iso
from parlab.errors import UsageError
from parlab.models.reference import norm_kernel
from parlab.parallel.pipeline_schedules import SCHEDULES
from parlab.runtime.context import RankContext

PROJECT = "PAR-MODEL-INTERNAL"


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One run of the comparison set."""

    name: str
    """Label (``tp2-sp``, ``pp2-1f1b``, ``single-pp``, ...)."""
    model: str
    """Preset or catalog name (``parlab.models``)."""
    nproc: int
    """Ranks (GPUs)."""
    tp: int = 1
    """Tensor-parallel degree."""
    pp: int = 1
    """Pipeline-parallel degree."""
    cp: int = 1
    """Context-parallel degree."""
    sp: bool = False
    """Sequence parallel (with TP)."""
    cp_variant: str = "ring"
    """``ring`` or ``allgather``."""
    impl: str = "parlab"
    """``parlab`` (parlab's mechanisms) or ``torch`` (plain DTensor ``parallelize_module`` for
    TP, ``torch.distributed.pipelining`` for PP): the references the issue compares with."""
    schedule: str = "1f1b"
    """Pipeline schedule (``gpipe``, ``1f1b``, ``interleaved-1f1b``; with ``impl="torch"`` also
    ``zbv``: torch's ScheduleZBVZeroBubble, two stages per rank in a V); at pp 1 it is plain
    gradient accumulation."""
    vpp: int = 1
    """Virtual stages per pipeline rank (``interleaved-1f1b``)."""
    micro_batch: int = 1
    """Sequences per micro-batch."""
    microbatches: int = 1
    """Micro-batches per step (the global batch is ``micro_batch * microbatches``)."""
    seq: int = 64
    """Tokens per sequence."""
    steps: int = 3
    """Timed steps."""
    warmup: int = 1
    """Untimed steps before the metered step."""
    dtype: str = "fp32"
    """``bf16`` (parameters and compute) or ``fp32``."""
    role: str = "candidate"
    """``baseline`` (one rank) or ``candidate``."""
    timeout_s: float = 600.0
    """Process-group timeout."""
    compile: bool = False
    """``torch.compile`` each transformer block (parlab's pipeline stages and their one-rank
    baseline): the blocks are compiled before the stages are wrapped, as torchtitan does."""

    def __post_init__(self) -> None:
        if self.tp * self.pp * self.cp != self.nproc:
            raise UsageError(f"{self.name}: tp*pp*cp = {self.tp * self.pp * self.cp} != nproc")
        if self.dtype not in ("bf16", "fp32"):
            raise UsageError(f"dtype {self.dtype!r}: use bf16 or fp32")
        if self.compile and (self.tp > 1 or self.cp > 1 or self.impl != "parlab"):
            raise UsageError(
                f"{self.name}: compile applies to parlab's pipeline stages and one-rank runs; "
                "TP, CP and torch's implementations run eager"
            )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.microbatches


# ----- one run on every rank ----------------------------------------------------------------


def _replay(entry: dict[str, Any], group: Any, device: torch.device, dtype: torch.dtype) -> float:
    """Seconds one logged transfer takes alone on ``group`` (fresh buffers, 3 timed repeats)."""
    from parlab.parallel.context_comm import ring_shift_start

    n = dist.get_world_size(group)
    elems = max(1, entry["bytes"] // torch.empty((), dtype=dtype).element_size())
    op = entry["op"]

    def once() -> None:
        if op == "all_reduce":
            dist.all_reduce(torch.zeros(elems, dtype=dtype, device=device), group=group)
        elif op == "all_gather":
            out = torch.empty(elems - elems % n, dtype=dtype, device=device)
            dist.all_gather_into_tensor(out, out[: out.numel() // n].clone(), group=group)
        elif op == "reduce_scatter":
            x = torch.zeros(elems - elems % n, dtype=dtype, device=device)
            dist.reduce_scatter_tensor(x[: x.numel() // n].clone(), x, group=group)
        else:  # send_recv: one ring shift of the payload (both directions at once)
            ring_shift_start([torch.zeros(elems, dtype=dtype, device=device)], group).wait()

    once()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(3):
        once()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / 3


def mi_rank(ctx: RankContext, **raw: Any) -> dict[str, Any]:
    """Rank function: build, parallelise, train and measure one ``RunConfig``."""
    import torch.nn.functional as F

    from parlab.data import SyntheticTokens
    from parlab.models import get_spec
    from parlab.models.reference import build_model
    from parlab.parallel import tensor_comm
    from parlab.parallel.compose import ParallelPlan, parallelize
    from parlab.parallel.context import local_positions, shard_sequence
    from parlab.parallel.fsdp import apply_compile
    from parlab.parallel.pipeline import build_stage, run_schedule
    from parlab.parallel.pipeline_schedules import build
    from parlab.parallel.tensor import tp_cross_entropy
    from parlab.runtime import meters
    from parlab.topology import Topology

    cfg = RunConfig(**raw)
    dev = ctx.device
    dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
    topo = Topology(world_size=ctx.world_size, tp=cfg.tp, pp=cfg.pp, cp=cfg.cp)
    c = topo.coords(ctx.rank)
    mesh = topo.build_mesh(dev.type) if ctx.world_size > 1 else None
    spec = get_spec(cfg.model)
    memory = meters.MemoryMeter(dev)
    with memory:
        model = build_model(spec, device=dev, dtype=dtype, seed=0)
        stages: dict[int, Any] = {}
        if cfg.pp > 1 and cfg.vpp > 1:
            n_st = cfg.pp * cfg.vpp
            mine = list(range(c["pp"], n_st, cfg.pp))  # interleaved: r, r + p, ...
            if cfg.schedule == "zbv":  # the V: r and 2p - 1 - r (rank 0 holds the loss)
                mine = [c["pp"], n_st - 1 - c["pp"]]
            stages = {s: build_stage(model, s, n_st) for s in mine}
            del model
            model = torch.nn.ModuleList(stages.values())  # the parameters of every chunk
        elif cfg.pp > 1:
            model = build_stage(model, c["pp"], cfg.pp, copy_model=False)
        if cfg.compile:
            for m in stages.values() if stages else [model]:
                apply_compile(m)
        plan = ParallelPlan(
            sequence_parallel=cfg.sp,
            loss_parallel=cfg.tp > 1,
            cp_variant=cfg.cp_variant,
            data_parallel="ddp" if cfg.cp > 1 else "none",
        )
        torch_pp = None
        if cfg.impl == "torch" and cfg.tp > 1:
            _torch_tp(model, mesh["tp"])
        elif cfg.impl == "torch" and cfg.pp > 1:
            torch_pp = _torch_pipeline(stages or {c["pp"]: model}, cfg, mesh["pp"].get_group(), dev)
        elif stages:
            for k in stages:
                stages[k] = parallelize(stages[k], mesh, plan)
        elif mesh is not None:
            model = parallelize(model, mesh, plan)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = make_optimizer(params, dev)
        param_bytes = meters.count_bytes(params)
        tp_group = mesh["tp"].get_group() if cfg.tp > 1 and cfg.impl == "parlab" else None
        groups = {
            a: mesh[a].get_group() for a in ("tp", "pp", "cp") if getattr(cfg, a) > 1 and mesh
        }
        data = SyntheticTokens(vocab_size=spec.vocab_size, seq=cfg.seq, seed=0)
        sched = build(cfg.schedule, cfg.pp, cfg.microbatches, cfg.vpp) if torch_pp is None else None
        local_seq = cfg.seq // cfg.cp
        positions = local_positions(cfg.seq, cfg.cp, c["cp"], device=dev) if cfg.cp > 1 else None

        def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            if tp_group is not None:
                return tp_cross_entropy(logits, target, tp_group, loss_parallel=True)
            return F.cross_entropy(logits.flatten(0, 1).float(), target.reshape(-1))

        def step(i: int) -> tuple[float, dict[str, Any]]:
            b = data.global_batch(i, cfg.global_batch)
            x, y = b.inputs.to(dev), b.labels.to(dev)
            if cfg.cp > 1:
                x, y = shard_sequence(x, cfg.cp, c["cp"]), shard_sequence(y, cfg.cp, c["cp"])
            extra: dict[str, Any] = {}
            if torch_pp is not None:
                losses_t: list[torch.Tensor] = []
                last = 0 if cfg.schedule == "zbv" else cfg.pp - 1  # the V ends on rank 0
                kw = {"target": y, "losses": losses_t} if c["pp"] == last else {}
                torch_pp.step(x, **kw) if c["pp"] == 0 else torch_pp.step(**kw)
                loss = (
                    sum(float(t.detach()) for t in losses_t) / len(losses_t) if losses_t else None
                )
            elif cfg.pp > 1 or cfg.microbatches > 1:
                st = run_schedule(
                    sched,
                    stages or {c["pp"]: model},
                    microbatches=list(x.chunk(cfg.microbatches)),
                    targets=list(y.chunk(cfg.microbatches)),
                    loss_fn=loss_fn,
                    act_shape=(cfg.micro_batch, local_seq, spec.hidden),
                    act_dtype=dtype,
                    group=groups.get("pp"),
                    device=dev,
                )
                loss = st.loss
                extra = {"bubble": st.bubble, "busy_s": st.busy_s, "wall_s": st.wall_s}
            else:
                out = model(x, positions_S=positions) if positions is not None else model(x)
                lt = loss_fn(out, y)
                lt.backward()
                loss = float(lt.detach())
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cfg.cp > 1 and loss is not None:  # each CP rank's loss covers its own tokens
                lt = torch.tensor([loss], device=dev)
                dist.all_reduce(lt, group=groups["cp"])
                loss = float(lt) / cfg.cp
            return loss, extra

        losses = []
        for i in range(cfg.warmup):
            losses.append(step(i)[0])
        ctx.sync()
        live_before = memory.live_bytes()
        tracker = getattr(memory, "_tracker", None)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        elif tracker is not None and hasattr(tracker, "peak"):
            tracker.peak = tracker.live
        dispatcher = meters.CommMeter()  # every c10d collective, DDP's gradient all-reduce too
        with metered(dispatcher, cfg), tensor_comm.comm_log() as log:
            loss, metered_extra = step(cfg.warmup)
        losses.append(loss)
        ctx.sync()
        act_bytes = memory.peak_bytes() - live_before
        timer = meters.StepTimer(dev)
        extras = []
        timer.mark()
        for i in range(cfg.steps):
            loss, extra = step(cfg.warmup + 1 + i)
            losses.append(loss)
            extras.append(extra)
            timer.mark()
        step_times = timer.step_times()
    by_axis: dict[str, dict[str, float]] = {}
    for e in log:
        a = by_axis.setdefault(e["axis"], {"bytes": 0, "count": 0, "time_s": 0.0})
        a["bytes"] += e["bytes"]
        a["count"] += 1
    ops: dict[str, dict[str, int]] = {}
    for e in log:
        k = f"{e['axis']}.{e['op']}"
        o = ops.setdefault(k, {"bytes": 0, "count": 0})
        o["bytes"] += e["bytes"]
        o["count"] += 1
    for e in log:  # every rank logged the same sequence per axis: replay in lockstep
        if e["axis"] in groups:
            by_axis[e["axis"]]["time_s"] += _replay(e, groups[e["axis"]], dev, dtype)
    bubbles = [x["bubble"] for x in extras if "bubble" in x]
    return {
        "step_times": step_times,
        "losses": losses,
        "peak_memory": memory.peak_bytes(),
        "memory_source": memory.source,
        "param_bytes": param_bytes,
        "activation_bytes": act_bytes,
        "comm": by_axis,
        "comm_ops": ops,
        "c10d_by_op": dispatcher.by_op(),
        "bubble": meters.median(bubbles) if bubbles else None,
        "metered_bubble": metered_extra.get("bubble"),
        "device": meters.device_name(dev),
        "tokens_per_step": cfg.global_batch * cfg.seq,
        "fallbacks": sorted(set(_cp_fallbacks()))[:3],
    }


def metered(meter: Any, cfg: RunConfig) -> Any:
    """The context the metered step runs in: ``meter`` (parlab's comm meter, a dispatch mode),
    except under torch.compile, where a dispatch mode makes each compiled block run its original
    code: the step whose peak the document reports would be an eager one."""
    return contextlib.nullcontext() if cfg.compile else meter


class _Optimizers:
    """AdamW over plain parameters and AdamW over DTensor parameters, stepped together."""

    def __init__(self, opts: list[torch.optim.Optimizer]) -> None:
        self.opts = opts

    def step(self) -> None:
        for o in self.opts:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.opts:
            o.zero_grad(set_to_none=set_to_none)


def make_optimizer(params: list[torch.nn.Parameter], dev: torch.device) -> _Optimizers:
    """AdamW (lr 1e-4): fused on CUDA over plain tensors (the fast path); ``foreach`` over
    DTensor parameters (torch's ``parallelize_module`` leaves embeddings and norms plain, and
    fused AdamW refuses a mix of DTensor and plain tensors), each kind its own optimizer."""
    from torch.distributed.tensor import DTensor

    dt = [p for p in params if isinstance(p, DTensor)]
    plain = [p for p in params if not isinstance(p, DTensor)]
    opts: list[torch.optim.Optimizer] = []
    if plain:
        opts.append(torch.optim.AdamW(plain, lr=1e-4, fused=dev.type == "cuda"))
    if dt:
        opts.append(torch.optim.AdamW(dt, lr=1e-4, foreach=True))
    return _Optimizers(opts)


def _cp_fallbacks() -> list[str]:
    from parlab.parallel import context

    return list(context._FALLBACKS)


def _torch_tp(model: Any, tp_mesh: Any) -> None:
    """The plain DTensor TP the issue measures as a reference (no SP, logits replicated)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan: dict[str, Any] = {}
    for i in range(len(model.layers)):
        for n in ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1"):
            plan[f"layers.{i}.{n}"] = ColwiseParallel()
        plan[f"layers.{i}.feed_forward.w3"] = ColwiseParallel()
        plan[f"layers.{i}.attention.wo"] = RowwiseParallel()
        plan[f"layers.{i}.feed_forward.w2"] = RowwiseParallel()
    parallelize_module(model, tp_mesh, plan)


def _torch_pipeline(stages: dict[int, Any], cfg: RunConfig, group: Any, dev: Any) -> Any:
    """``torch.distributed.pipelining`` over the same stage modules (the issue's PP reference):
    ``stages`` maps each stage index this rank holds to its module (one, or two for ``zbv``:
    ScheduleZBVZeroBubble, whose backward splits into input and weight gradients so the
    weight half fills the bubble)."""
    import torch.nn.functional as F
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleZBVZeroBubble,
    )

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), target.reshape(-1))

    n_st = cfg.pp * cfg.vpp
    sts = [PipelineStage(m, s, n_st, dev, group=group) for s, m in sorted(stages.items())]
    if cfg.schedule == "zbv":
        return ScheduleZBVZeroBubble(sts, n_microbatches=cfg.microbatches, loss_fn=loss_fn)
    cls = ScheduleGPipe if cfg.schedule == "gpipe" else Schedule1F1B
    return cls(sts[0], n_microbatches=cfg.microbatches, loss_fn=loss_fn)


def _work(r: dict[str, Any]) -> float:
    """Rough cost of a run (tokens per step, attention's quadratic term, per rank)."""
    seq = r["seq"]
    return r["micro_batch"] * r["microbatches"] * seq * (1 + seq / 16384) / r["nproc"]


def _free(ctx: RankContext) -> None:
    """Give back what the last run held before the next one is built."""
    import gc

    gc.collect()
    if ctx.is_cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(ctx.device)


def _agree(ctx: RankContext, value: float, op: Any) -> float:
    """One scalar reduced over every rank (MAX or MIN), on the rank's device."""
    t = torch.tensor([value], dtype=torch.float64 if not ctx.is_cuda else torch.float32)
    t = t.to(ctx.device)
    dist.all_reduce(t, op=op)
    return float(t)


def mi_many(
    ctx: RankContext,
    runs: list[dict[str, Any]],
    partial_dir: str | None = None,
    deadline: float | None = None,
) -> list[dict[str, Any] | None]:
    """Rank function: several runs in one launch (one start-up), each isolated.

    Before a run the ranks agree (all-reduce MIN) whether it fits before ``deadline``
    (epoch seconds; rank 0 estimates it from the slowest step time per token so far and
    the last run's time outside its steps); a run that raises (out of
    memory included) becomes ``{"failure": ...}`` for that run only; after it the ranks
    all-reduce a failure flag (MAX), so a rank whose peer failed marks the run failed too
    and nobody waits in a collective the other skipped; memory is freed before the next.
    A one-rank baseline runs on rank 0 while the others wait in that all-reduce. With
    ``partial_dir`` every rank writes each run's outcome there at once
    (``run<i>.rank<r>.json``), so a launch that dies keeps the runs it finished."""
    import json

    out: list[dict[str, Any] | None] = []
    rate = 0.0  # seconds of one step per unit of ``_work``, the slowest run so far
    overhead = 0.0  # seconds of the last run outside its steps (build, replays)
    for i, r in enumerate(runs):
        res: dict[str, Any] | None = None
        go = 1.0
        if deadline is not None and ctx.rank == 0 and rate > 0:
            n_steps = r["warmup"] + 1 + r["steps"]
            need = 1.3 * (overhead + n_steps * rate * _work(r)) + 3
            go = float(need < deadline - time.time())
        if ctx.world_size > 1:
            go = _agree(ctx, go, dist.ReduceOp.MIN)
        if not go:
            res = {
                "failure": {
                    "kind": "timeout",
                    "message": "not run: it would not finish within the set's time budget "
                    "(--budget)",
                }
            }
        else:
            t0 = time.monotonic()
            mine = r["nproc"] > ctx.rank
            try:
                if r["nproc"] == 1 and ctx.world_size > 1:  # a baseline: rank 0 alone
                    if ctx.rank == 0:
                        one = dataclasses.replace(ctx, world_size=1, local_world_size=1)
                        res = mi_rank(one, **r)
                elif mine:
                    res = mi_rank(ctx, **r)
            except Exception as exc:
                from parlab.runtime.failures import classify, one_line

                res = {
                    "failure": {"kind": classify(exc), "message": one_line(exc), "rank": ctx.rank}
                }
                del exc
            _free(ctx)
            failed = res is not None and "failure" in res
            # every rank takes part in this all-reduce, whatever happened to it
            peer_failed = ctx.world_size > 1 and _agree(ctx, float(failed), dist.ReduceOp.MAX)
            if peer_failed and not failed and mine:
                res = {
                    "failure": {
                        "kind": "crash",
                        "message": "another rank of this run failed",
                        "peer": True,
                    }
                }
            if res is not None and not failed and res.get("step_times"):
                from parlab.runtime.meters import median

                step = median(res["step_times"])
                n_steps = r["warmup"] + 1 + r["steps"]
                rate = max(rate, step / max(_work(r), 1.0))
                overhead = max(0.0, time.monotonic() - t0 - n_steps * step)
        out.append(res)
        if partial_dir is not None:
            path = Path(partial_dir) / f"run{i}.rank{ctx.rank}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"result": res}))
            tmp.replace(path)
    return out


# ----- documents ----------------------------------------------------------------------------


def _topology(cfg: RunConfig) -> Any:
    from parlab.topology import Topology

    return Topology(world_size=cfg.nproc, tp=cfg.tp, pp=cfg.pp, cp=cfg.cp)


def predictions(
    cfg: RunConfig, backend: str = "nccl", norm: str | None = None, sp_gather: str = "shared"
) -> tuple[dict[str, Prediction], list[str]]:
    """Ledger (bytes, wire table per axis) and bubble-formula predictions for ``cfg``
    (``backend`` nccl: CUDA kernels, e.g. the fused RMSNorm; gloo: CPU; ``norm`` overrides
    the ledger's ``norm_kernel``; ``sp_gather="per-linear"``: parlab's SP as it was before
    commit 02e7fd8, each linear saving its own copy of the gathered sequence -- the runs whose
    documents record no ``sp_saved_input``)."""
    from parlab.ledger import models_compiled
    from parlab.ledger.predict import predict
    from parlab.ledger.traffic import traffic
    from parlab.models import get_spec
    from parlab.parallel.pipeline_schedules import formula

    spec = get_spec(cfg.model)
    topo = _topology(cfg)
    out: dict[str, Prediction] = {}
    notes: list[str] = []
    dt = "bf16" if cfg.dtype == "bf16" else "fp32"
    kw = {
        "topology": topo,
        "micro_batch": cfg.micro_batch,
        "seq_len": cfg.seq,
        "microbatches": cfg.microbatches,
        "sp": cfg.sp,
        # parlab's TP splits the output layer and the loss over the vocabulary; torch's plan
        # (``_torch_tp``) keeps embeddings and output whole, the logits replicated
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
            norm_kernel=norm or eager,
            # parlab's SP saves the gathered sequence as its linears' input (tensor_comm)
            sp_saves_gathered=cfg.sp and cfg.impl == "parlab",
            sp_gather=sp_gather if cfg.sp and cfg.impl == "parlab" else "shared",
            vocab_parallel=cfg.impl == "parlab",
            # the step without a schedule keeps the model's output (``out``) through backward
            logits_held=cfg.pp == 1 and cfg.microbatches == 1,
            **kw,
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


def flops_per_token(cfg: RunConfig) -> float | None:
    try:
        from parlab.models import get_spec
        from parlab.models.flops import training_flops_per_token

        return training_flops_per_token(get_spec(cfg.model), cfg.seq)
    except (ImportError, ValueError):
        return None


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
    from parlab.runtime import meters

    preds, notes = predictions(cfg, backend, "compiled" if cfg.compile else None)
    metrics: dict[str, Metric] = {}
    times = meters.slowest_rank_steps(results) if results else []
    if results:
        r0 = results[0]
        t = meters.median(times)
        tps = r0["tokens_per_step"] / t / cfg.nproc if t > 0 else None
        metrics["step_time"] = Metric(value=t, unit="s")
        metrics["tokens_per_s_per_gpu"] = Metric(value=tps, unit="tokens/s")
        fpt = flops_per_token(cfg)
        dt = "bf16" if cfg.dtype == "bf16" else "fp32"
        m = meters.mfu(tps, fpt, r0["device"], dt) if tps else None
        metrics["mfu"] = Metric(value=m, unit="fraction")
        if m is None:
            notes.append(f"mfu unknown: device {r0['device']!r} has no catalog peak for {dt}")

        def per(key: str) -> list[float]:
            return [float(r[key]) for r in results]

        for key in ("peak_memory", "param_bytes", "activation_bytes"):
            metrics[key] = Metric(value=max(per(key)), unit="B", per_rank=per(key))
        axes = sorted({a for r in results for a in r["comm"]})
        for a in axes:
            b = [float(r["comm"].get(a, {}).get("bytes", 0)) for r in results]
            n = [float(r["comm"].get(a, {}).get("count", 0)) for r in results]
            s = [float(r["comm"].get(a, {}).get("time_s", 0.0)) for r in results]
            metrics[f"comm_bytes_per_step.{a}"] = Metric(value=max(b), unit="B", per_rank=b)
            metrics[f"comm_count_per_step.{a}"] = Metric(value=max(n), unit="count", per_rank=n)
            metrics[f"comm_time.{a}"] = Metric(value=max(s), unit="s", per_rank=s)
        for k in sorted({k for r in results for k in r["comm_ops"]}):
            b = [float(r["comm_ops"].get(k, {}).get("bytes", 0)) for r in results]
            metrics[f"comm_op_bytes.{k}"] = Metric(value=max(b), unit="B", per_rank=b)
        for op in sorted({k for r in results for k in r.get("c10d_by_op", {})}):
            b = [float(r["c10d_by_op"].get(op, {}).get("bytes", 0)) for r in results]
            n = [float(r["c10d_by_op"].get(op, {}).get("count", 0)) for r in results]
            metrics[f"c10d_bytes_per_step.{op}"] = Metric(value=max(b), unit="B", per_rank=b)
            metrics[f"c10d_count_per_step.{op}"] = Metric(value=max(n), unit="count", per_rank=n)
        if cfg.pp > 1 and all(r["bubble"] is not None for r in results):
            bub = [r["bubble"] for r in results]
            # the bottleneck stage idles only in fill and drain: its idle fraction is the
            # pipeline bubble; the other stages also wait for it (stage imbalance)
            metrics["pp_bubble"] = Metric(value=min(bub), unit="fraction", per_rank=bub)
            metrics["pp_idle_mean"] = Metric(value=sum(bub) / len(bub), unit="fraction")
            notes.append(
                "pp_bubble: idle / step time of the busiest stage (1 - busy/step, busy = "
                "forward + backward compute timed per action), i.e. fill and drain only; "
                "pp_idle_mean adds the other stages' wait for it (stage imbalance)"
            )
        losses = _losses(results)
        metrics["loss_first"] = Metric(value=losses[0], unit="nats")
        metrics["loss_last"] = Metric(value=losses[-1], unit="nats")
        notes.append(
            f"peak memory: {r0['memory_source']}; activation_bytes: the metered step's peak "
            "above what was live before it; comm_bytes_per_step.<axis>: parlab's own "
            "transfers on that axis, nccl-tests sizes for collectives and the bytes this rank "
            "sent for send/recv (received bytes not added); comm_time.<axis>: that step's "
            "transfers replayed "
            "alone on the axis's group (time on the wire, not the exposed time); "
            "c10d_bytes_per_step.<op>: every c10d collective of that step on any axis "
            "(the shared comm meter), DDP's gradient all-reduce over CP ranks included"
        )
        if backend == "gloo":
            notes.append("gloo CPU ranks: proves the mechanism and its bytes, not GPU speed")
        for r in results:
            notes += [f"context parallel: {f}" for f in r.get("fallbacks", [])]
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
        layout={
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
        },
        metrics=metrics,
        predictions=preds,
        status="ok" if failure is None else "failed",
        failure=failure,
        notes=notes,
        artifacts=artifacts or {},
    )


# ----- the comparison set ---------------------------------------------------------------------


def comparison_set(
    preset: str, *, seq: int | None = None, steps: int | None = None
) -> list[tuple[RunConfig, RunConfig]]:
    """(baseline on one rank, candidate) pairs: TP2+SP, TP2, PP2 GPipe and 1F1B, CP2 ring at
    the base sequence and at twice it (GPU: 32k and 64k)."""
    if preset == "gpu":
        base = {"model": "1.3b", "dtype": "bf16", "steps": steps or 3, "warmup": 2}
        tp_kw = {"micro_batch": 2, "seq": seq or 4096}
        pp_kw = {"micro_batch": 1, "microbatches": 8, "seq": seq or 4096}
        cp_kw = {"micro_batch": 1, "seq": 32768 if seq is None else seq * 8}
        long_kw = {"micro_batch": 1, "seq": 2 * cp_kw["seq"], "steps": 2, "warmup": 1}
    elif preset == "cpu":
        base = {"model": "tiny", "dtype": "fp32", "steps": steps or 2, "warmup": 1}
        tp_kw = {"micro_batch": 2, "seq": seq or 64}
        pp_kw = {"micro_batch": 1, "microbatches": 4, "seq": seq or 64}
        cp_kw = {"micro_batch": 1, "seq": 2 * (seq or 64)}
        long_kw = {"micro_batch": 1, "seq": 2 * cp_kw["seq"], "steps": 1, "warmup": 1}
    else:
        raise UsageError(f"preset {preset!r}: use cpu or gpu")

    def pair(name: str, kw: dict[str, Any], **cand: Any) -> tuple[RunConfig, RunConfig]:
        both = {**base, **kw}
        single = RunConfig(
            name=f"single-{name}",
            nproc=1,
            role="baseline",
            compile=cand.get("compile", False),
            **both,
        )
        sched = cand.pop("schedule", "1f1b")
        # one rank accumulates the same micro-batches (torch's own schedules: as 1F1B would)
        one = sched if sched in SCHEDULES else "1f1b"
        return dataclasses.replace(single, schedule=one), RunConfig(
            name=name, role="candidate", schedule=sched, **both, **cand
        )

    # in priority order: a set cut short by its time budget keeps the first ones
    return [
        pair("tp2-sp", tp_kw, nproc=2, tp=2, sp=True),
        pair("pp2-gpipe", pp_kw, nproc=2, pp=2, schedule="gpipe"),
        pair("pp2-1f1b", pp_kw, nproc=2, pp=2, schedule="1f1b"),
        pair("cp2-ring", cp_kw, nproc=2, cp=2),
        pair("tp2", tp_kw, nproc=2, tp=2),
        # torch's own implementations, the references issue 6 quotes
        pair("tp2-dtensor", tp_kw, nproc=2, tp=2, impl="torch"),
        pair("pp2-1f1b-torch", pp_kw, nproc=2, pp=2, schedule="1f1b", impl="torch"),
        pair("pp2-interleaved", pp_kw, nproc=2, pp=2, schedule="interleaved-1f1b", vpp=2),
        # torch's zero-bubble V schedule: what the bubble costs parlab's 1F1B family
        pair("pp2-zbv-torch", pp_kw, nproc=2, pp=2, schedule="zbv", vpp=2, impl="torch"),
        # compiled blocks: the per-micro-batch compute the bubble multiplies
        pair("pp2-1f1b-compiled", pp_kw, nproc=2, pp=2, schedule="1f1b", compile=True),
        pair(
            "pp2-interleaved-compiled",
            pp_kw,
            nproc=2,
            pp=2,
            schedule="interleaved-1f1b",
            vpp=2,
            compile=True,
        ),
        # twice the sequence: one rank may run out of memory (a failure document), CP2 not;
        # its one-rank run goes last of all
        pair("cp2-ring-long", long_kw, nproc=2, cp=2),
    ]


NAMES = (
    "tp2-sp",
    "pp2-gpipe",
    "pp2-1f1b",
    "cp2-ring",
    "tp2",
    "tp2-dtensor",
    "pp2-1f1b-torch",
    "pp2-interleaved",
    "pp2-zbv-torch",
    "pp2-1f1b-compiled",
    "pp2-interleaved-compiled",
    "cp2-ring-long",
)
BASELINE_LAST = ("cp2-ring-long",)
"""Runs whose one-rank baseline runs after them (it may run out of memory)."""


def _outcome(
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


def _launch(
    configs: list[RunConfig], *, gpu: bool, timeout_s: float, budget_s: float | None = None
) -> tuple[list[list[dict[str, Any]] | None], list[Failure | None], str]:
    """Run configs in as few launches as possible (one start-up each; one-rank baselines
    run on rank 0 alone). Each run is isolated inside the launch (``mi_many``); if the
    launch itself dies (a rank killed, a collective timed out), the runs it finished are
    kept, the run it died in gets the launch's failure and the rest go to a new launch
    while the budget lasts. Per-config results (or ``None``) and failure."""
    import json
    import tempfile

    from parlab.runtime.launch import LaunchConfig, launch

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
        with tempfile.TemporaryDirectory(prefix="parlab-mi-") as tmp:
            kwargs = {
                "runs": [configs[k].to_json() for k in pending],
                "partial_dir": tmp,
                "deadline": None if left is None else time.time() + left - 10,
            }
            lc = LaunchConfig(nproc=width, backend=backend, timeout_s=timeout_s, deadline_s=left)
            res = launch("parlab.projects.model_internal:mi_many", kwargs, lc)
            got: dict[int, list[dict[str, Any] | None]] = {}
            if res.ok:
                got = {n: [r[n] for r in res.results] for n in range(len(pending))}
            else:
                for n in range(len(pending)):
                    per = []
                    for r in range(width):
                        f = Path(tmp) / f"run{n}.rank{r}.json"
                        per.append(json.loads(f.read_text())["result"] if f.exists() else None)
                    files = [Path(tmp) / f"run{n}.rank{r}.json" for r in range(width)]
                    if all(f.exists() for f in files):
                        got[n] = per
        done = []
        for n, k in enumerate(pending):
            if n in got:
                outs[k], fails[k] = _outcome(configs[k], got[n])
                done.append(k)
        rest = [k for k in pending if k not in done]
        if not res.ok and rest:  # the launch died in the first run it did not finish
            fails[rest[0]] = res.failure or Failure(kind="crash", message="the launch failed")
            rest = rest[1:]
        pending = rest
    return outs, fails, backend


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
    from parlab.contract import write_result
    from parlab.hardware.env import snapshot

    if nproc != 2:
        raise UsageError(f"--nproc {nproc}: the comparison set is the 2-rank set (TP2, PP2, CP2)")
    if only:
        bad = [o for o in only if o not in NAMES]
        if bad:
            raise UsageError(f"unknown run {bad[0]!r}: use one of {', '.join(NAMES)}")
    gpu = preset == "gpu"
    if gpu and not (torch.cuda.is_available() and torch.cuda.device_count() >= 2):
        raise UsageError("--preset gpu needs 2 CUDA GPUs: use --preset cpu here")
    pairs = [
        p for p in comparison_set(preset, seq=seq, steps=steps) if not only or p[1].name in only
    ]
    singles: dict[str, RunConfig] = {}
    group: list[RunConfig] = []  # each baseline before its first candidate, in set order
    for b, c in pairs:  # baselines shared by runs of the same workload
        key = str({k: v for k, v in b.to_json().items() if k not in ("name", "schedule")})
        first = key not in singles
        singles.setdefault(key, b)
        if first and c.name not in BASELINE_LAST:
            group.append(b)
        group.append(c)
        if first and c.name in BASELINE_LAST:
            group.append(b)
    env = snapshot(probe_links=gpu)
    docs: dict[str, Document] = {}
    out_dir = results / PROJECT
    out_dir.mkdir(parents=True, exist_ok=True)
    outs, fails, backend = _launch(group, gpu=gpu, timeout_s=timeout_s, budget_s=budget_s)
    if True:
        for cfg, res, fail in zip(group, outs, fails, strict=True):
            arts = {}
            if cfg.pp > 1 and cfg.schedule in SCHEDULES:
                from parlab.parallel.pipeline_schedules import build, format_grid

                grid = out_dir / f"schedule-{cfg.name}.txt"
                grid.write_text(
                    format_grid(build(cfg.schedule, cfg.pp, cfg.microbatches, cfg.vpp)) + "\n"
                )
                arts["schedule_grid"] = grid.name
            cmd = (
                f"parlab project model-internal --preset {preset}"
                + (f" --seq {seq}" if seq else "")
                + f" --only {cfg.name}"
            )
            docs[cfg.name] = document(
                cfg, res, fail, command=cmd, backend=backend, environment=env, artifacts=arts
            )
    # scaling efficiency against the one-rank run of the same global batch
    for b, cand in pairs:
        key = str({k: v for k, v in b.to_json().items() if k not in ("name", "schedule")})
        base = docs[singles[key].name]
        d = docs[cand.name]
        t1, tn = base.metric("step_time"), d.metric("step_time")
        if t1 and tn:
            d.metrics["scaling_efficiency"] = Metric(value=t1 / (cand.nproc * tn), unit="fraction")
            d.metrics["speedup_vs_single"] = Metric(value=t1 / tn, unit="x")
        m1, mn = base.metric("peak_memory"), d.metric("peak_memory")
        if m1 and mn:
            d.metrics["memory_saved_vs_single"] = Metric(value=m1 - mn, unit="B")
        d.notes.append(f"baseline: {base.run_id} ({base.layout['strategy']}, 1 rank)")
    for d in docs.values():
        path = write_result(d, results)
        if console is not None:
            st = "ok" if d.failure is None else f"failed ({d.failure.kind}: {d.failure.message})"
            console.print(f"{d.layout['strategy']}: {st} -> {path}")
    return render_report(list(docs.values()), out_dir, pairs=pairs)


# ----- the report -------------------------------------------------------------------------------


def _fmt(v: float | None, unit: str) -> str:
    from parlab.units import format_bytes, format_seconds

    if v is None:
        return "unknown"
    if unit == "B":
        return format_bytes(v)
    if unit == "s":
        return format_seconds(v)
    if unit == "fraction":
        return f"{100 * v:.1f}%"
    if unit == "tokens/s":
        return f"{v:,.0f}"
    return f"{v:.3g}"


def _cell(d: Document, name: str) -> str:
    m = d.metrics.get(name)
    return _fmt(m.value, m.unit) if m else "-"


def _pred(d: Document, name: str) -> str:
    p = d.predictions.get(name)
    return _fmt(p.value, p.unit) if p else "-"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return [*out, ""]


def render_report(
    docs: list[Document], out_dir: Path, *, pairs: list[tuple[RunConfig, RunConfig]]
) -> dict[str, Path]:
    """``model-internal.md`` beside the documents: results, per-axis comm, layouts, schedules."""
    from parlab.layout import describe, shape_of
    from parlab.models import get_spec
    from parlab.parallel.pipeline_schedules import build, format_grid, formula

    by = {d.layout["strategy"]: d for d in docs}
    levels = sorted({d.evidence_level for d in docs})
    env = docs[0].environment if docs else {}
    gpus = (env.get("hardware") or {}).get("gpus") or []
    lines = [
        "# PAR-MODEL-INTERNAL: tensor, sequence, pipeline and context parallelism",
        "",
        f"Evidence: {', '.join(levels)}. Devices: "
        + (f"{len(gpus)} x {gpus[0]['name']}" if gpus else "CPU (gloo ranks)")
        + f"; torch {(env.get('software') or {}).get('torch', '?')}.",
        "Every run trains the reference model on the same seeded synthetic global batch; "
        "each candidate is compared with one rank running the same global batch "
        "(scaling efficiency = t1 / (n x tn)). Predictions are the ledger's and the "
        "bubble formula's, made before the run.",
        "",
        "## Runs",
        "",
    ]
    rows = []
    for d in docs:
        lay = d.layout
        mesh = " x ".join(f"{a}{lay['mesh'][a]}" for a in ("pp", "cp", "tp") if lay["mesh"][a] > 1)
        if lay.get("implementation") == "torch":
            mesh += " (torch)"
        status = "ok" if d.failure is None else f"failed ({d.failure.kind})"
        rows.append(
            [
                lay["strategy"],
                d.role,
                mesh or "1 rank",
                f"{d.workload['global_batch']}x{d.workload['seq']}",
                status,
                _cell(d, "step_time"),
                _cell(d, "tokens_per_s_per_gpu"),
                _cell(d, "mfu"),
                _cell(d, "scaling_efficiency"),
                _cell(d, "peak_memory"),
                f"{_cell(d, 'param_bytes')} / {_pred(d, 'param_bytes')}",
                f"{_cell(d, 'activation_bytes')} / {_pred(d, 'activation_bytes')}",
            ]
        )
    lines += _table(
        [
            "run", "role", "mesh", "batch x seq", "status", "step time", "tokens/s/GPU",
            "MFU", "scaling eff.", "peak mem", "params (measured / ledger)",
            "activations (measured / ledger)",
        ],
        rows,
    )  # fmt: skip
    lines += ["## Communication per axis (metered step, per rank, max over ranks)", ""]
    rows = []
    for d in docs:
        for axis in ("tp", "cp", "pp"):
            if f"comm_bytes_per_step.{axis}" not in d.metrics:
                continue
            ops = ", ".join(
                f"{k.split('.', 1)[1]} {_fmt(m.value, 'B')}"
                for k, m in d.metrics.items()
                if k.startswith(f"comm_op_bytes.{axis}.")
            )
            rows.append(
                [
                    d.layout["strategy"],
                    axis,
                    _cell(d, f"comm_count_per_step.{axis}"),
                    _cell(d, f"comm_bytes_per_step.{axis}"),
                    _pred(d, f"comm_bytes_per_step.{axis}"),
                    _cell(d, f"comm_time.{axis}"),
                    ops,
                ]
            )
    lines += _table(
        ["run", "axis", "calls", "bytes", "ledger bytes", "time (replayed alone)", "by op"], rows
    )
    pp_docs = [d for d in docs if d.layout["mesh"]["pp"] > 1]
    if pp_docs:
        lines += ["## Pipeline bubble", ""]
        rows = []
        for d in pp_docs:
            p, m = d.layout["mesh"]["pp"], d.workload["microbatches"]
            known = d.layout["pp_schedule"] in SCHEDULES
            f = formula(d.layout["pp_schedule"], p, m, d.layout.get("vpp", 1)) if known else None
            rows.append(
                [
                    d.layout["strategy"],
                    f"p={p}, m={m}",
                    _cell(d, "pp_bubble"),
                    _cell(d, "pp_idle_mean"),
                    "-" if f is None else f"{100 * f['of_step']:.1f}%",
                ]
            )
        lines += _table(
            ["run", "p, m", "bubble (busiest stage)", "idle, mean of stages", "(p-1)/(v*m+p-1)"],
            rows,
        )
        for d in pp_docs:
            p, m = d.layout["mesh"]["pp"], d.workload["microbatches"]
            sched = d.layout["pp_schedule"]
            if sched not in SCHEDULES:  # torch's own schedule: no parlab grid
                continue
            lines += [f"### {sched} schedule, p={p}, m={m} (step x rank)", "", "```"]
            lines += [format_grid(build(sched, p, m, d.layout.get("vpp", 1))), "```", ""]
    lines += [
        "## Same model, same numbers: losses against the one-rank run",
        "",
        "Every step's loss of each run beside the one-rank run of the same global batch "
        "(same seed, same data, AdamW): parlab's layouts and torch's own implementations "
        "must all train the same model.",
        "",
    ]
    rows = []
    singles_by_workload = {
        (d.workload["global_batch"], d.workload["seq"]): d
        for d in docs
        if d.role != "candidate" and d.failure is None
    }
    for d in docs:
        if d.role != "candidate" or d.failure is not None:
            continue
        one = singles_by_workload.get((d.workload["global_batch"], d.workload["seq"]))
        mine, ref = d.workload.get("losses") or [], (one.workload.get("losses") if one else [])
        pairs_l = [(a, b) for a, b in zip(mine, ref or [], strict=False) if a is not None and b]
        diff = max((abs(a - b) for a, b in pairs_l), default=None)
        rows.append(
            [
                d.layout["strategy"]
                + (" (torch)" if d.layout.get("implementation") == "torch" else ""),
                " ".join(f"{x:.4f}" for x in mine if x is not None),
                " ".join(f"{x:.4f}" for x in (ref or []) if x is not None),
                "-" if diff is None else f"{diff:.2e}",
            ]
        )
    lines += _table(["run", "losses", "one-rank losses", "max abs difference"], rows)
    cp_pairs = [(b, c) for b, c in pairs if c.cp > 1 and c.name in by]
    if cp_pairs:
        lines += ["## Context parallel: memory per rank", ""]
        rows = []
        for b, c in cp_pairs:
            one = next((d for d in docs if d.layout["strategy"] == b.name), None)
            if one is None:  # shared with another pair of the same workload
                one = next(
                    (d for d in docs if d.role != "candidate" and d.workload["seq"] == c.seq),
                    None,
                )
            one_peak = "-"
            if one is not None:
                one_peak = (
                    _cell(one, "peak_memory")
                    if one.failure is None
                    else f"failed ({one.failure.kind})"
                )
            rows.append(
                [
                    c.name,
                    str(c.seq),
                    one_peak,
                    _cell(by[c.name], "peak_memory"),
                    _cell(by[c.name], "memory_saved_vs_single"),
                    _pred(by[c.name], "peak_memory"),
                ]
            )
        lines += _table(
            ["run", "seq", "1 rank peak", "CP2 peak per rank", "saved per rank", "ledger CP2 peak"],
            rows,
        )
    lines += ["## Layouts", ""]
    for _, cand in pairs:
        if cand.name not in by:
            continue
        shape = shape_of(get_spec(cand.model))
        lay = describe(
            world=cand.nproc,
            degrees={"tp": cand.tp, "pp": cand.pp, "cp": cand.cp},
            shape=shape,
            seq=cand.seq,
            sequence_parallel=cand.sp,
            vpp=cand.vpp,
        )
        lines += [f"### {cand.name}", ""]
        rows = []
        for h in lay["holdings"]:
            rows.append(
                [
                    str(h["rank"]),
                    " ".join(f"{a}{h['coords'][a]}" for a in ("pp", "cp", "tp")),
                    ",".join(f"{a}-{b}" for a, b in h["layers"]),
                    "{}-{}".format(*h["heads"]),
                    "{}-{}".format(*h["kv_heads"]),
                    "{}-{}".format(*h["ffn_columns"]),
                    "{}-{}".format(*h["vocab_rows"]),
                    ",".join(map(str, h.get("seq_chunks", []))) or "all",
                ]
            )
        lines += _table(
            ["rank", "coords", "layers", "heads", "KV heads", "FFN cols", "vocab rows", "chunks"],
            rows,
        )
        bad = [r for r in lay["constraints"] if not r["ok"]]
        lines += [f"constraints: {len(lay['constraints'])} rows, {len(bad)} failing", ""]
    lines += ["## Notes", ""]
    for d in docs:
        for n in d.notes:
            lines.append(f"- {d.layout['strategy']}: {n}")
    path = out_dir / "model-internal.md"
    path.write_text("\n".join(lines) + "\n")
    return {"report": path}


def demo_step(results: Path, console: Any) -> None:
    """``parlab demo``: TP2+SP, PP2 GPipe/1F1B and CP2 on the tiny model, 2 gloo ranks."""
    paths = run_project(
        results, console=console, preset="cpu", only=["tp2-sp", "pp2-1f1b", "cp2-ring"]
    )
    console.print(f"report: {paths['report']}")
