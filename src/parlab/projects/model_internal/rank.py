"""What a rank does in a model-internal run: build a stage, parallelise it, train, measure.

One run on every rank (``mi_rank``): build the model from its preset (same seed everywhere),
cut its pipeline stage, apply ``compose.parallelize`` (TP with SP and loss parallel, CP with
the ring, DDP over CP ranks), AdamW; then the shared step loop (``parlab.runtime.loop``):
``warmup`` steps, one *metered* step (parlab's comm log records every TP/CP/PP transfer with
its axis and payload; activation bytes are the step's peak above what was live before it),
then ``steps`` timed steps (CUDA events, no meter). Each logged transfer is then replayed
alone on its axis's group to time it (``comm_time.<axis>``: the time on the wire, not the
exposed time). ``many.mi_many`` runs several in one launch, each isolated.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from parlab.data import SyntheticTokens
from parlab.models import get_spec
from parlab.models.reference import build_model
from parlab.parallel import context, tensor_comm
from parlab.parallel.compose import ParallelPlan, parallelize
from parlab.parallel.context import local_positions, shard_sequence
from parlab.parallel.pipeline import build_stage, run_schedule, torch_schedule
from parlab.parallel.pipeline_schedules import build
from parlab.parallel.tensor import apply_torch_tensor_parallel, tp_cross_entropy
from parlab.projects.model_internal.config import RunConfig
from parlab.runtime import meters
from parlab.runtime.comm_meter import CommMeter, replay_transfer
from parlab.runtime.context import RankContext
from parlab.runtime.loop import LoopPlan, TrainStep, next_token_loss, run_steps
from parlab.topology import Topology


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
    dt = [p for p in params if isinstance(p, DTensor)]
    plain = [p for p in params if not isinstance(p, DTensor)]
    opts: list[torch.optim.Optimizer] = []
    if plain:
        opts.append(torch.optim.AdamW(plain, lr=1e-4, fused=dev.type == "cuda"))
    if dt:
        opts.append(torch.optim.AdamW(dt, lr=1e-4, foreach=True))
    return _Optimizers(opts)


def _stages(cfg: RunConfig, model: Any, pp_rank: int) -> tuple[Any, dict[int, Any]]:
    """This rank's pipeline stage(s): the model pruned to them, and stage -> module when a rank
    holds several (interleaved: r, r + p, ...; torch's V: r and 2p - 1 - r)."""
    if cfg.pp > 1 and cfg.vpp > 1:
        n_st = cfg.pp * cfg.vpp
        mine = list(range(pp_rank, n_st, cfg.pp))
        if cfg.schedule == "zbv":  # the V: rank 0 holds the first and the last stage
            mine = [pp_rank, n_st - 1 - pp_rank]
        stages = {s: build_stage(model, s, n_st) for s in mine}
        return torch.nn.ModuleList(stages.values()), stages  # the parameters of every chunk
    if cfg.pp > 1:
        return build_stage(model, pp_rank, cfg.pp, copy_model=False), {}
    return model, {}


class LayoutStep(TrainStep):
    """One step of a layout: the whole pipeline schedule, torch's, or one forward and backward;
    each CP rank's loss covers its own tokens, so the step's loss is their mean."""

    def __init__(
        self, cfg: RunConfig, ctx: RankContext, mesh: Any, model: Any, stages: dict[int, Any]
    ) -> None:
        self.cfg, self.ctx, self.model, self.stages = cfg, ctx, model, stages
        topo = Topology(world_size=ctx.world_size, tp=cfg.tp, pp=cfg.pp, cp=cfg.cp)
        self.c = topo.coords(ctx.rank)
        self.dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
        self.spec = get_spec(cfg.model)
        self.tokens = SyntheticTokens(vocab_size=self.spec.vocab_size, seq=cfg.seq, seed=0)
        self.groups = {
            a: mesh[a].get_group() for a in ("tp", "pp", "cp") if getattr(cfg, a) > 1 and mesh
        }
        self.tp_group = self.groups.get("tp") if cfg.impl == "parlab" else None
        self.torch_pp = None
        if cfg.impl == "torch" and cfg.pp > 1:
            self.torch_pp = torch_schedule(
                stages or {self.c["pp"]: model},
                cfg.pp * cfg.vpp,
                cfg.schedule,
                cfg.microbatches,
                loss_fn=next_token_loss,
                group=self.groups["pp"],
                device=ctx.device,
            )
        self.schedule = (
            None if self.torch_pp else build(cfg.schedule, cfg.pp, cfg.microbatches, cfg.vpp)
        )
        dev = ctx.device
        self.positions = (
            local_positions(cfg.seq, cfg.cp, self.c["cp"], device=dev) if cfg.cp > 1 else None
        )
        self.opt = make_optimizer([p for p in model.parameters() if p.requires_grad], dev)
        self.out: torch.Tensor | None = None
        self.drawn: Any = None
        self.value: float | None = None
        self.extra: dict[str, Any] = {}

    def loss_fn(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.tp_group is not None:
            return tp_cross_entropy(logits, target, self.tp_group, loss_parallel=True)
        return next_token_loss(logits, target)

    def data(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, dev, cp = self.cfg, self.ctx.device, self.c["cp"]
        self.drawn = b = self.tokens.global_batch(i, cfg.global_batch)  # held through the step
        x, y = b.inputs.to(dev), b.labels.to(dev)
        if cfg.cp > 1:
            x, y = shard_sequence(x, cfg.cp, cp), shard_sequence(y, cfg.cp, cp)
        return x, y

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> Any:
        cfg, (x, y), pp = self.cfg, batch, self.c["pp"]
        self.extra = {}
        if self.torch_pp is not None:
            losses: list[torch.Tensor] = []
            last = 0 if cfg.schedule == "zbv" else cfg.pp - 1  # the V ends on rank 0
            kw = {"target": y, "losses": losses} if pp == last else {}
            self.torch_pp.step(x, **kw) if pp == 0 else self.torch_pp.step(**kw)
            return sum(float(t.detach()) for t in losses) / len(losses) if losses else None
        if cfg.pp > 1 or cfg.microbatches > 1:
            st = run_schedule(
                self.schedule,
                self.stages or {pp: self.model},
                microbatches=list(x.chunk(cfg.microbatches)),
                targets=list(y.chunk(cfg.microbatches)),
                loss_fn=self.loss_fn,
                act_shape=(cfg.micro_batch, cfg.seq // cfg.cp, self.spec.hidden),
                act_dtype=self.dtype,
                group=self.groups.get("pp"),
                device=self.ctx.device,
            )
            self.extra = {"bubble": st.bubble, "busy_s": st.busy_s, "wall_s": st.wall_s}
            return st.loss
        # the step without a schedule keeps the model's output through backward
        self.out = (
            self.model(x, positions_S=self.positions)
            if self.positions is not None
            else self.model(x)
        )
        return self.loss_fn(self.out, y)

    def backward(self, loss: Any) -> None:
        """The plain step's backward (a schedule ran its own inside ``forward``)."""
        if isinstance(loss, torch.Tensor):
            loss.backward()
            loss = float(loss.detach())
        self.value = loss

    def optimizer(self) -> None:
        self.opt.step()

    def zero_grad(self) -> None:
        self.opt.zero_grad(set_to_none=True)

    def end(self, i: int, loss: Any) -> tuple[float | None, dict[str, Any]]:
        value = self.value
        if self.cfg.cp > 1 and value is not None:  # each CP rank's loss covers its own tokens
            lt = torch.tensor([value], device=self.ctx.device)
            dist.all_reduce(lt, group=self.groups["cp"])
            value = float(lt) / self.cfg.cp
        self.out = self.drawn = None
        return value, self.extra


class _MeteredStep:
    """The metered step's context: its comm log and c10d meter, and its activation bytes (the
    step's peak above what was live before it)."""

    def __init__(self, ctx: RankContext, memory: meters.MemoryMeter, cfg: RunConfig) -> None:
        self.ctx, self.memory, self.cfg = ctx, memory, cfg
        self.log: list[dict[str, Any]] = []
        self.dispatcher = CommMeter()  # every c10d collective, DDP's all-reduce too
        self.act_bytes = 0
        self._stack = contextlib.ExitStack()

    def __call__(self) -> _MeteredStep:
        return self

    def __enter__(self) -> _MeteredStep:
        self.ctx.sync()
        self.live_before = self.memory.live_bytes()
        tracker = getattr(self.memory, "_tracker", None)
        if self.ctx.is_cuda:
            torch.cuda.reset_peak_memory_stats(self.ctx.device)
        elif tracker is not None and hasattr(tracker, "peak"):
            tracker.peak = tracker.live
        self._stack.enter_context(metered(self.dispatcher, self.cfg))
        self.log = self._stack.enter_context(tensor_comm.comm_log())
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()
        self.ctx.sync()
        self.act_bytes = self.memory.peak_bytes() - self.live_before


def _parallel_model(cfg: RunConfig, ctx: RankContext, mesh: Any) -> tuple[Any, dict[int, Any]]:
    """The model this rank trains, parallelised: its stage(s), then TP, CP, compile and DDP over
    the CP ranks in ``parallelize``'s order (torch's references: DTensor TP, or torch's stages
    left as they are for ``torch.distributed.pipelining``)."""
    pp_rank = Topology(world_size=ctx.world_size, tp=cfg.tp, pp=cfg.pp, cp=cfg.cp).coords(ctx.rank)[
        "pp"
    ]
    dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
    model = build_model(get_spec(cfg.model), device=ctx.device, dtype=dtype, seed=0)
    model, stages = _stages(cfg, model, pp_rank)
    if cfg.impl == "torch":
        if cfg.tp > 1:
            apply_torch_tensor_parallel(model, mesh["tp"])
        return model, stages
    plan = ParallelPlan(
        sequence_parallel=cfg.sp,
        loss_parallel=cfg.tp > 1,
        cp_variant=cfg.cp_variant,
        compile=cfg.compile,
        data_parallel="ddp" if cfg.cp > 1 else "none",
    )
    if stages:
        for k in stages:
            stages[k] = parallelize(stages[k], mesh, plan)
        return model, stages
    return parallelize(model, mesh, plan), stages


def mi_rank(ctx: RankContext, **raw: Any) -> dict[str, Any]:
    """Rank function: build, parallelise, train and measure one ``RunConfig``."""
    cfg = RunConfig(**raw)
    dev = ctx.device
    dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
    topo = Topology(world_size=ctx.world_size, tp=cfg.tp, pp=cfg.pp, cp=cfg.cp)
    mesh = topo.build_mesh(dev.type) if ctx.world_size > 1 else None
    memory = meters.MemoryMeter(dev)
    with memory:
        model, stages = _parallel_model(cfg, ctx, mesh)
        step = LayoutStep(cfg, ctx, mesh, model, stages)
        param_bytes = meters.count_bytes([p for p in model.parameters() if p.requires_grad])
        meter = _MeteredStep(ctx, memory, cfg)
        plan = LoopPlan(warmup=cfg.warmup, timed=cfg.steps, metered="first")
        record = run_steps(step, plan, dev, meter=meter)
    losses = [loss for loss, _ in record.records]
    metered_extra = record.records[cfg.warmup][1]
    extras = [extra for _, extra in record.records[cfg.warmup + 1 :]]
    by_axis: dict[str, dict[str, float]] = {}
    ops: dict[str, dict[str, int]] = {}
    for e in meter.log:
        a = by_axis.setdefault(e["axis"], {"bytes": 0, "count": 0, "time_s": 0.0})
        a["bytes"] += e["bytes"]
        a["count"] += 1
        o = ops.setdefault(f"{e['axis']}.{e['op']}", {"bytes": 0, "count": 0})
        o["bytes"] += e["bytes"]
        o["count"] += 1
    for e in meter.log:  # every rank logged the same sequence per axis: replay in lockstep
        if e["axis"] in step.groups:
            group = step.groups[e["axis"]]
            by_axis[e["axis"]]["time_s"] += replay_transfer(e["op"], e["bytes"], group, dev, dtype)
    bubbles = [x["bubble"] for x in extras if "bubble" in x]
    return {
        "step_times": record.step_times,
        "losses": losses,
        "peak_memory": memory.peak_bytes(),
        "memory_source": memory.source,
        "param_bytes": param_bytes,
        "activation_bytes": meter.act_bytes,
        "comm": by_axis,
        "comm_ops": ops,
        "c10d_by_op": meter.dispatcher.by_op(),
        "bubble": meters.median(bubbles) if bubbles else None,
        "metered_bubble": metered_extra.get("bubble"),
        "device": meters.device_name(dev),
        "tokens_per_step": cfg.global_batch * cfg.seq,
        "fallbacks": sorted(set(context._FALLBACKS))[:3],
    }
