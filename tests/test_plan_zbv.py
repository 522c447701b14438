"""The zero-bubble V (``zbv``) in the planner: its bubble against hand counts and a replay of
torch's action lists, its activations in flight, its layout rules, and the run document's
mapping. Pure logic, no process group."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from parlab.errors import UsageError
from parlab.ledger import activations as act
from parlab.ledger.sharding import stage_layers
from parlab.plan.estimate import zbv_bubble, zbv_passes


def torch_zbv_lists(p: int, m: int) -> list[list[tuple[str, int, int]]]:
    """torch's ``ScheduleZBVZeroBubble._calculate_single_rank_operations`` (torch 2.11-2.13),
    transcribed: per rank, (kind F | I | W, stage, micro-batch)."""
    out = []
    for r in range(p):
        n = max(2 * p - 1, m)
        s0, s1 = r, 2 * p - 1 - r
        f0 = f1 = b0 = b1 = 0
        ops: list[tuple[str, int, int]] = []
        for _ in range(2 * (p - r) - 1):
            ops.append(("F", s0, f0))
            f0 += 1
        for _ in range(r):
            ops += [("F", s1, f1), ("F", s0, f0)]
            f0, f1 = f0 + 1, f1 + 1
        for _ in range(p - r):
            ops += [("F", s1, f1), ("I", s1, b1), ("W", s1, b1)]
            f1, b1 = f1 + 1, b1 + 1
        while f1 < f0 or f0 < n:
            if f0 < n:
                ops.append(("F", s0, f0))
                f0 += 1
            ops += [("I", s0, b0), ("W", s0, b0), ("F", s1, f1), ("I", s1, b1), ("W", s1, b1)]
            b0, f1, b1 = b0 + 1, f1 + 1, b1 + 1
        w0, w1 = b0, b1
        for _ in range(r):
            ops += [("I", s0, b0), ("I", s1, b1)]
            b0, b1 = b0 + 1, b1 + 1
        for _ in range(p - r):
            ops += [("I", s0, b0), ("W", s0, w0)]
            b0, w0 = b0 + 1, w0 + 1
        ops += [("W", s1, i) for i in range(w1, b1)] + [("W", s0, i) for i in range(w0, b0)]
        out.append([o for o in ops if o[2] < m])
    return out


def replay(p: int, m: int, t_f: float, t_b: float, t_w: float) -> float:
    """Idle seconds of one step of the lists with fixed pass times (transfers free)."""
    lists, last = torch_zbv_lists(p, m), 2 * p - 1
    dur = {"F": t_f, "I": t_b, "W": t_w}
    done: dict[tuple[str, int, int], float] = {}
    free, pos = [0.0] * p, [0] * p
    while any(pos[r] < len(lists[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while pos[r] < len(lists[r]):
                k, s, i = lists[r][pos[r]]
                dep = {
                    "F": [("F", s - 1, i)] if s else [],
                    "I": [("I", s + 1, i)] if s < last else [("F", s, i)],
                    "W": [("I", s, i)],
                }[k]
                if any(d not in done for d in dep):
                    break
                free[r] = max([free[r], *(done[d] for d in dep)]) + dur[k]
                done[(k, s, i)] = free[r]
                pos[r] += 1
                moved = True
        assert moved, "the lists deadlock"
    return max(free) - 2 * m * (t_f + t_b + t_w)


def test_bubble_by_hand_p2() -> None:
    """p = 2, m = 3, unit passes, by hand: rank 0 runs 0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0I0
    0W0 3F2 3I2 3W2 0I1 0W1 0I2 0W2 without a gap (18 units); rank 1 waits one unit for 0F0,
    then runs its 18 without a gap: a span of 19 for 18 units of work -> 1 = (p - 1) t_b."""
    assert zbv_bubble(2, 3, 1.0, 1.0) == 1.0
    assert replay(2, 3, 1.0, 1.0, 1.0) == pytest.approx(1.0)
    # t_b = 2, t_w = 0: the weight passes fill nothing -> (p - 1) x 2 (t_b - t_w) = 4
    assert zbv_bubble(2, 8, 2.0, 0.0) == 4.0
    assert replay(2, 8, 1.0, 2.0, 0.0) == pytest.approx(4.0)
    assert zbv_bubble(1, 8, 2.0, 1.0) == 0.0


def test_bubble_by_hand_p3() -> None:
    """p = 3, unit passes: (p - 1) t_b = 2 for any m >= 2p - 1 = 5."""
    for m in (5, 6, 12):
        assert zbv_bubble(3, m, 1.0, 1.0) == 2.0
        assert replay(3, m, 1.0, 1.0, 1.0) == pytest.approx(2.0)


def test_formula_matches_torch_lists_in_its_region() -> None:
    """Exact wherever t_f <= t_b, t_w <= t_b, m >= 2p - 1; a lower bound elsewhere."""
    vals = (0.25, 0.5, 1.0, 1.5, 3.0)
    for p, (t_f, t_b, t_w) in itertools.product((2, 3, 4), itertools.product(vals, repeat=3)):
        for m in (2 * p - 1, 3 * p + 1):
            got, want = zbv_bubble(p, m, t_b, t_w), replay(p, m, t_f, t_b, t_w)
            if t_f <= t_b and t_w <= t_b:
                assert got == pytest.approx(want), (p, m, t_f, t_b, t_w)
            else:
                assert got <= want + 1e-9, (p, m, t_f, t_b, t_w)


def test_smaller_than_1f1b_at_equal_passes() -> None:
    """At T_F = T_B = T_W a sixth of 1F1B's (p - 1)(T_F + T_B + T_W) (chunk = half a stage)."""
    p, t = 4, 1.0
    assert zbv_bubble(p, 16, t / 2, t / 2) == pytest.approx((p - 1) * 3 * t / 6)


def test_passes_shares() -> None:
    from parlab.plan.roofline import ComputeParts

    assert zbv_passes(None) == (1 / 3, 1 / 3, 1 / 3)
    parts = ComputeParts(
        gemm_s=3.0, attention_s=1.5, elementwise_s=1.5, step_s=9.0, forward_fraction=1 / 3
    )
    f, b, w = zbv_passes(parts)  # weight gradients: a third of the GEMMs, of 6 s per token
    assert (f, w) == pytest.approx((1 / 3, 1 / 6)) and b == pytest.approx(1 / 2)
    full = ComputeParts(  # full recompute: the replayed forward is in the input-gradient pass
        gemm_s=4.0, attention_s=0.0, elementwise_s=0.0, step_s=0.0, forward_fraction=1 / 2
    )
    assert zbv_passes(full) == pytest.approx((1 / 4, 1 / 2, 1 / 4))


def test_in_flight_counts_torch_lists() -> None:
    """Chunks alive from their forward to their deferred weight pass, per rank, on torch's
    lists, are the ledger's in-flight count x 2 (v = 2); p M_B on every rank for m >= 2p - 1."""
    for p in range(2, 6):
        for m in range(1, 4 * p):
            for r, ops in enumerate(torch_zbv_lists(p, m)):
                alive = peak = 0
                for k, _, _ in ops:
                    alive += {"F": 1, "W": -1}.get(k, 0)
                    peak = max(peak, alive)
                assert act.in_flight("zbv", p, r, m, 2) * 2 == peak, (p, m, r)
    assert act.in_flight("zbv", 4, 3, 8, 2) == 4.0


def test_v_places_first_and_last_chunk_on_rank_0() -> None:
    assert stage_layers(8, 2, 0, 2, v_shape=True) == [0, 1, 6, 7]
    assert stage_layers(8, 2, 1, 2, v_shape=True) == [2, 3, 4, 5]
    assert stage_layers(8, 2, 1, 2) == [2, 3, 6, 7]  # interleaved unchanged


def _request(layers_model: str = "tiny", gb: int = 8, schedules: tuple[str, ...] = ("zbv",)):
    from parlab.models import get_spec
    from parlab.plan.request import PlanRequest
    from parlab.plan.space import make_cluster
    from parlab.plan.throughput import assumed_throughput

    cluster = make_cluster(gpus="2xH100")
    spec = get_spec(layers_model)
    return PlanRequest(
        spec=spec,
        cluster=cluster,
        global_batch=gb,
        seq=128,
        compute=assumed_throughput(0.4, cluster.gpu.peak("bf16"), "H100"),
        micro_batches=(1, 4),
        strategies=("ddp",),
        recompute=("none",),
        schedules=schedules,
    )


def test_planner_admits_and_rejects_zbv() -> None:
    from parlab.plan.planner import plan

    req = _request()
    assert req.spec.layers % 4 == 0
    res = plan(req)
    zbv = [v for v in res.ranked if v.cand.schedule == "zbv"]
    assert zbv and all(v.cand.vpp == 2 and v.cand.pp == 2 for v in zbv)
    assert all(v.cand.microbatches >= 3 for v in zbv)
    # micro-batch 4 on pp2 dp1: 2 micro-batches, fewer than 2p - 1 = 3
    short = [v for v in res.rejected if v.cand.schedule == "zbv" and v.kind == "batch"]
    assert short and "2 pp - 1" in short[0].reason
    # a zbv candidate's bubble is its formula's, and below 1F1B's at the same micro-batches
    both = plan(_request(schedules=("1f1b", "zbv")))
    est = {v.cand.schedule: v.estimate for v in both.ranked if v.cand.micro_batch == 1}
    assert est["zbv"].bubble_s < est["1f1b"].bubble_s
    # default search leaves zbv out
    assert "zbv" not in _request(schedules=("1f1b",)).schedules


def test_planner_rejects_zbv_where_its_2p_chunks_outnumber_the_layers() -> None:
    from dataclasses import replace

    from parlab.plan.planner import plan

    req = _request()
    uneven = plan(replace(req, spec=replace(req.spec, layers=5)))  # 4 chunks of 2, 1, 1, 1
    assert any(v.cand.schedule == "zbv" for v in uneven.ranked)
    few = plan(replace(req, spec=replace(req.spec, layers=3)))  # 4 chunks, 3 layers
    bad = [v for v in few.rejected if v.cand.schedule == "zbv" and v.cand.pp == 2]
    assert bad and all(v.kind == "layout" and "a layer per chunk" in v.reason for v in bad)


def test_request_rejects_unknown_schedule() -> None:
    with pytest.raises(UsageError):
        _request(schedules=("zb-h2",))


def test_ledger_zbv_needs_two_chunks() -> None:
    from parlab.ledger import predict
    from parlab.models import get_spec
    from parlab.topology import Topology

    spec = get_spec("tiny")
    topo = Topology(world_size=2, pp=2)
    with pytest.raises(UsageError):
        predict(spec, topology=topo, pp_schedule="zbv", microbatches=4, virtual_stages=1)
    led = predict(spec, topology=topo, pp_schedule="zbv", microbatches=4, virtual_stages=2)
    logits = led.item("logits")
    assert logits is not None and logits.per_stage[0] > 0 and logits.per_stage[1] == 0


def test_run_document_maps_to_zbv() -> None:
    """The zbv run's layout (pp_schedule 'zbv', vpp 2, torch) becomes the zbv candidate."""
    from parlab.plan.fit.calibrate import unmodelled
    from parlab.plan.fit.requests import run_request

    doc = SimpleNamespace(
        run_id="mi-pp2-zbv-torch-test",
        project="PAR-MODEL-INTERNAL",
        evidence_level="real-training",
        status="ok",
        workload={"model": "tiny", "micro_batch": 1, "global_batch": 8, "seq": 128},
        layout={
            "world_size": 2,
            "mesh": {"pp": 2, "dp": 1, "cp": 1, "tp": 1},
            "strategy": "pp2-zbv-torch",
            "pp_schedule": "zbv",
            "vpp": 2,
            "implementation": "torch",
            "norm_kernel": "fused",
        },
        environment={"hardware": {"gpus": [{"name": "H100"}, {"name": "H100"}]}},
        metrics={},
    )
    made = run_request(doc)
    assert made is not None
    _, cand, _ = made
    assert (cand.schedule, cand.vpp, cand.pp, cand.microbatches) == ("zbv", 2, 2, 8)
    assert "not modelled" in unmodelled(doc)
