"""PP executor (GPipe, 1F1B, interleaved 1F1B) and torch.distributed.pipelining vs the reference."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.distributed.pipelining
import torch.fx.experimental.symbolic_shapes
import torch.nn.functional as F

from parlab.models import get_spec
from parlab.models.reference import build_model
from parlab.parallel.pipeline import build_stage, run_schedule
from parlab.parallel.pipeline_schedules import build
from parlab.runtime.testing import run_ranks

pytestmark = pytest.mark.timeout(60)

M, MB, S = 4, 1, 16


def _loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.reshape(-1))


def _setup():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (M * MB, S + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    model = build_model(get_spec("tiny"), seed=1)
    keep = copy.deepcopy(model)
    loss = _loss(model(x), y)
    loss.backward()
    ref = {n: p.grad for n, p in model.named_parameters()}
    return keep, x, y, loss.item(), ref


def _grad_error(stage_mod, stage: int, n_stages: int, ref: dict, layers: int) -> float:
    per = layers // n_stages
    worst = 0.0
    for name, p in stage_mod.named_parameters():
        if name.startswith("layers."):
            i = int(name.split(".")[1])
            name = f"layers.{stage * per + i}." + name.split(".", 2)[2]
        worst = max(worst, (p.grad - ref[name]).abs().max().item())
    return worst


def _pp_rank(ctx, schedule: str, v: int):
    model, x, y, ref_loss, ref = _setup()
    p = ctx.world_size
    n = p * v
    stages = {s: build_stage(model, s, n) for s in range(ctx.rank, n, p)}
    stats = run_schedule(
        build(schedule, p, M, v),
        stages,
        microbatches=list(x.chunk(M)),
        targets=list(y.chunk(M)),
        loss_fn=_loss,
        act_shape=(MB, S, 64),
        act_dtype=torch.float32,
        group=dist.group.WORLD,
        device=ctx.device,
    )
    err = max(_grad_error(mod, s, n, ref, 4) for s, mod in stages.items())
    loss_err = abs(stats.loss - ref_loss) if stats.loss is not None else 0.0
    return loss_err, err, stats.sent_bytes, 0.0 <= stats.bubble < 1.0


@pytest.mark.parametrize(
    ("world", "schedule", "v"),
    [
        (2, "gpipe", 1),
        (2, "1f1b", 1),
        (2, "interleaved-1f1b", 2),
        (4, "1f1b", 1),
        (1, "interleaved-1f1b", 2),
    ],
)
def test_pp_matches_reference(world: int, schedule: str, v: int) -> None:
    out = run_ranks(_pp_rank, world, schedule, v)
    for loss_err, grad_err, _sent, bubble_ok in out:
        assert loss_err < 1e-5 and grad_err < 1e-5 and bubble_ok
    if world > 1:
        # every boundary: one activation forward and one gradient backward per micro-batch
        assert sum(o[2] for o in out) == 2 * (world * v - 1) * M * MB * S * 64 * 4


def _torch_rank(ctx, schedule: str):
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    model, x, y, ref_loss, ref = _setup()
    p = ctx.world_size
    v = 2 if schedule == "interleaved-1f1b" else 1
    n = p * v
    mods = {s: build_stage(model, s, n) for s in range(ctx.rank, n, p)}
    stages = [PipelineStage(m, s, n, ctx.device) for s, m in mods.items()]
    if schedule == "interleaved-1f1b":
        sched = ScheduleInterleaved1F1B(stages, n_microbatches=M, loss_fn=_loss)
    else:
        cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
        sched = cls(stages[0], n_microbatches=M, loss_fn=_loss)
    losses: list[torch.Tensor] = []
    kwargs = {}
    if n - 1 in mods:
        kwargs = {"target": y, "losses": losses}
    if 0 in mods:
        sched.step(x, **kwargs)
    else:
        sched.step(**kwargs)
    err = max(_grad_error(m, s, n, ref, 4) for s, m in mods.items())
    loss = sum(t.item() for t in losses) / M if losses else None
    return (abs(loss - ref_loss) if loss is not None else 0.0), err


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved-1f1b"])
def test_torch_pipelining_agrees(schedule: str) -> None:
    for loss_err, grad_err in run_ranks(_torch_rank, 2, schedule):
        assert loss_err < 1e-5 and grad_err < 1e-5
