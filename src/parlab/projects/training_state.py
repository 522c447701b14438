"""PAR-TRAINING-STATE: train the reference model under DDP, ZeRO-1/2/3 or FSDP and measure it.

``run_training(cfg)`` launches ``train_rank`` on ``cfg.nproc`` ranks through
torchrun (NCCL on GPUs, gloo on CPU) and turns what comes back into one
contract document: role ``baseline`` for ``ddp``, ``candidate`` for the rest,
``failure`` when a rank fails (an ``oom`` carries the ledger's prediction
too). Evidence level: ``real-training`` on NCCL, ``cpu-mechanism`` on gloo.

On every rank, one run is: build the model from its preset (same seed on
every rank), apply recomputation, compile, then the strategy; train
``warmup + steps + 1`` steps on the rank's slice of a seeded synthetic global
batch (or a local text file). The ``steps`` timed steps run with no meter in
the way; the one step after them is the *metered* step (steady state: DDP's
bucket rebuild and lazy optimizer state are behind it): the comm meter
records every collective it issues (payload per op). Peak memory covers the
whole run (CUDA allocator, or tracked tensor bytes on CPU); state bytes are
counted from the real tensors after the last step's optimizer update. After
training, the metered step's collectives are replayed alone to time them
(``comm_time``), and the per-step losses are averaged over the ranks (one
all-reduce) so they can be compared with single-process training.

Strategies: ``ddp`` (torch DDP, the baseline), ``fsdp`` (FSDP2),
``fsdp-hybrid`` (FSDP2 over ``dp_replicate x dp_shard``), parlab's own
``zero1|zero2|zero3`` and ``ddp-bucket`` (and each one's ``-naive`` form), and
``deepspeed-zero1|2|3`` (DeepSpeed's ZeRO stages, where DeepSpeed is installed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from parlab.contract import Document, Failure, Metric, Prediction, new_run_id, now_iso
from parlab.dtypes import check_recipe, document_dtype
from parlab.errors import UsageError
from parlab.ledger.predict import DtypePolicy
from parlab.models.reference import norm_kernel
from parlab.profile.capture import ENV_DIR as PROFILE_ENV_DIR
from parlab.runtime.context import RankContext

PROJECT = "PAR-TRAINING-STATE"

STRATEGIES = (
    "ddp",
    "ddp-bucket",
    "ddp-naive",
    "zero1",
    "zero1-naive",
    "zero2",
    "zero2-naive",
    "zero3",
    "zero3-naive",
    "fsdp",
    "fsdp-hybrid",
    "deepspeed-zero1",
    "deepspeed-zero2",
    "deepspeed-zero3",
)
"""``ddp``/``fsdp``/``fsdp-hybrid``: torch's paths; ``deepspeed-zero*``: DeepSpeed's (optional);
the others: parlab's mechanisms."""

DTYPES = {"fp32": torch.float32, "bf16-compute": torch.bfloat16, "bf16-params": torch.bfloat16}
"""``--dtype`` (``parlab.dtypes``) -> compute dtype. ``bf16-compute``: bf16 compute over fp32
parameters (autocast; FSDP: FSDP2's param_dtype). ``bf16-params``: bf16 parameters and
gradients with an fp32 master shard the optimizer steps (parlab's ZeRO-1/2; DeepSpeed's bf16
recipe, the only bf16 DeepSpeed runs)."""
MASTER_STRATEGIES = ("zero1", "zero2", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3")
OPTIMIZERS = ("adamw", "sgd")
STATE_ITEMS = ("params", "grads", "optimizer")
MASTER_ITEMS = ("master_params", "master_grads")
"""The state items a ``bf16-params`` run adds (the ledger's items of the same names)."""
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


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run."""

    strategy: str
    """One of ``STRATEGIES``."""
    model: str
    """Model preset or catalog name (``tiny``, ``small``, ``1.3b``, ``8b``, ...)."""
    nproc: int = 2
    """Ranks (GPUs, or gloo CPU processes); all of them form the data-parallel group."""
    steps: int = 5
    """Timed steps."""
    warmup: int = 2
    """Untimed steps first (one more untimed step, metered, follows the timed ones)."""
    micro_batch: int = 2
    """Sequences per rank per step."""
    global_batch: int | None = None
    """Sequences per step over all ranks (default micro_batch x nproc); nproc must divide it."""
    seq: int = 128
    """Tokens per sequence."""
    dtype: str = "fp32"
    """``fp32``, ``bf16-compute`` (bf16 compute; parameters, gradients, optimizer state stay
    fp32) or ``bf16-params`` (ZeRO-1/2: bf16 parameters and gradients, fp32 master shards)."""
    recompute: str = "none"
    """Activation checkpointing per block: ``none``, ``selective`` or ``full``."""
    compile: bool = False
    """``torch.compile`` each block."""
    optimizer: str = "adamw"
    """``adamw`` (fused on CUDA) or ``sgd``."""
    lr: float = 1e-3
    """Learning rate."""
    seed: int = 0
    """Seed of the weights and the data."""
    reshard_after_forward: bool = True
    """FSDP: free gathered parameters after forward (gather again for backward)."""
    hybrid_shard: int | None = None
    """``fsdp-hybrid``: ranks per shard group (default: nproc // 2, at least 1)."""
    bucket_mb: float = 25.0
    """DDP bucket size, MiB."""
    memory_cap: int | None = None
    """Per-rank memory limit in bytes: going past it is an out-of-memory failure."""
    data: str | None = None
    """A local text file to train on (byte tokens) instead of synthetic tokens."""
    timeout_s: float = 300.0
    """Process-group timeout, seconds."""
    numa_binding: str | None = None
    """torchrun ``--numa-binding`` (node, socket, exclusive, core-complex): each rank on the
    CPUs near its GPU; None: the operating system places the ranks."""
    manual_gc: int = 50
    """N (default 50, torchtitan's ``gc_freq`` default): Python's automatic garbage collection
    off while training, a young-generation collection (``gc.collect(1)``) every N steps
    instead -- Megatron's ``--manual-gc``; 0: automatic collection, which pauses the host
    mid-step: in every 10-step GPT-2 1.5B FSDP run with it (16 runs, one and two H200s), the
    ninth timed step took 1.4-1.9 x the run's median, and in neither run with ``--manual-gc
    50`` (``results/PAR-TRAINING-STATE/train-fsdp-gpt2-1.5b-20261201T0025*``)."""

    def __post_init__(self) -> None:
        from parlab.models import get_spec
        from parlab.parallel.fsdp import RECOMPUTE
        from parlab.runtime.launch import check_numa_binding

        if self.strategy not in STRATEGIES:
            raise UsageError(
                f"unknown strategy {self.strategy!r}: use one of {', '.join(STRATEGIES)}"
            )
        if self.strategy.startswith("deepspeed"):
            from parlab.parallel.deepspeed import deepspeed_version

            deepspeed_version()  # one line when DeepSpeed is not installed: before any launch
        spec = get_spec(self.model)  # UsageError naming the known presets
        for name in ("nproc", "steps", "warmup", "micro_batch", "seq"):
            if getattr(self, name) < 1:
                raise UsageError(
                    f"--{name.replace('_', '-')} {getattr(self, name)} must be at least 1"
                )
        if self.global_batch is not None and self.global_batch % self.dp:
            raise UsageError(
                f"global batch {self.global_batch} is not divisible by the data-parallel degree "
                f"{self.dp}: use a multiple of {self.dp}"
            )
        if self.global_batch is not None and self.global_batch < self.dp:
            raise UsageError(
                f"global batch {self.global_batch} gives a rank nothing: use >= {self.dp}"
            )
        check_recipe(self.dtype, DTYPES)
        if self.dtype == "bf16-params" and self.strategy not in MASTER_STRATEGIES:
            raise UsageError(
                f"--dtype bf16-params (bf16 parameters, fp32 master shards) runs under zero1, "
                f"zero2 and deepspeed-zero*, not {self.strategy}: use --dtype bf16-compute"
            )
        if self.dtype == "bf16-compute" and self.strategy.startswith("deepspeed"):
            raise UsageError(
                "DeepSpeed's bf16 keeps bf16 parameters with an fp32 master: --dtype bf16-params"
            )
        if self.recompute not in RECOMPUTE:
            raise UsageError(f"--recompute {self.recompute!r} is not one of {', '.join(RECOMPUTE)}")
        if self.optimizer not in OPTIMIZERS:
            raise UsageError(
                f"--optimizer {self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}"
            )
        if spec.moe is not None:
            raise UsageError(f"model {self.model!r} is MoE: training-state runs take dense models")
        if self.strategy.removeprefix("deepspeed-").startswith("zero3") and spec.tied_embeddings:
            raise UsageError(
                f"model {self.model!r} ties its embeddings: zero3 gathers per unit and cannot "
                "share a weight between the first and last unit; use fsdp"
            )
        if spec.position == "learned" and self.seq > spec.max_seq_len:
            raise UsageError(f"--seq {self.seq} exceeds the model's {spec.max_seq_len} positions")
        if self.data is None and spec.vocab_size < 2:
            raise UsageError("the model's vocabulary is too small for synthetic tokens")
        if self.manual_gc < 0:
            raise UsageError(f"--manual-gc {self.manual_gc} must be 0 (off) or a step interval")
        check_numa_binding(self.numa_binding)
        if self.data is not None and spec.vocab_size < 256:
            raise UsageError("a text file needs a vocabulary of at least 256 (byte tokens)")
        if self.strategy == "fsdp-hybrid" and self.nproc % self.shard_size:
            raise UsageError(
                f"--hybrid-shard {self.shard_size} does not divide --nproc {self.nproc}: "
                "pick a divisor"
            )
        if self.compile and self.strategy not in ("ddp", "fsdp", "fsdp-hybrid"):
            raise UsageError(
                f"--compile with {self.strategy}: parlab's own mechanisms run eager (their hooks "
                "issue collectives); use --compile with ddp, fsdp or fsdp-hybrid"
            )
        if self.memory_cap is not None and self.memory_cap < 1:
            raise UsageError("--memory-cap must be a positive size")

    @property
    def dp(self) -> int:
        return self.nproc

    @property
    def shard_size(self) -> int:
        return self.hybrid_shard or max(1, self.nproc // 2)

    @property
    def batch(self) -> int:
        """The global batch, in sequences."""
        return self.global_batch or self.micro_batch * self.dp

    @property
    def per_rank_batch(self) -> int:
        return self.batch // self.dp

    @property
    def role(self) -> str:
        return "baseline" if self.strategy == "ddp" else "candidate"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------
# On every rank


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
    from parlab.parallel import data, fsdp, zero
    from parlab.topology import Topology

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
        from parlab.parallel.deepspeed import DeepSpeedZero

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


def train_rank(ctx: RankContext, return_params: bool = False, **cfg: Any) -> dict[str, Any]:
    """Rank function: one training run (``TrainConfig.to_json()``); returns this rank's measurements.

    ``return_params`` adds every parameter, whole, as numpy arrays (tests; not JSON).
    """
    from parlab.data import SyntheticTokens, TextTokens, rank_batch
    from parlab.models import get_spec
    from parlab.models.reference import build_model
    from parlab.parallel.fsdp import apply_compile, apply_recompute
    from parlab.profile.capture import maybe_profile
    from parlab.runtime import meters

    spec = get_spec(cfg["model"])
    dev = ctx.device
    compute = DTYPES[cfg["dtype"]]
    mem = meters.MemoryMeter(dev, cap_bytes=cfg["memory_cap"])
    comm = meters.CommMeter()
    seq = cfg["seq"]
    dataset = (
        TextTokens(cfg["data"], seq=seq, seed=cfg["seed"])
        if cfg["data"]
        else SyntheticTokens(vocab_size=spec.vocab_size, seq=seq, seed=cfg["seed"])
    )
    global_batch = cfg["global_batch"] or cfg["micro_batch"] * ctx.world_size
    warmup, steps = cfg["warmup"], cfg["steps"]
    metered_step = warmup + steps  # one extra step after the timed ones: steady state, untimed
    autocast = (
        torch.autocast(dev.type, dtype=compute)
        if compute != torch.float32
        and not cfg["strategy"].startswith(("fsdp", "deepspeed"))
        and cfg["dtype"] != "bf16-params"
        else contextlib.nullcontext()
    )
    losses: list[torch.Tensor] = []
    timer = meters.StepTimer(dev)
    phases = meters.PhaseTimer(dev)
    # a no-op unless ``parlab profile run -- parlab train ...`` asked for traces
    prof = maybe_profile(ctx, label=f"train-{cfg['strategy']}", project=PROJECT)
    with mem, prof:
        model = build_model(spec, device=dev, dtype=torch.float32, seed=cfg["seed"])
        apply_recompute(model, cfg["recompute"])
        if cfg["compile"]:
            apply_compile(model)
        strat = build_strategy(ctx, cfg, model)
        state: dict[str, int] = {}
        retries_before: int | None = None
        gc_every = int(cfg.get("manual_gc") or 0)
        if gc_every:
            gc.collect()
            gc.disable()
        for step in range(warmup + steps + 1):
            if gc_every and step and step % gc_every == 0:
                gc.collect(1)
            if step == warmup:
                timer.mark()
                retries_before = mem.alloc_retries()
            timed = warmup <= step < metered_step
            if timed:
                phases.start()
            batch = rank_batch(
                dataset.global_batch(step, global_batch), ctx.rank, ctx.world_size, dev
            )
            if timed:
                phases.mark("data")
            # Not under torch.compile: a dispatch mode would change what gets compiled.
            meter_now = step == metered_step and not cfg["compile"]
            if step == metered_step and hasattr(strat, "meter_next_step"):
                strat.meter_next_step()  # DeepSpeed: hold the gradients it frees in its step
            metering = comm if meter_now else contextlib.nullcontext()
            comm.step = step
            with metering:
                # the logits stay alive through backward, as the ledger counts (logits_held)
                _logits, loss = forward_loss(strat, batch, autocast)
                if timed:
                    phases.mark("forward")
                backward(strat, loss)
                if timed:
                    phases.mark("backward")
                strat.step()
                if timed:
                    phases.mark("optimizer")
            if step == metered_step:
                state = meters.state_bytes(strat.state_items())
            strat.zero_grad()
            if step == 0 and hasattr(strat, "release_first_buckets"):
                strat.release_first_buckets()  # torch DDP: peak = steady state, no race
            losses.append(loss.detach())
            if timed:
                phases.mark("zero_grad")
                timer.mark()
            prof.step()
        if gc_every:
            gc.enable()
        step_times = timer.step_times()
        phase_times = phases.times()
        peak = mem.peak_bytes()
        retries = mem.alloc_retries()
        if retries is not None and retries_before is not None:
            retries -= retries_before  # over the timed steps (and the metered one after them)
    mem.release_cap()
    comm_time = comm.replay(metered_step, dev)
    params = strat.full_parameters() if return_params else None
    loss_t = torch.stack(losses).float()
    dist.all_reduce(loss_t)
    loss_t /= ctx.world_size
    return {
        "rank": ctx.rank,
        "device": meters.device_name(dev),
        "losses": loss_t.tolist(),
        "step_times": step_times,
        "phase_times": phase_times,
        "peak_memory": peak,
        "memory_source": mem.source,
        "peak_reserved": mem.peak_reserved_bytes(),
        "alloc_retries": retries,
        "state_bytes": state,
        "comm_metered": not cfg["compile"],
        "comm_by_op": comm.by_op(metered_step),
        "comm_bytes_per_step": comm.bytes_in_step(metered_step),
        "comm_time": comm_time,
        "tokens_per_step": global_batch * seq // ctx.world_size,
        **({"params": {k: v.cpu().numpy() for k, v in params.items()}} if params else {}),
    }


# ---------------------------------------------------------------------------
# In the launching process


def backend_for(nproc: int) -> str:
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= nproc else "gloo"


def ledger_strategy(strategy: str) -> str:
    """The ledger's name for a strategy (parlab's DDP forms are all ``ddp``; naive forms share
    their stage's memory; DeepSpeed's ZeRO stages are the ledger's ``zero1|2|3``)."""
    base = strategy.removesuffix("-naive").removeprefix("deepspeed-")
    return "ddp" if base in ("ddp", "ddp-bucket") else base


def forward_loss(strat: Any, batch: Any, autocast: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """One micro-batch's forward through ``strat``: (its logits, their cross-entropy loss in
    float32). The caller holds the logits through backward, as the ledger counts
    (``logits_held``)."""
    with autocast:
        logits = strat(batch.inputs)
        return logits, F.cross_entropy(logits.flatten(0, 1).float(), batch.labels.flatten())


def backward(strat: Any, loss: torch.Tensor) -> None:
    """``loss``'s backward (DeepSpeed: through its engine), then the strategy's end of it."""
    if hasattr(strat, "backward"):
        strat.backward(loss)
    else:
        loss.backward()
    strat.finish_backward()


def ledger_predictions(cfg: TrainConfig, backend: str) -> tuple[dict[str, Prediction], list[str]]:
    """The ledger's predictions for this run: state bytes per item, peak memory, comm per step.

    Comm predictions are left out for the naive forms (they move different collectives
    than the ledger's table, on purpose).
    """
    from parlab.ledger import models_compiled, predict
    from parlab.ledger.traffic import traffic
    from parlab.models import get_spec
    from parlab.parallel.deepspeed import REDUCE_BUCKET
    from parlab.topology import Topology

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
    eager = norm_kernel("cuda" if backend == "nccl" else "cpu")
    # parlab train's "selective" keeps every matmul and attention output: the ledger's
    # op-selective policy
    recompute = "op-selective" if cfg.recompute == "selective" else cfg.recompute
    # torch.compile: the compiled blocks where the ledger models them, else the eager ones
    compiled = cfg.compile and models_compiled(
        spec, dtype=dtype, strategy=strategy, recompute=recompute
    )
    kernel = "compiled" if compiled else eager
    led = predict(
        spec,
        strategy=strategy,
        topology=topo,
        optimizer=optimizer,
        recompute=recompute,
        shard_size=shard,
        bucket_view=True,
        # the training loop keeps the logits alive through backward
        logits_held=True,
        # torch DDP: the loop releases the first step's buckets (TorchDDP.release_first_buckets)
        ddp_old_buckets=False,
        # torch DDP and parlab's bucketed DDP keep their gradient buffers on one rank too
        ddp_one_rank=cfg.strategy in ("ddp", "ddp-bucket"),
        # torch DDP rebuilds its buckets once, before the second forward (a transient copy)
        ddp_rebuild=cfg.strategy == "ddp",
        reshard_after_forward=cfg.reshard_after_forward,
        norm_kernel=kernel,
        # DeepSpeed: its gradient bucket (reduce_bucket_size elements in the gradient dtype),
        # alive through backward (stages 1/2) or for good (stage 3)
        overhead_bytes=REDUCE_BUCKET * (2 if cfg.dtype == "bf16-params" else 4) if deepspeed else 0,
        **common,
    )
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
            else f"torch.compile: the ledger's eager blocks ({eager}; it models compiled blocks "
            "for dense SwiGLU models without autocast)"
        )
    if deepspeed:
        notes += DEEPSPEED_NOTES
    if cfg.strategy.endswith("-naive"):
        notes.append("naive form: no comm prediction (the ledger tables the real mechanism)")
        return preds, notes
    wire = traffic(
        spec,
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
    preds["comm_bytes_per_step"] = Prediction(
        value=sum(by_op.values()), unit="B", model=f"ledger.traffic:{strategy}"
    )
    for op, b in by_op.items():
        preds[f"comm_bytes_per_step.{op}"] = Prediction(
            value=b, unit="B", model=f"ledger.traffic:{strategy}"
        )
    return preds, notes


def _deepspeed_knobs(cfg: TrainConfig) -> dict[str, Any]:
    """DeepSpeed's version and the config the run passed to ``deepspeed.initialize``."""
    from parlab.parallel.deepspeed import deepspeed_version, ds_config

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


def _layout(cfg: TrainConfig, backend: str) -> dict[str, Any]:
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
            "norm_kernel": norm_kernel("cuda" if backend == "nccl" else "cpu"),
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
    from parlab.models import get_spec

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


def flops_per_token(cfg: TrainConfig) -> float:
    """Training FLOPs per token (``parlab.models.flops``: 6 N + 12 L H Q T)."""
    from parlab.models import get_spec
    from parlab.models.flops import training_flops_per_token

    return training_flops_per_token(get_spec(cfg.model), cfg.seq)


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
    from parlab.hardware.env import snapshot
    from parlab.runtime import meters

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
    metrics: dict[str, Metric] = {}
    if results:
        r0 = results[0]
        step_times = meters.slowest_rank_steps(results)
        step_time = meters.median(step_times)
        tps = r0["tokens_per_step"] / step_time if step_time > 0 else None
        fpt = flops_per_token(cfg)
        mfu = (
            meters.mfu(tps, fpt, r0["device"], "fp32" if cfg.dtype == "fp32" else "bf16")
            if tps
            else None
        )
        if mfu is None:
            notes.append(f"mfu unknown: device {r0['device']!r} has no peak in the catalog")
        metrics["tokens_per_s_per_gpu"] = Metric(value=tps, unit="tokens/s")
        metrics["step_time"] = Metric(value=step_time, unit="s", per_rank=None)
        metrics["peak_memory"] = _slowest(results, "peak_memory", "B")
        metrics["mfu"] = Metric(value=mfu, unit="fraction")
        if r0.get("alloc_retries") is not None:  # CUDA: the caching allocator's own counters
            metrics["peak_reserved"] = _slowest(results, "peak_reserved", "B")
            metrics["alloc_retries"] = _slowest(results, "alloc_retries", "count")
        if r0.get("alloc_retries"):
            notes.append(
                f"the caching allocator retried {int(max(_per_rank(results, 'alloc_retries')))} "
                "allocation(s) in the timed steps (freed its cache, synchronizing the device): "
                "the run is at its memory edge and its step time includes those stalls"
            )
        if r0.get("comm_metered", True):
            metrics["comm_time"] = _slowest(results, "comm_time", "s")
            metrics["comm_bytes_per_step"] = _slowest(results, "comm_bytes_per_step", "B")
            for op in sorted(r0["comm_by_op"]):
                per = [float(r["comm_by_op"].get(op, {}).get("bytes", 0)) for r in results]
                metrics[f"comm_bytes_per_step.{op}"] = Metric(
                    value=max(per), unit="B", per_rank=per
                )
                cnt = [float(r["comm_by_op"].get(op, {}).get("count", 0)) for r in results]
                metrics[f"comm_count_per_step.{op}"] = Metric(
                    value=max(cnt), unit="count", per_rank=cnt
                )
        else:
            metrics["comm_time"] = Metric(value=None, unit="s")
            metrics["comm_bytes_per_step"] = Metric(value=None, unit="B")
            notes.append("comm not metered: the run uses torch.compile")
        for item in r0["state_bytes"]:
            per = [float(r["state_bytes"][item]) for r in results]
            metrics[f"state_bytes.{item}"] = Metric(value=max(per), unit="B", per_rank=per)
        losses = r0["losses"]
        metrics["loss_first"] = Metric(value=losses[0], unit="nats")
        metrics["loss_last"] = Metric(value=losses[-1], unit="nats")
        notes.append(
            f"peak memory source: {r0['memory_source']}; comm_time: the metered step's "
            "collectives replayed alone, one after another (not the exposed time)"
        )
        if backend == "gloo":
            notes.append("gloo CPU ranks: proves the mechanism and its bytes, not GPU speed")
    status = "ok" if failure is None else "failed"
    return Document(
        run_id=new_run_id(f"train-{cfg.strategy}-{cfg.model}"),
        created=now_iso(),
        project=PROJECT,
        task="T2",
        role=cfg.role if failure is None else "failure",
        evidence_level="real-training" if backend == "nccl" else "cpu-mechanism",
        command=command,
        environment=environment or snapshot(probe_links=backend == "nccl"),
        workload={
            **_workload(cfg),
            **({"losses": results[0]["losses"]} if results else {}),
            # every measured step (its slowest rank): the spread behind the median step_time
            **({"step_times": step_times} if results else {}),
            # rank 0's timed steps by phase: the host's time to issue each, the device's
            **(
                {"phase_times": results[0]["phase_times"]}
                if results and "phase_times" in results[0]
                else {}
            ),
        },
        layout=_layout(cfg, backend),
        metrics=metrics,
        predictions=preds,
        status=status,
        failure=failure,
        notes=notes,
    )


def predict_step(
    cfg: TrainConfig, *, command: str, backend: str, environment: dict[str, Any], root: Path
) -> tuple[Prediction | None, str]:
    """The step time the lab predicts for ``cfg`` before it runs, from the documents under
    ``root`` (``parlab.plan.fit.calibrate.step_prediction``, as ``benchmarks/plan_accuracy.py``
    predicts a run), and a note; (None, why) where they do not describe the run."""
    from parlab.plan.fit.calibrate import step_prediction

    before = document(cfg, None, None, command=command, backend=backend, environment=environment)
    try:
        made = step_prediction(before, root)
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


def run_training(cfg: TrainConfig, *, command: str, predict_from: Path | None = None) -> Document:
    """Launch one run on ``cfg.nproc`` ranks and return its document (not yet written); with
    ``predict_from`` (a results folder), the step time predicted from it before the launch
    (``predict_step``) is recorded beside the ledger's predictions."""
    from parlab.runtime.launch import LaunchConfig, launch

    backend = backend_for(cfg.nproc)
    environment = None
    predicted = None
    if predict_from is not None:
        from parlab.hardware.env import snapshot

        environment = snapshot(probe_links=backend == "nccl")
        predicted = predict_step(
            cfg, command=command, backend=backend, environment=environment, root=predict_from
        )
    res = launch(
        "parlab.projects.training_state:train_rank",
        cfg.to_json(),
        LaunchConfig(
            nproc=cfg.nproc,
            backend=backend,
            timeout_s=cfg.timeout_s,
            numa_binding=cfg.numa_binding if backend == "nccl" else None,
        ),
    )
    return document(
        cfg,
        res.results if res.ok else None,
        None if res.ok else res.failure,
        command=command,
        backend=backend,
        environment=environment,
        step_prediction=predicted,
    )


# ---------------------------------------------------------------------------
# The comparison set and its report


# (strategy, knob overrides): torch's paths beside parlab's, and FSDP's reshard/recompute knobs.
_VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("fsdp", {"reshard_after_forward": False}),
    ("fsdp", {"recompute": "selective"}),
    ("fsdp", {"recompute": "full"}),
)
CPU_SET = (("ddp", {}), ("ddp-bucket", {}), ("zero1", {}), ("zero2", {}), ("zero3", {}),
           ("fsdp", {}), *_VARIANTS)  # fmt: skip
GPU_SET = (("ddp", {}), ("zero1", {}), ("zero2", {}), ("zero3", {}), ("fsdp", {}), *_VARIANTS)


def comparison_configs(
    *, model: str | None, nproc: int | None, steps: int | None, gpu: bool, seq: int | None
) -> list[TrainConfig]:
    """The comparison set: GPU size (1.3B, bf16, seq 4096) on GPUs, CPU size otherwise."""
    if gpu:
        base = {
            "model": model or "1.3b",
            "nproc": nproc or torch.cuda.device_count(),
            "steps": steps or 5,
            "warmup": 3,
            "micro_batch": 2,
            "seq": seq or 4096,
            "dtype": "bf16-compute",
        }
        names = GPU_SET
    else:
        base = {
            "model": model or "tiny",
            "nproc": nproc or 2,
            "steps": steps or 3,
            "warmup": 1,
            "micro_batch": 2,
            "seq": seq or 64,
            "dtype": "fp32",
        }
        names = CPU_SET
    return [TrainConfig(strategy=s, **{**base, **knobs}) for s, knobs in names]


def run_label(doc: Document) -> str:
    """``strategy[+knobs] preset``: what tells two runs of the set apart."""
    knobs = doc.layout.get("knobs", {})
    extra = ""
    if knobs.get("compile"):
        extra += "+compile"
    if knobs.get("recompute", "none") != "none":
        extra += f"+{knobs['recompute']}-recompute"
    if not knobs.get("reshard_after_forward", True) and "fsdp" in doc.layout["strategy"]:
        extra += "+no-reshard"
    if document_dtype(doc) == "bf16-params" and not doc.layout["strategy"].startswith("deepspeed"):
        extra += "+bf16-params"
    return f"{doc.layout['strategy']}{extra} {doc.workload.get('preset', '')}".strip()


def rel_err(measured: float | None, predicted: float | None) -> str:
    """``(measured - predicted) / predicted`` as a signed percentage, or empty."""
    if measured is None or not predicted:
        return ""
    return f"{(measured - predicted) / predicted:+.2%}"


def fmt_bytes(v: float | None) -> str:
    from parlab.units import format_bytes

    return "unknown" if v is None else format_bytes(v)


def render_report(docs: list[Document], out_dir: Path) -> dict[str, Path]:
    """Markdown + PNG plots from training-state documents alone; returns name -> path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    ok = [d for d in docs if d.status == "ok"]
    failed = [d for d in docs if d.status != "ok"]
    levels = sorted({d.evidence_level for d in docs})
    lines = [
        "# Training state: DDP, ZeRO-1/2/3, FSDP",
        "",
        f"Evidence level(s): {', '.join(levels)}. Each row is one contract document; "
        "predictions come from the ledger, measurements from the meters.",
        "",
        "| run | role | ranks | tokens/s/GPU | step time | MFU | peak memory (max rank) "
        "| ledger peak | peak error | comm bytes/step | ledger comm | comm time | document |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def pv(d: Document, name: str) -> float | None:
        p = d.predictions.get(name)
        return None if p is None else p.value

    for d in ok:
        m = d.metric
        tps, st, mfu, ct = m("tokens_per_s_per_gpu"), m("step_time"), m("mfu"), m("comm_time")
        lines.append(
            f"| {run_label(d)} | {d.role} | {d.layout['world_size']} | "
            f"{'unknown' if tps is None else f'{tps:,.0f}'} | "
            f"{'unknown' if st is None else f'{st * 1e3:.1f} ms'} | "
            f"{'unknown' if mfu is None else f'{mfu:.1%}'} | {fmt_bytes(m('peak_memory'))} | "
            f"{fmt_bytes(pv(d, 'peak_memory'))} | {rel_err(m('peak_memory'), pv(d, 'peak_memory'))} | "
            f"{fmt_bytes(m('comm_bytes_per_step'))} | "
            f"{fmt_bytes(pv(d, 'comm_bytes_per_step'))} | "
            f"{'unknown' if ct is None else f'{ct * 1e3:.2f} ms'} | "
            f"{d.run_id} |"
        )
    for d in failed:
        f = d.failure
        lines.append(
            f"| {run_label(d)} | failure | {d.layout['world_size']} | "
            f"failed ({f.kind if f else '?'}): {f.message if f else ''} | | | | "
            f"{fmt_bytes(pv(d, 'peak_memory'))} | | | | | {d.run_id} |"
        )
    lines += ["", "## Per-rank state bytes by item (rank 0 / max), measured vs ledger", ""]
    lines += ["| strategy | item | measured | predicted | error |", "|---|---|---|---|---|"]
    for d in ok:
        for item in STATE_ITEMS + MASTER_ITEMS:
            mv = d.metric(f"state_bytes.{item}")
            p = pv(d, f"state_bytes.{item}")
            if mv is None and p is None:  # the master items of a run that keeps none
                continue
            err = rel_err(mv, p)
            lines.append(f"| {run_label(d)} | {item} | {fmt_bytes(mv)} | {fmt_bytes(p)} | {err} |")
    paths: dict[str, Path] = {}
    if ok:
        names = [run_label(d) for d in ok]
        fig, ax = plt.subplots(figsize=(8, 4))
        bottom = [0.0] * len(ok)
        for item in STATE_ITEMS + MASTER_ITEMS:
            vals = [(d.metric(f"state_bytes.{item}") or 0) / 2**20 for d in ok]
            if not any(vals):
                continue
            ax.bar(names, vals, bottom=bottom, label=item)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        peaks = [(d.metric("peak_memory") or 0) / 2**20 for d in ok]
        ax.plot(names, peaks, "k_", markersize=30, label="peak (measured)")
        pp = [pv(d, "peak_memory") for d in ok]
        if any(p is not None for p in pp):
            ax.plot(names, [(p or math.nan) / 2**20 for p in pp], "rx", label="peak (ledger)")
        ax.set_ylabel("MiB per rank (max rank)")
        ax.tick_params(axis="x", rotation=30)
        ax.set_title("Per-rank memory by state item")
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths["memory"] = out_dir / "training-state-memory.png"
        fig.savefig(paths["memory"], dpi=110)
        plt.close(fig)

        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        a1.bar(names, [d.metric("tokens_per_s_per_gpu") or 0 for d in ok])
        a1.set_ylabel("tokens/s per GPU")
        a1.set_title("Throughput")
        a2.bar(names, [(d.metric("comm_time") or 0) * 1e3 for d in ok])
        a2.set_ylabel("ms per step (replayed alone)")
        a2.set_title("Communication time")
        for a in (a1, a2):
            a.tick_params(axis="x", rotation=30)
        fig.tight_layout()
        paths["throughput"] = out_dir / "training-state-throughput.png"
        fig.savefig(paths["throughput"], dpi=110)
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(5, 5))
        for d in ok:
            for name, mark in (("peak_memory", "o"), ("comm_bytes_per_step", "s")):
                p, mv = pv(d, name), d.metric(name)
                if p and mv:
                    ax.scatter(p / 2**20, mv / 2**20, marker=mark)
                    ax.annotate(f"{run_label(d)}:{name[:4]}", (p / 2**20, mv / 2**20), fontsize=7)
        lim = ax.get_xlim()
        ax.plot(lim, lim, "k--", lw=0.8)
        ax.set_xlabel("predicted (MiB)")
        ax.set_ylabel("measured (MiB)")
        ax.set_title("Predicted vs measured (o peak, s comm/step)")
        fig.tight_layout()
        paths["predicted"] = out_dir / "training-state-predicted-vs-measured.png"
        fig.savefig(paths["predicted"], dpi=110)
        plt.close(fig)
        lines += [""] + [f"![{k}]({p.name})" for k, p in paths.items()]
    lines += [
        "",
        "## How to read it",
        "",
        "- State bytes: counted on every rank from the real tensors (each storage once) after "
        "the last step's update; the table shows the largest rank.",
        "- Peak memory: the CUDA allocator's high-water mark on GPUs; tracked tensor bytes on "
        "CPU (gloo runs), where the ledger's peak is a rough guide only.",
        "- Comm bytes/step: every collective the metered step issued (payload as nccl-tests "
        "counts it); comm time: those collectives replayed alone, one after another -- the "
        "cost if nothing overlapped, not the exposed time.",
        "- Selective recompute here keeps matmul and attention outputs and recomputes the rest "
        "(torchtitan's op-level policy).",
    ]
    seen: set[str] = set()
    for d in docs:
        for n in d.notes:
            if n.startswith(("no ", "comm not metered", "mfu unknown")) and n not in seen:
                seen.add(n)
                lines.append(f"- {run_label(d)}: {n}")
    paths["report"] = out_dir / "training-state.md"
    paths["report"].write_text("\n".join(lines) + "\n")
    return paths


def train_many(ctx: RankContext, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rank function: several runs one after another in one launch (CPU sets: saves start-ups)."""
    out = []
    for cfg in runs:
        out.append(train_rank(ctx, **cfg))
        dist.barrier()
    return out


def train_command(cfg: TrainConfig) -> str:
    """The ``parlab train`` line that reproduces one run of a set."""
    import shlex

    args = ["parlab", "train", "--strategy", cfg.strategy, "--model", cfg.model]
    defaults = TrainConfig(strategy=cfg.strategy, model=cfg.model)
    flags = {
        "nproc": "--nproc", "steps": "--steps", "warmup": "--warmup",
        "micro_batch": "--micro-batch", "global_batch": "--global-batch", "seq": "--seq",
        "dtype": "--dtype", "recompute": "--recompute", "optimizer": "--optimizer", "lr": "--lr",
        "seed": "--seed", "hybrid_shard": "--hybrid-shard", "data": "--data",
        "memory_cap": "--memory-cap", "timeout_s": "--timeout",
    }  # fmt: skip
    for field, flag in flags.items():
        value = getattr(cfg, field)
        if value != getattr(defaults, field) and value is not None:
            args += [flag, str(value)]
    if cfg.compile:
        args.append("--compile")
    if not cfg.reshard_after_forward:
        args.append("--no-reshard")
    return shlex.join(args)


def run_set(configs: list[TrainConfig], *, grouped: bool) -> list[Document]:
    """Run every config; ``grouped`` runs them in one launch (falling back to one each on failure)."""
    from parlab.runtime.launch import LaunchConfig, launch

    if grouped and len({c.nproc for c in configs}) == 1 and len(configs) > 1:
        backend = backend_for(configs[0].nproc)
        res = launch(
            "parlab.projects.training_state:train_many",
            {"runs": [c.to_json() for c in configs]},
            LaunchConfig(
                nproc=configs[0].nproc,
                backend=backend,
                timeout_s=max(c.timeout_s for c in configs),
            ),
        )
        if res.ok:
            from parlab.hardware.env import snapshot

            env = snapshot(probe_links=backend == "nccl")
            return [
                document(
                    c,
                    [per_rank[i] for per_rank in res.results],
                    None,
                    command=train_command(c),
                    backend=backend,
                    environment=env,
                )
                for i, c in enumerate(configs)
            ]
    return [run_training(c, command=train_command(c)) for c in configs]


def run_project(
    results: Path,
    *,
    model: str | None = None,
    nproc: int | None = None,
    steps: int | None = None,
    seq: int | None = None,
    only: list[str] | tuple[str, ...] | None = None,
    report_only: bool = False,
    console: Any = None,
) -> dict[str, Path]:
    """``parlab project training-state``: run the comparison set, write documents, render the report."""
    from parlab.contract import read_results, write_result

    out_dir = results / PROJECT
    if report_only:
        entries, _ = read_results(results)
        latest: dict[str, Document] = {}
        for e in entries:  # the latest document of each distinct run (label)
            if e.doc.project == PROJECT and e.doc.task == "T2":
                latest[run_label(e.doc)] = e.doc
        if not latest:
            raise UsageError(f"no {PROJECT} documents under {results}: run the set first")
        return render_report(list(latest.values()), out_dir)
    gpu = torch.cuda.is_available() and torch.cuda.device_count() >= (nproc or 1)
    configs = comparison_configs(model=model, nproc=nproc, steps=steps, gpu=gpu, seq=seq)
    if only:
        unknown = [s for s in only if s not in STRATEGIES]
        if unknown:
            raise UsageError(f"unknown strategy {unknown[0]!r}: use one of {', '.join(STRATEGIES)}")
        base = configs[0]
        configs = [dataclasses.replace(base, strategy=s) for s in only]
    docs = run_set(configs, grouped=not gpu)
    for d in docs:
        path = write_result(d, results)
        if console is not None:
            status = "ok" if d.failure is None else f"failed ({d.failure.kind})"
            console.print(f"{d.layout['strategy']}: {status} -> {path}")
    return render_report(docs, out_dir)


def demo_step(results: Path, console: Any) -> None:
    """``parlab demo``: the CPU-sized comparison set (DDP, ZeRO-1/2/3, FSDP on 2 gloo ranks)."""
    paths = run_project(
        results,
        model="tiny",
        nproc=2,
        steps=2,
        seq=32,
        only=("ddp", "zero1", "zero2", "zero3", "fsdp"),
        console=console,
    )
    console.print(f"report: {paths['report']}")
