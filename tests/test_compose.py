"""Composed layouts on one mesh (DP2xTP2, FSDP2xTP2, PP2xTP2, CP2xTP2, TP2 + checkpointing)."""

from __future__ import annotations

import copy

import pytest
import torch

# imported here once, so the forked ranks do not each import them (~2 s each)
import torch._dynamo
import torch.distributed.device_mesh
import torch.distributed.fsdp
import torch.distributed.tensor
import torch.distributed.tensor.parallel
import torch.fx.experimental.symbolic_shapes
import torch.nn.functional as F

from parlab.models import get_spec
from parlab.models.reference import build_model
from parlab.parallel.compose import ParallelPlan, parallelize
from parlab.parallel.context import local_positions, shard_sequence
from parlab.parallel.pipeline import build_stage, run_schedule
from parlab.parallel.pipeline_schedules import build
from parlab.parallel.tensor import shard_reference_grad, tp_cross_entropy
from parlab.runtime.testing import run_ranks
from parlab.topology import Topology

pytestmark = pytest.mark.timeout(60)

S, PER_DP = 16, 2


def _rank(ctx, degrees: dict[str, int], plan_kw: dict):
    topo = Topology(world_size=ctx.world_size, **degrees)
    c = topo.coords(ctx.rank)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (PER_DP * topo.dp, S + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    ref = build_model(get_spec("tiny"), seed=1)
    model = copy.deepcopy(ref)
    F.cross_entropy(ref(x).flatten(0, 1), y.reshape(-1)).backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}

    mesh = topo.build_mesh("cpu")
    plan = ParallelPlan(**plan_kw)
    tp_group = mesh["tp"].get_group()
    xs, ys = x.chunk(topo.dp)[c["dp"]], y.chunk(topo.dp)[c["dp"]]
    if topo.cp > 1:
        xs, ys = shard_sequence(xs, topo.cp, c["cp"]), shard_sequence(ys, topo.cp, c["cp"])

    def loss_fn(logits, target):
        return tp_cross_entropy(logits, target, tp_group, loss_parallel=plan.loss_parallel)

    per_stage = len(ref.layers) // topo.pp
    if topo.pp > 1:
        model = build_stage(model, c["pp"], topo.pp)
    model = parallelize(model, mesh, plan)
    if topo.pp > 1:
        run_schedule(
            build("1f1b", topo.pp, 2),
            {c["pp"]: model},
            microbatches=list(xs.chunk(2)),
            targets=list(ys.chunk(2)),
            loss_fn=loss_fn,
            act_shape=(xs.shape[0] // 2, S, 64),
            act_dtype=torch.float32,
            group=mesh["pp"].get_group(),
            device=ctx.device,
        )
    else:
        pos = local_positions(S, topo.cp, c["cp"]) if topo.cp > 1 else None
        loss_fn(model(xs, positions_S=pos) if pos is not None else model(xs), ys).backward()

    worst = 0.0
    count = 0
    for name, p in model.named_parameters():
        name = name.removeprefix("module.").replace("norm.norm.", "norm.")
        if name.startswith("layers."):
            _, i, rest = name.split(".", 2)
            name = f"layers.{int(i) + c['pp'] * per_stage}.{rest}"
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        want = shard_reference_grad(name, ref_grads[name], c["tp"], topo.tp)
        worst = max(worst, (grad - want).abs().max().item())
        count += 1
    return worst, count


LAYOUTS = {
    "dp2xtp2-ddp": (4, {"dp": 2, "tp": 2}, {"data_parallel": "ddp"}),
    "fsdp2xtp2-sp": (4, {"dp": 2, "tp": 2}, {"data_parallel": "fsdp", "sequence_parallel": True}),
    "pp2xtp2-sp": (4, {"pp": 2, "tp": 2}, {"sequence_parallel": True, "loss_parallel": True}),
    "cp2xtp2-fsdp": (4, {"cp": 2, "tp": 2}, {"data_parallel": "fsdp", "cp_variant": "ring"}),
    "tp2-checkpointed": (2, {"tp": 2}, {"recompute": "full"}),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_composed_layout_matches_reference(name: str) -> None:
    world, degrees, plan = LAYOUTS[name]
    for worst, count in run_ranks(_rank, world, degrees, plan):
        assert count > 0 and worst < 1e-5, (name, worst)
