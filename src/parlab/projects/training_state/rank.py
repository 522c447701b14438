"""What a rank does in a training-state run: build, wrap in the strategy, train, measure.

One run on every rank: build the model from its preset (same seed on every rank), then
``compose.parallelize``: recomputation, compile, then the strategy over all ranks (the
data-parallel group); train ``warmup + steps + 1`` steps (``parlab.runtime.loop``) on the
rank's slice of a seeded synthetic global batch (or a local text file). The ``steps`` timed
steps run with no meter in the way; the one step after them is the *metered* step (steady
state: DDP's bucket rebuild and lazy optimizer state are behind it): the comm meter records
every collective it issues (payload per op). Peak memory covers the whole run (CUDA
allocator, or tracked tensor bytes on CPU); state bytes are counted from the real tensors
after the metered step's optimizer update. After training, the metered step's collectives are
replayed alone to time them (``comm_time``), and the per-step losses are averaged over the
ranks (one all-reduce) so they can be compared with single-process training.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any

import torch
import torch.distributed as dist

from parlab.data import SyntheticTokens, TextTokens, rank_batch
from parlab.models import get_spec
from parlab.models.reference import build_model
from parlab.parallel import data, fsdp, zero
from parlab.parallel.compose import ParallelPlan, parallelize
from parlab.parallel.deepspeed import DeepSpeedZero
from parlab.profile.capture import maybe_profile
from parlab.projects.training_state.config import DTYPES, PROJECT
from parlab.runtime import meters
from parlab.runtime.comm_meter import CommMeter
from parlab.runtime.context import RankContext
from parlab.runtime.loop import LoopPlan, TrainStep, next_token_loss, run_steps
from parlab.topology import Topology


def _make_optimizer(cfg: dict[str, Any], device: torch.device) -> Any:
    def make(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        if cfg["optimizer"] == "sgd":
            return torch.optim.SGD(params, lr=cfg["lr"])
        return torch.optim.AdamW(
            params, lr=cfg["lr"], weight_decay=0.0, fused=device.type == "cuda"
        )

    return make


def build_strategy(ctx: RankContext, cfg: dict[str, Any], model: torch.nn.Module) -> Any:
    """Wrap ``model`` in the run's strategy over all ranks (the data-parallel group)."""
    make_opt = _make_optimizer(cfg, ctx.device)
    name = cfg["strategy"]
    compute = DTYPES[cfg["dtype"]]
    group = dist.group.WORLD
    if name == "ddp":
        return fsdp.TorchDDP(model, group, make_opt, bucket_mb=cfg["bucket_mb"])
    if name == "ddp-naive":
        return data.DataParallelNaive(model, group, make_opt)
    if name == "ddp-bucket":
        return data.DataParallelBucket(
            model, group, make_opt, bucket_bytes=int(cfg["bucket_mb"] * 2**20)
        )
    if name.startswith("deepspeed-zero"):
        return DeepSpeedZero(
            model,
            make_opt,
            stage=int(name[-1]),
            micro_batch=(cfg["global_batch"] or cfg["micro_batch"] * ctx.world_size)
            // ctx.world_size,
            bf16=compute == torch.bfloat16,
            local_rank=ctx.local_rank,
        )
    if name.startswith("zero"):
        return zero.ZeroDataParallel(
            model,
            group,
            make_opt,
            stage=int(name[4]),
            naive=name.endswith("-naive"),
            compute_dtype=compute if compute != torch.float32 else None,
            param_dtype=compute if cfg["dtype"] == "bf16-params" else None,
        )
    if name == "fsdp":
        mesh = Topology(world_size=ctx.world_size, dp=ctx.world_size).build_mesh(ctx.device.type)
    else:
        shard = cfg["hybrid_shard"] or max(1, ctx.world_size // 2)
        mesh = fsdp.hybrid_mesh(ctx.device.type, ctx.world_size, shard)
    return fsdp.TorchFSDP(
        model,
        mesh,
        make_opt,
        param_dtype=compute if compute != torch.float32 else None,
        reduce_dtype=torch.float32,
        reshard_after_forward=cfg["reshard_after_forward"],
    )


def autocast_for(cfg: dict[str, Any], device: torch.device) -> Any:
    """bf16 autocast where the strategy computes in fp32 parameters (FSDP2 and DeepSpeed cast
    themselves; ``bf16-params`` holds bf16 parameters), else nothing."""
    compute = DTYPES[cfg["dtype"]]
    if (
        compute != torch.float32
        and not cfg["strategy"].startswith(("fsdp", "deepspeed"))
        and cfg["dtype"] != "bf16-params"
    ):
        return torch.autocast(device.type, dtype=compute)
    return contextlib.nullcontext()


class StrategyStep(TrainStep):
    """One step of the reference model under a strategy, on this rank's slice of the batch,
    with the run's own bookkeeping: manual garbage collection, the metered step's state bytes,
    torch DDP's first buckets released, the profiler's step.

    The logits stay alive through backward, and until the next step's forward and loss are
    made, as the ledger counts them (``logits_held``); so do the batch and the loss, as a loop
    variable's would."""

    def __init__(
        self,
        ctx: RankContext,
        strat: Any,
        dataset: Any,
        global_batch: int,
        autocast: Any,
        *,
        plan: LoopPlan,
        gc_every: int,
        mem: meters.MemoryMeter,
        comm: CommMeter,
        prof: Any,
    ) -> None:
        self.ctx, self.strat, self.dataset = ctx, strat, dataset
        self.global_batch, self.autocast = global_batch, autocast
        self.plan, self.mem, self.comm, self.prof = plan, mem, comm, prof
        self.gc_every = gc_every
        self.logits: torch.Tensor | None = None
        self.batch: Any = None
        self.loss: torch.Tensor | None = None
        self.state: dict[str, int] = {}
        self.retries_before: int | None = None
        self.metered = False

    def begin(self, i: int, *, metered: bool) -> None:
        if self.gc_every and i and i % self.gc_every == 0:
            gc.collect(1)
        if i == self.plan.warmup:
            self.retries_before = self.mem.alloc_retries()
        self.metered = metered
        if metered and hasattr(self.strat, "meter_next_step"):
            self.strat.meter_next_step()  # DeepSpeed: hold the gradients it frees in its step
        self.comm.step = i

    def data(self, i: int) -> Any:
        """This rank's slice, held until the next step's is drawn (a loop variable's life)."""
        ctx = self.ctx
        self.batch = rank_batch(
            self.dataset.global_batch(i, self.global_batch), ctx.rank, ctx.world_size, ctx.device
        )
        return self.batch

    def forward(self, batch: Any) -> torch.Tensor:
        with self.autocast:
            logits = self.strat(batch.inputs)
            loss = next_token_loss(logits, batch.labels)
        self.logits, self.loss = logits, loss  # the last step's freed only now
        return loss

    def backward(self, loss: torch.Tensor) -> None:
        """``loss``'s backward (DeepSpeed: through its engine), then the strategy's end of it."""
        if hasattr(self.strat, "backward"):
            self.strat.backward(loss)
        else:
            loss.backward()
        self.strat.finish_backward()

    def optimizer(self) -> None:
        self.strat.step()
        if self.metered:
            self.state = meters.state_bytes(self.strat.state_items())

    def zero_grad(self) -> None:
        self.strat.zero_grad()

    def end(self, i: int, loss: torch.Tensor) -> torch.Tensor:
        if i == 0 and hasattr(self.strat, "release_first_buckets"):
            self.strat.release_first_buckets()  # torch DDP: peak = steady state, no race
        return loss.detach()

    def after(self, i: int) -> None:
        self.prof.step()


def train_rank(ctx: RankContext, return_params: bool = False, **cfg: Any) -> dict[str, Any]:
    """Rank function: one training run (``TrainConfig.to_json()``); returns this rank's measurements.

    ``return_params`` adds every parameter, whole, as numpy arrays (tests; not JSON).
    """
    spec = get_spec(cfg["model"])
    dev = ctx.device
    mem = meters.MemoryMeter(dev, cap_bytes=cfg["memory_cap"])
    comm = CommMeter()
    seq = cfg["seq"]
    dataset = (
        TextTokens(cfg["data"], seq=seq, seed=cfg["seed"])
        if cfg["data"]
        else SyntheticTokens(vocab_size=spec.vocab_size, seq=seq, seed=cfg["seed"])
    )
    global_batch = cfg["global_batch"] or cfg["micro_batch"] * ctx.world_size
    plan = LoopPlan(warmup=cfg["warmup"], timed=cfg["steps"], metered="last")
    autocast = autocast_for(cfg, dev)
    # a no-op unless ``parlab profile run -- parlab train ...`` asked for traces
    prof = maybe_profile(ctx, label=f"train-{cfg['strategy']}", project=PROJECT)
    with mem, prof:
        model = build_model(spec, device=dev, dtype=torch.float32, seed=cfg["seed"])
        knobs = ParallelPlan(recompute=cfg["recompute"], compile=cfg["compile"])
        strat = parallelize(model, None, knobs, data_parallel=lambda m: build_strategy(ctx, cfg, m))
        if cfg.get("manual_gc"):
            gc.collect()
            gc.disable()
        gc_every = int(cfg.get("manual_gc") or 0)
        run = StrategyStep(
            ctx, strat, dataset, global_batch, autocast,
            plan=plan, gc_every=gc_every, mem=mem, comm=comm, prof=prof,
        )  # fmt: skip
        # Not under torch.compile: a dispatch mode would change what gets compiled.
        meter = contextlib.nullcontext if cfg["compile"] else lambda: comm
        record = run_steps(run, plan, dev, meter=meter, phases=True)
        if cfg.get("manual_gc"):
            gc.enable()
        peak = mem.peak_bytes()
        retries = mem.alloc_retries()
        if retries is not None and run.retries_before is not None:
            retries -= run.retries_before  # over the timed steps (and the metered one after them)
    mem.release_cap()
    metered_step = plan.metered_step
    comm_time = comm.replay(metered_step, dev)
    params = strat.full_parameters() if return_params else None
    loss_t = torch.stack(record.records).float()
    dist.all_reduce(loss_t)
    loss_t /= ctx.world_size
    return {
        "rank": ctx.rank,
        "device": meters.device_name(dev),
        "losses": loss_t.tolist(),
        "step_times": record.step_times,
        "phase_times": record.phase_times,
        "peak_memory": peak,
        "memory_source": mem.source,
        "peak_reserved": mem.peak_reserved_bytes(),
        "alloc_retries": retries,
        "state_bytes": run.state,
        "comm_metered": not cfg["compile"],
        "comm_by_op": comm.by_op(metered_step),
        "comm_bytes_per_step": comm.bytes_in_step(metered_step),
        "comm_time": comm_time,
        "tokens_per_step": global_batch * seq // ctx.world_size,
        **({"params": {k: v.cpu().numpy() for k, v in params.items()}} if params else {}),
    }


def train_many(ctx: RankContext, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rank function: several runs one after another in one launch (CPU sets: saves start-ups)."""
    out = []
    for cfg in runs:
        out.append(train_rank(ctx, **cfg))
        dist.barrier()
    return out
