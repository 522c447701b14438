"""CP (ring and all-gather attention, causal load balancing) against unsharded attention and model."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.fx.experimental.symbolic_shapes
import torch.nn.functional as F

from parlab.models import get_spec
from parlab.models.reference import build_model
from parlab.parallel import tensor_comm
from parlab.parallel.context import (
    allgather_attention,
    apply_context_parallel,
    chunk_ids,
    local_positions,
    ring_attention,
    shard_sequence,
    unshard_sequence,
)
from parlab.runtime.testing import run_ranks

pytestmark = pytest.mark.timeout(60)


def test_load_balanced_chunks() -> None:
    assert [chunk_ids(4, i) for i in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert local_positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    x = torch.arange(24).view(1, 24)
    parts = [shard_sequence(x, 3, r) for r in range(3)]
    assert torch.equal(unshard_sequence(parts), x)


def _attn_rank(ctx, variant: str, causal: bool):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 16, 8, generator=g, requires_grad=True)
    k = torch.randn(2, 2, 16, 8, generator=g, requires_grad=True)
    v = torch.randn(2, 2, 16, 8, generator=g, requires_grad=True)
    do = torch.randn(2, 4, 16, 8, generator=g)
    ref = F.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=causal
    )
    ref.backward(do)
    cp, r = ctx.world_size, ctx.rank
    ql, kl, vl = (shard_sequence(t.detach(), cp, r, dim=2).requires_grad_() for t in (q, k, v))
    fn = ring_attention if variant == "ring" else allgather_attention
    with tensor_comm.comm_log() as log:
        out = fn(ql, kl, vl, dist.group.WORLD, causal=causal)
        out.backward(shard_sequence(do, cp, r, dim=2))
    errs = [
        (out - shard_sequence(ref, cp, r, dim=2)).abs().max().item(),
        (ql.grad - shard_sequence(q.grad, cp, r, dim=2)).abs().max().item(),
        (kl.grad - shard_sequence(k.grad, cp, r, dim=2)).abs().max().item(),
        (vl.grad - shard_sequence(v.grad, cp, r, dim=2)).abs().max().item(),
    ]
    return max(errs), sorted({e["op"] for e in log})


@pytest.mark.parametrize(
    ("world", "variant", "causal"),
    [(2, "ring", True), (4, "ring", True), (2, "ring", False), (2, "allgather", True),
     (4, "allgather", True)],
)  # fmt: skip
def test_cp_attention_matches_sdpa(world: int, variant: str, causal: bool) -> None:
    for err, ops in run_ranks(_attn_rank, world, variant, causal):
        assert err < 1e-5
        assert ops == (["send_recv"] if variant == "ring" else ["all_gather", "reduce_scatter"])


def _model_rank(ctx, variant: str):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (2, 33), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    model = build_model(get_spec("tiny"), seed=1)
    mine = copy.deepcopy(model)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.reshape(-1))
    loss.backward()
    cp, r = ctx.world_size, ctx.rank
    group = dist.group.WORLD
    apply_context_parallel(mine, group, variant=variant)
    logits = mine(shard_sequence(x, cp, r), positions_S=local_positions(32, cp, r))
    local = F.cross_entropy(logits.flatten(0, 1), shard_sequence(y, cp, r).reshape(-1))
    local.backward()
    total = local.detach().clone()
    dist.all_reduce(total)
    worst = 0.0
    ref = dict(model.named_parameters())
    for name, p in mine.named_parameters():
        dist.all_reduce(p.grad)
        worst = max(worst, (p.grad / cp - ref[name].grad).abs().max().item())
    return abs(total.item() / cp - loss.item()), worst


@pytest.mark.parametrize("variant", ["ring", "allgather"])
def test_cp2_model_matches_reference(variant: str) -> None:
    for d_loss, d_grad in run_ranks(_model_rank, 2, variant):
        assert d_loss < 1e-5 and d_grad < 1e-5
