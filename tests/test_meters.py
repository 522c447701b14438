"""The shared meters (state bytes, CPU memory tracking and cap, comm meter) and the token data."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.distributed as dist

from parlab.data import SyntheticTokens, rank_batch
from parlab.hardware.catalog import peak_flops
from parlab.models import flops
from parlab.parallel.data_comm import FlatUnit, all_gather_, all_reduce_, reduce_scatter_
from parlab.runtime import meters
from parlab.runtime.comm_meter import CommMeter
from parlab.runtime.context import RankContext
from parlab.runtime.testing import run_ranks

pytestmark = pytest.mark.timeout(60)


def test_count_bytes_counts_each_storage_once() -> None:
    flat = torch.zeros(100)
    views = [flat[:10], flat[10:60], flat]
    other = torch.zeros(7, dtype=torch.float64)
    assert meters.count_bytes([*views, other, None]) == 400 + 56
    items = meters.state_bytes({"params": [flat], "grads": [flat[:5], other]})
    assert items == {"params": 400, "grads": 56}


def test_optimizer_tensors_skip_step_scalars() -> None:
    p = torch.nn.Parameter(torch.randn(10))
    opt = torch.optim.AdamW([p])
    p.grad = torch.ones(10)
    opt.step()
    assert meters.count_bytes(meters.optimizer_tensors(opt)) == 2 * 10 * 4


def test_cpu_memory_meter_tracks_live_and_peak() -> None:
    mem = meters.MemoryMeter(torch.device("cpu"))
    with mem:
        a = torch.empty(1000)  # 4000 B
        b = torch.empty(500)  # 2000 B
        assert mem.live_bytes() == 6000
        del a
        assert mem.live_bytes() == 2000
        c = b.view(50, 10)  # a view: no new storage
        assert mem.live_bytes() == 2000
        del b, c
    assert mem.peak_bytes() == 6000
    assert mem.source == "tracked-tensor-bytes"


def test_cpu_memory_cap_raises_out_of_memory() -> None:
    mem = meters.MemoryMeter(torch.device("cpu"), cap_bytes=10_000)
    keep = []
    with pytest.raises(torch.OutOfMemoryError, match="memory cap"), mem:
        for _ in range(10):
            keep.append(torch.empty(1000))


def _comm_rank(ctx: RankContext) -> dict:
    comm = CommMeter()
    n = ctx.world_size
    with comm:
        x = torch.ones(10)
        all_reduce_(x)
        full = torch.empty(8 * n)
        all_gather_(full, torch.full((8,), float(ctx.rank)))
        out = torch.empty(4)
        reduce_scatter_(out, torch.ones(4 * n))
        w = all_reduce_(torch.ones(3, dtype=torch.float64), async_op=True)
        w.wait()
    # the meter saw the payloads; the results are right
    ok = (
        bool((x == n).all())
        and full.tolist() == [float(r) for r in range(n) for _ in range(8)]
        and bool((out == n).all())
    )
    return {
        "by_op": comm.by_op(0),
        "records": [(r.op, r.payload_bytes, r.dtype, r.group_size) for r in comm.records],
        "ok": ok,
        "replay": comm.replay(0, ctx.device, iters=1),
    }


def test_comm_meter_records_payloads_and_replays() -> None:
    for r in run_ranks(_comm_rank, 2):
        assert r["ok"]
        assert r["by_op"] == {
            "all_reduce": {"count": 2, "bytes": 40 + 24},
            "all_gather": {"count": 1, "bytes": 64},
            "reduce_scatter": {"count": 1, "bytes": 32},
        }
        assert ("all_gather", 64, "float32", 2) in r["records"]
        assert r["replay"] > 0


def _flat_rank(ctx: RankContext) -> list[float]:
    params = [torch.nn.Parameter(torch.arange(5.0)), torch.nn.Parameter(torch.arange(4.0))]
    u = FlatUnit("u", params, ctx.world_size, ctx.rank)
    full = u.flatten([p.detach() for p in params])
    u.bind(full)
    shard = full[u.shard_slice()].clone() * 0 + ctx.rank  # each rank rewrites its chunk
    all_gather_(full, shard)
    assert dist.get_world_size() == ctx.world_size
    return [u.padded, u.shard_numel, *params[0].tolist(), *params[1].tolist()]


def test_flat_unit_pads_and_binds_views() -> None:
    r = run_ranks(_flat_rank, 2)[0]
    assert r[:2] == [10, 5]  # 9 elements padded to 10, 5 per rank
    assert r[2:] == [0, 0, 0, 0, 0, 1, 1, 1, 1]  # params see the gathered buffer


def test_synthetic_tokens_are_deterministic_and_ranks_partition_the_batch() -> None:
    d = SyntheticTokens(vocab_size=50, seq=8, seed=3)
    a, b = d.global_batch(2, 4), d.global_batch(2, 4)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)
    assert torch.equal(a.inputs[:, 1:], a.labels[:, :-1])
    assert not torch.equal(a.inputs, d.global_batch(3, 4).inputs)
    parts = [rank_batch(a, r, 2).inputs for r in range(2)]
    assert torch.equal(torch.cat(parts), a.inputs)


def test_mfu_is_unknown_on_unknown_devices() -> None:
    """How the projects count MFU: ``flops.mfu`` against the catalog's peak of the device."""
    assert flops.mfu(1000.0, 1e9, 1, peak_flops("cpu", "bf16")) is None
    v = flops.mfu(1000.0, 1e9, 1, peak_flops("NVIDIA H100 80GB HBM3", "bf16"))
    assert v is not None and 0 < v < 1
