"""The benchmark rank function on 2 and 4 gloo ranks: every op against a single-process reference."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from parlab.comm import ops as O
from parlab.comm.bench import sweep_rank
from parlab.comm.case import Case
from parlab.runtime.context import RankContext
from parlab.runtime.testing import run_ranks

SIZED = [op for op in O.OPS if op != "barrier"]


def _one_case(ctx: RankContext, op: str, nbytes: int, dtype: str, inplace: bool) -> dict[str, Any]:
    """Rank function: fill, keep a copy of the input, run the op once, return both and the check."""
    case = Case(op, nbytes, O.parse_dtype(dtype), inplace, dist.group.WORLD, ctx.device)
    case.prepare()
    inp = case.input.clone()
    case.fn()
    out = case.output.clone()
    case.prepare()  # the check runs on fresh inputs, as the sweep does
    wrong = case.check()
    return {"input": inp.double().tolist(), "output": out.double().tolist(), "wrong": wrong}


def _reference(op: str, inputs: list[torch.Tensor], n: int) -> list[torch.Tensor | None]:
    """The single-process answer for every rank (None: the op leaves that rank's buffer undefined)."""
    total = torch.stack(inputs).sum(0)
    if op == "all_reduce":
        return [total] * n
    if op == "all_gather":
        return [torch.cat(inputs)] * n
    if op == "reduce_scatter":
        return list(total.chunk(n))
    if op == "all_to_all":
        return [torch.cat([inputs[s].chunk(n)[r] for s in range(n)]) for r in range(n)]
    if op == "all_to_all_uneven":
        base = inputs[0].numel() // (n * (n + 1) // 2)
        pieces = [list(inputs[s].split(O.uneven_splits(s, n, base))) for s in range(n)]
        return [torch.cat([pieces[s][r] for s in range(n)]) for r in range(n)]
    if op == "broadcast":
        return [inputs[0]] * n
    if op == "reduce":
        return [total] + [None] * (n - 1)
    if op == "send_recv":
        return [inputs[(r - 1) % n] for r in range(n)]
    raise AssertionError(op)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("op", SIZED)
def test_every_op_matches_the_single_process_reference(op: str, n: int) -> None:
    nbytes = O.round_size(op, 4000, n, 4)
    res = run_ranks(_one_case, n, op, nbytes, "float32", False)
    inputs = [torch.tensor(r["input"]) for r in res]
    if op == "all_gather":  # each rank's input is its chunk of the gathered buffer
        assert all(len(i) == nbytes // 4 // n for i in inputs)
    want = _reference(op, inputs, n)
    for rank, r in enumerate(res):
        assert r["wrong"] == 0, (op, rank)
        if want[rank] is not None:
            assert torch.equal(torch.tensor(r["output"]), want[rank]), (op, rank)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_inplace_forms_match_the_reference(op: str) -> None:
    n = 4
    res = run_ranks(_one_case, n, op, 4096, "bfloat16", True)
    inputs = [torch.tensor(r["input"]) for r in res]
    want = _reference(op, inputs, n)
    for rank, r in enumerate(res):
        assert r["wrong"] == 0
        assert torch.equal(torch.tensor(r["output"]), want[rank])


def _corrupt_then_check(ctx: RankContext) -> int | None:
    case = Case("all_reduce", 4096, torch.float32, False, dist.group.WORLD, ctx.device)
    real = case.fn
    # a broken collective: right on rank 0, three elements off on rank 1
    case.fn = lambda: (real(), case.output[:3].add_(ctx.rank))  # type: ignore[method-assign]
    return case.check()


def test_a_wrong_result_is_counted() -> None:
    assert run_ranks(_corrupt_then_check, 2) == [0, 3]


def _sweep(ctx: RankContext, **kw: Any) -> dict[str, Any]:
    return sweep_rank(ctx, **kw)


def test_sweep_records_every_op_slowest_rank_and_checks() -> None:
    res = run_ranks(
        _sweep, 2, ops=list(O.OPS), sizes=[8, 1024, 65536], dtype="bf16", warmup=1, iters=3
    )
    recs = res[0]["records"]
    assert res[1]["records"] is None  # rank 0 carries the records
    assert {r["op"] for r in recs} == set(O.OPS)
    for r in recs:
        assert r["wrong"] == 0, r
        assert r["time_s"] > 0 and r["samples"] == 3
        assert r["time_min_s"] <= r["time_median_s"] <= r["time_max_s"]
        assert len(r["time_per_rank_s"]) == 2
        # the slowest rank defines the time
        assert r["time_s"] == pytest.approx(max(r["time_per_rank_s"]))
        if r["op"] != "barrier":
            assert r["busbw"] == pytest.approx(r["algbw"] * O.busbw_factor(r["op"], 2))
            assert r["algbw"] == pytest.approx(r["size"] / r["time_s"])
    ag = [r for r in recs if r["op"] == "all_gather"]
    assert [r["size"] for r in ag] == [8, 1024, 65536]
    assert [r["count"] for r in ag] == [2, 256, 16384]  # bf16 elements per rank


def test_mesh_axis_subgroups() -> None:
    # 4 ranks as dp=2 x tp=2: each tp group [0,1] and [2,3] runs its own collectives of n = 2
    res = run_ranks(
        _sweep,
        4,
        ops=["all_reduce", "all_gather", "all_to_all_uneven", "send_recv"],
        sizes=[96, 4096],
        warmup=0,
        iters=2,
        mesh={"dp": 2, "tp": 2},
        axis="tp",
    )
    assert all(r["group_size"] == 2 for r in res)
    recs = res[0]["records"]
    assert recs and all(r["group_size"] == 2 and r["wrong"] == 0 for r in recs)
    ar = next(r for r in recs if r["op"] == "all_reduce" and r["size"] == 4096)
    assert ar["busbw"] == pytest.approx(ar["algbw"] * 1.0)  # 2(n-1)/n at n = 2
    res = run_ranks(
        _sweep, 4, ops=["all_gather"], sizes=[96], iters=1, mesh={"dp": 2, "tp": 2}, axis="dp"
    )
    assert res[0]["records"][0]["group_size"] == 2 and res[0]["records"][0]["wrong"] == 0


def test_uneven_all_to_all_on_four_ranks_sends_uneven_chunks() -> None:
    res = run_ranks(
        _one_case,
        4,
        "all_to_all_uneven",
        O.round_size("all_to_all_uneven", 4000, 4, 4),
        "float32",
        False,
    )
    assert all(r["wrong"] == 0 for r in res)
    # rank 1 receives 1, 2, 3, 4 x base... from ranks 0..3 in some order: chunk sizes differ
    base = len(res[0]["input"]) // 10
    assert sorted(O.uneven_splits(s, 4, base)[1] for s in range(4)) == [
        base,
        2 * base,
        3 * base,
        4 * base,
    ]


def test_sweep_rank_env_turns_off_the_flight_recorder_and_graph_mixing() -> None:
    from parlab.comm.sweep import rank_env

    assert rank_env(False, {}) == (("TORCH_FR_BUFFER_SIZE", "0"),)
    assert rank_env(True, {}) == (
        ("TORCH_FR_BUFFER_SIZE", "0"),
        ("NCCL_GRAPH_MIXING_SUPPORT", "0"),
    )
    # either flight-recorder name set by the user: parlab sets neither (the first name wins
    # in torch, so setting one beside the user's alias would override it)
    assert rank_env(True, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}) == (
        ("NCCL_GRAPH_MIXING_SUPPORT", "0"),
    )
