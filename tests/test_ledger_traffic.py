"""The wire table: the textbook volumes per strategy and per parallel axis."""

from __future__ import annotations

import math

import pytest

from parlab.ledger.traffic import summarize, sync_points, traffic
from parlab.models import get_spec
from parlab.topology import Topology

SPEC = get_spec("1.3b")
PSI = SPEC.num_params()


def _total(items: list, collective: str, axis: str = "dp", phase: str | None = None) -> int:
    return sum(
        i.total_bytes
        for i in items
        if i.collective == collective and i.axis == axis and (phase is None or i.phase == phase)
    )


def test_ddp_all_reduces_every_gradient_once_in_buckets() -> None:
    items = traffic(SPEC, Topology(world_size=8, dp=8), "ddp", dtype="bf16", microbatches=4)
    assert _total(items, "all-reduce") == 2 * PSI  # bf16 gradients: 2 Psi
    # torch's buckets close once they hold 25 MiB and never split a gradient: each at least
    # 25 MiB (but the last), none more than 25 MiB plus one gradient
    from parlab.ledger.sharding import gradient_buckets, holding

    h = holding(SPEC, tp=1, pp=1, ep=1, stage=0)
    grads = [math.prod(sh) * 2 for _, ps in reversed(h.units) for _, sh in reversed(ps)]
    expect = gradient_buckets(grads, 25 * 1024**2)
    assert sum(i.count_per_step for i in items) == len(expect)
    assert max(i.payload_bytes for i in items) <= 25 * 1024**2 + max(grads)
    assert not any(i.blocking for i in items)  # overlaps backward


@pytest.mark.parametrize("strategy", ["zero1", "zero2"])
def test_zero12_reduce_scatter_and_all_gather(strategy: str) -> None:
    m = 3
    items = traffic(SPEC, Topology(world_size=8, dp=8), strategy, dtype="bf16", microbatches=m)
    per = m if strategy == "zero2" else 1
    assert _total(items, "reduce-scatter") == pytest.approx(2 * PSI * per, rel=1e-5)
    assert _total(items, "all-gather") == pytest.approx(2 * PSI, rel=1e-5)


@pytest.mark.parametrize("strategy", ["zero3", "fsdp"])
def test_zero3_moves_three_psi_per_micro_batch(strategy: str) -> None:
    items = traffic(SPEC, Topology(world_size=8, dp=8), strategy, dtype="bf16", microbatches=2)
    total = sum(summarize(items).values())
    if strategy == "zero3":
        assert total == pytest.approx(3 * 2 * PSI * 2, rel=1e-5)
    else:  # FSDP keeps its root unit (embeddings, head) gathered through backward
        root = 2 * SPEC.vocab_size * SPEC.hidden + SPEC.hidden
        assert total == pytest.approx((3 * PSI - root) * 2 * 2, rel=1e-4)
    assert _total(items, "all-gather", phase="forward") == pytest.approx(2 * PSI * 2, rel=1e-4)


def test_hybrid_adds_replica_all_reduce_of_the_shard() -> None:
    items = traffic(SPEC, Topology(world_size=16, dp=16), "fsdp-hybrid", shard_size=8, dtype="bf16")
    ar = _total(items, "all-reduce", axis="dp_replicate")
    assert ar == pytest.approx(2 * PSI / 8, rel=1e-3)
    assert {i.group_size for i in items if i.axis == "dp_shard"} == {8}


def test_tensor_parallel_four_all_reduces_per_layer() -> None:
    b, s, m = 2, 1024, 3
    items = traffic(SPEC, Topology(world_size=4, tp=4), "ddp", micro_batch=b, seq_len=s,
                    dtype="bf16", microbatches=m, loss_parallel=True)  # fmt: skip
    layer = [i for i in items if i.source == "tp" and "embedding" not in i.note]
    assert sum(i.count_per_step for i in layer) == 4 * SPEC.layers * m
    assert {i.payload_bytes for i in layer} == {b * s * SPEC.hidden * 2}
    sp = traffic(SPEC, Topology(world_size=4, tp=4), "ddp", micro_batch=b, seq_len=s,
                 dtype="bf16", microbatches=m, sp=True, loss_parallel=True)  # fmt: skip
    counts = {c: sum(i.count_per_step for i in sp if i.collective == c and i.axis == "tp")
              for c in ("all-gather", "reduce-scatter")}  # fmt: skip
    assert counts == {"all-gather": 4 * SPEC.layers * m, "reduce-scatter": 4 * SPEC.layers * m}
    assert all(i.blocking for i in layer)


def test_pipeline_context_and_expert_items() -> None:
    pp = traffic(SPEC, Topology(world_size=4, pp=4), "ddp", micro_batch=1, seq_len=2048,
                 dtype="bf16", microbatches=8)  # fmt: skip
    sends = [i for i in pp if i.axis == "pp"]
    assert {i.payload_bytes for i in sends} == {2048 * SPEC.hidden * 2}
    assert sum(i.count_per_step for i in sends) == 2 * 8
    cp = traffic(
        SPEC, Topology(world_size=4, cp=4), "ddp", micro_batch=1, seq_len=4096, dtype="bf16"
    )
    ring = [i for i in cp if i.axis == "cp"]
    assert ring and all(i.count_per_step == SPEC.layers * 3 for i in ring)
    moe = get_spec("mixtral-8x7b")
    ep = traffic(
        moe, Topology(world_size=8, dp=8, ep=8), "fsdp", micro_batch=1, seq_len=4096, dtype="bf16"
    )
    a2a = [i for i in ep if i.collective == "all-to-all"]
    assert sum(i.count_per_step for i in a2a) == 4 * moe.layers
    assert {i.payload_bytes for i in a2a} == {4096 * 2 * moe.hidden * 2}
    assert sync_points(ep)


def test_single_rank_has_no_traffic() -> None:
    assert traffic(SPEC, Topology(world_size=1), "ddp") == []


def test_fsdp_without_reshard_gathers_once_and_keeps_everything() -> None:
    from parlab.ledger import predict

    topo = Topology(world_size=8, dp=8)
    items = traffic(SPEC, topo, "fsdp", dtype="bf16", reshard_after_forward=False)
    assert _total(items, "all-gather", phase="backward") == 0
    kept = predict(SPEC, strategy="fsdp", topology=topo, dtype="bf16-mixed", seq_len=1024,
                   reshard_after_forward=False)  # fmt: skip
    assert kept.value("gather_buffers") == pytest.approx(2 * PSI, rel=1e-3)  # all of it, bf16
