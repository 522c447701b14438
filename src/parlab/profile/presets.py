"""Cause-and-effect presets: the same model trained under a few settings, each profiled.

Every preset runs on every rank (through ``parlab.runtime.launch``), builds
the reference model (``parlab.models``), and for each configuration trains
``wait + warmup + active`` steps under ``Profiler``, writing one trace
folder per configuration. The settings change what crosses the wire and when:

- ``ddp``: torch DDP, one gradient all-reduce per bucket (payload: the bucket,
  ``bucket_cap_mb``), launched during backward as each bucket fills, so
  bigger buckets mean fewer, larger all-reduces that start later;
- ``fsdp``: FSDP2 ``fully_shard`` per block: an all-gather of each block's
  parameters before its forward and backward, a reduce-scatter of its
  gradients after backward. ``prefetch`` issues the next block's all-gather
  explicitly one block ahead (forward and backward); ``reshard_after_forward``
  False keeps the gathered parameters from forward to backward (no second
  all-gather, more memory);
- ``tp``: parlab's tensor parallelism over all ranks: two all-reduces per
  block forward and two backward (payload ``B*S*H``); with sequence
  parallelism each becomes an all-gather plus a reduce-scatter of the same
  bytes, with norms and residuals on ``S/t`` tokens.

GPU runs use bf16 (autocast for DDP and TP, bf16 parameters with fp32
gradient reduction for FSDP); CPU runs use fp32. Each rank returns the trace
folders it wrote (rank 0's list is the one used).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from parlab.models import get_spec
from parlab.models.reference import build_model
from parlab.profile.capture import Profiler
from parlab.runtime.context import RankContext
from parlab.runtime.loop import LoopPlan, TrainStep, next_token_loss, run_steps


@dataclass(frozen=True, kw_only=True)
class TrainShape:
    """What one preset trains."""

    model: str
    """Model spec name (``tiny``, ``small``, ``1.3b``)."""
    batch: int
    """Micro-batch per rank."""
    seq: int
    """Sequence length."""
    lr: float = 1e-4
    """AdamW learning rate."""


def _batch(ctx: RankContext, vocab: int, shape: TrainShape, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + ctx.rank)
    tokens = torch.randint(0, vocab, (shape.batch, shape.seq + 1), generator=g)
    return tokens.to(ctx.device)


def _autocast(ctx: RankContext) -> Any:
    if ctx.is_cuda:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


class _PresetStep(TrainStep):
    """One profiled step: the preset's model on this rank's seeded tokens, AdamW, then the
    profiler's step."""

    def __init__(
        self,
        ctx: RankContext,
        model: torch.nn.Module,
        shape: TrainShape,
        prof: Profiler,
        *,
        vocab: int,
        loss_fn: Any,
        autocast: bool,
    ) -> None:
        self.ctx, self.model, self.shape, self.prof, self.vocab = ctx, model, shape, prof, vocab
        self.loss_fn = loss_fn or next_token_loss
        self.autocast = _autocast(ctx) if autocast else contextlib.nullcontext()
        self.opt = torch.optim.AdamW(model.parameters(), lr=shape.lr, foreach=ctx.is_cuda)

    def data(self, i: int) -> torch.Tensor:
        return _batch(self.ctx, self.vocab, self.shape, i)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        with self.autocast:
            logits = self.model(tokens[:, :-1])
        return self.loss_fn(logits, tokens[:, 1:])

    def optimizer(self) -> None:
        self.opt.step()

    def zero_grad(self) -> None:
        self.opt.zero_grad(set_to_none=True)

    def after(self, i: int) -> None:
        self.prof.step()


def _train(
    ctx: RankContext,
    model: torch.nn.Module,
    shape: TrainShape,
    prof: Profiler,
    *,
    vocab: int,
    loss_fn: Any = None,
    autocast: bool = True,
) -> None:
    """``prof.total_steps`` steps on the shared step loop, under the profiler."""
    step = _PresetStep(ctx, model, shape, prof, vocab=vocab, loss_fn=loss_fn, autocast=autocast)
    with prof:
        run_steps(step, LoopPlan(warmup=prof.total_steps), ctx.device)
    ctx.sync()


def _build(ctx: RankContext, model: str, dtype: torch.dtype) -> torch.nn.Module:
    return build_model(get_spec(model), device=ctx.device, dtype=dtype, seed=0)


def _profiler(
    ctx: RankContext, out: Path, label: str, sched: list[int], run_id: str, project: str
) -> Profiler:
    wait, warmup, active = sched
    return Profiler(
        ctx,
        out / label,
        wait=wait,
        warmup=warmup,
        active=active,
        run_id=f"{run_id}-{label}",
        project=project,
        label=label,
    )


def ddp_rank(
    ctx: RankContext,
    *,
    model: str,
    batch: int,
    seq: int,
    buckets_mb: list[float],
    out_dir: str,
    schedule: list[int],
    run_id: str,
) -> list[dict[str, Any]]:
    """Torch DDP on the reference model, once per bucket size; returns the trace folders."""
    shape = TrainShape(model=model, batch=batch, seq=seq)
    out: list[dict[str, Any]] = []
    for mb in buckets_mb:
        label = f"ddp-bucket{mb:g}mb"
        net = _build(ctx, model, torch.float32)  # fresh per setting: no stale DDP hooks
        vocab = net.spec.vocab_size
        ddp = DDP(
            net,
            device_ids=[ctx.local_rank] if ctx.is_cuda else None,
            bucket_cap_mb=mb,
            gradient_as_bucket_view=True,
        )
        prof = _profiler(ctx, Path(out_dir), label, schedule, run_id, "PAR-TRAINING-STATE")
        _train(ctx, ddp, shape, prof, vocab=vocab)
        out.append(
            {"label": label, "dir": str(Path(out_dir) / label), "knobs": {"bucket_cap_mb": mb}}
        )
        del ddp, net
        if ctx.is_cuda:
            torch.cuda.empty_cache()
    return out


def fsdp_rank(
    ctx: RankContext,
    *,
    model: str,
    batch: int,
    seq: int,
    configs: list[dict[str, bool]],
    out_dir: str,
    schedule: list[int],
    run_id: str,
) -> list[dict[str, Any]]:
    """FSDP2 per block under each ``{prefetch, reshard_after_forward}``; returns the trace folders."""
    from torch.distributed.fsdp import (  # lazy: torch.distributed.fsdp
        MixedPrecisionPolicy,
        fully_shard,
    )

    shape = TrainShape(model=model, batch=batch, seq=seq)
    out: list[dict[str, Any]] = []
    for cfg in configs:
        prefetch = bool(cfg["prefetch"])
        reshard = bool(cfg["reshard_after_forward"])
        label = (
            f"fsdp-{'prefetch' if prefetch else 'noprefetch'}-{'reshard' if reshard else 'keep'}"
        )
        net = _build(ctx, model, torch.float32)
        vocab = net.spec.vocab_size
        mp = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if ctx.is_cuda
            else MixedPrecisionPolicy()
        )
        blocks = list(net.layers)
        for block in blocks:
            fully_shard(block, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(net, mp_policy=mp, reshard_after_forward=reshard)
        if prefetch:
            for i, block in enumerate(blocks):
                if i + 1 < len(blocks):
                    block.set_modules_to_forward_prefetch([blocks[i + 1]])
                if i > 0:
                    block.set_modules_to_backward_prefetch([blocks[i - 1]])
        prof = _profiler(ctx, Path(out_dir), label, schedule, run_id, "PAR-TRAINING-STATE")
        _train(ctx, net, shape, prof, vocab=vocab, autocast=False)
        out.append(
            {
                "label": label,
                "dir": str(Path(out_dir) / label),
                "knobs": {"prefetch": prefetch, "reshard_after_forward": reshard},
            }
        )
        del net
        if ctx.is_cuda:
            torch.cuda.empty_cache()
    return out


def tp_rank(
    ctx: RankContext,
    *,
    model: str,
    batch: int,
    seq: int,
    sequence_parallel: list[bool],
    out_dir: str,
    schedule: list[int],
    run_id: str,
) -> list[dict[str, Any]]:
    """parlab's TP over all ranks, without and with sequence parallelism; returns the trace folders."""
    from parlab.parallel.tensor import (  # lazy: torch.distributed.tensor
        apply_tensor_parallel,
        tp_cross_entropy,
    )

    shape = TrainShape(model=model, batch=batch, seq=seq)
    group = dist.group.WORLD
    out: list[dict[str, Any]] = []
    for sp in sequence_parallel:
        label = f"tp{ctx.world_size}-{'sp' if sp else 'nosp'}"
        net = _build(ctx, model, torch.float32)
        vocab = net.spec.vocab_size
        apply_tensor_parallel(net, group, sequence_parallel=sp)
        prof = _profiler(ctx, Path(out_dir), label, schedule, run_id, "PAR-MODEL-INTERNAL")

        def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return tp_cross_entropy(logits, target, group, loss_parallel=False)

        _train(ctx, net, shape, prof, vocab=vocab, loss_fn=loss_fn)
        out.append(
            {"label": label, "dir": str(Path(out_dir) / label), "knobs": {"sequence_parallel": sp}}
        )
        del net
    return out


PRESETS = {
    "ddp": "parlab.profile.presets:ddp_rank",
    "ddp-buckets": "parlab.profile.presets:ddp_rank",
    "fsdp": "parlab.profile.presets:fsdp_rank",
    "tp": "parlab.profile.presets:tp_rank",
}
"""Preset name -> rank entry point."""
