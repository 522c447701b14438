"""Collective semantics, busbw factors, the alpha-beta model and its fit: pure logic, no ranks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from parlab.comm import model
from parlab.comm import ops as O
from parlab.comm import patterns as P
from parlab.comm.calibration import fit_line, fit_op
from parlab.errors import UsageError


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
def test_busbw_factors_are_nccl_tests(n: int) -> None:
    # nccl-tests doc/PERFORMANCE.md: allreduce 2(n-1)/n; allgather, reducescatter, alltoall
    # (n-1)/n; broadcast, reduce, sendrecv 1
    assert O.busbw_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
    for op in ("all_gather", "reduce_scatter", "all_to_all", "all_to_all_uneven"):
        assert O.busbw_factor(op, n) == pytest.approx((n - 1) / n)
    for op in ("broadcast", "reduce", "send_recv"):
        assert O.busbw_factor(op, n) == 1.0
    assert O.busbw_factor("barrier", n) == 0.0


def test_table_for_eight_ranks() -> None:
    assert {op: O.busbw_factor(op, 8) for op in O.OPS if op != "barrier"} == {
        "all_reduce": 1.75,
        "all_gather": 0.875,
        "reduce_scatter": 0.875,
        "all_to_all": 0.875,
        "all_to_all_uneven": 0.875,
        "broadcast": 1.0,
        "reduce": 1.0,
        "send_recv": 1.0,
    }


def test_rounding_as_nccl_tests() -> None:
    # split ops round down to a multiple of n x element size; 8 B over 4 fp32 ranks is too small
    assert O.round_size("all_gather", 8, 4, 4) == 0
    assert O.round_size("all_gather", 100, 4, 4) == 96
    assert O.round_size("all_reduce", 10, 4, 4) == 8
    assert O.round_size("reduce_scatter", 1 << 20, 3, 4) == (1 << 20) // 12 * 12
    assert O.round_size("all_to_all_uneven", 1000, 4, 2) == 1000 // 20 * 20  # n(n+1)/2 = 10
    assert O.count_of("all_gather", 96, 4, 4) == 6
    assert O.count_of("all_reduce", 96, 4, 4) == 24


def test_uneven_splits_balance_every_rank() -> None:
    n, base = 4, 3
    rows = [O.uneven_splits(r, n, base) for r in range(n)]
    for r in range(n):
        assert sum(rows[r]) == base * n * (n + 1) // 2  # what each rank sends
        assert sum(rows[s][r] for s in range(n)) == sum(rows[r])  # what each rank receives
        assert len(set(rows[r])) == n  # really uneven


def test_size_range_and_bad_input() -> None:
    assert O.size_range(8, 64, 2) == [8, 16, 32, 64]
    assert O.size_range(8, 100, 4) == [8, 32]
    with pytest.raises(UsageError, match="inverted"):
        O.size_range(1024, 8, 2)
    with pytest.raises(UsageError, match="stepfactor"):
        O.size_range(8, 64, 1)
    with pytest.raises(UsageError, match="unknown op"):
        O.parse_ops("all_reduce,allmagic")
    assert O.parse_ops("alltoall,allreduce") == ["all_reduce", "all_to_all"]
    assert O.parse_ops("all") == list(O.OPS)
    with pytest.raises(UsageError, match="gloo"):
        O.check_backend_dtype("gloo", O.parse_dtype("fp8_e4m3"), ["all_gather"])
    with pytest.raises(UsageError, match="reduced"):
        O.check_backend_dtype("nccl", O.parse_dtype("fp8_e4m3"), ["all_reduce"])
    O.check_backend_dtype("nccl", O.parse_dtype("fp8_e4m3"), ["all_gather"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int8, torch.float32])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_patterns_are_exact_in_the_dtype(dtype: torch.dtype, n: int) -> None:
    for op in ("all_reduce", "all_gather"):
        p = P.pattern_for(op, dtype, n)
        assert p.exact
        vals = torch.arange(p.modulus, dtype=torch.int64) + 1
        total = vals * p.total_scale(n) if O.SPECS[op].reduces else vals
        assert torch.equal(total.to(dtype).to(torch.int64), total)  # the reduced value is exact
        # and so is every partial sum a ring would form
        if O.SPECS[op].reduces:
            partial = sum(vals * p.rank_scale(r) for r in range(n // 2))
            assert torch.equal(partial.to(dtype).to(torch.int64), partial)


def test_count_wrong_counts_exactly() -> None:
    p = P.pattern_for("all_gather", torch.float32, 2)
    t = torch.zeros(1000)
    P.fill(t, 17, p)
    assert P.count_wrong(t, 17, p) == 0
    t[3] += 1
    t[999] = -5
    assert P.count_wrong(t, 17, p) == 2
    P.fill(t, 17, p)
    assert P.count_wrong(t, 18, p) == 1000  # shifted by one: every element wrong


# --- the alpha-beta model --------------------------------------------------


def test_ring_coefficients_and_busbw_consistency() -> None:
    link = model.Link(alpha_s=5e-6, beta_s_per_byte=1 / 400e9)
    n, S = 8, 1 << 30
    t = model.collective_time("all_reduce", S, n, link)
    assert t == pytest.approx(2 * 7 * 5e-6 + 2 * 7 / 8 * S / 400e9)
    # at large S the ring's busbw tends to the link bandwidth, for every op with a factor
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"):
        big = 1 << 40
        bw = model.busbw(op, big, n, model.collective_time(op, big, n, link))
        assert bw == pytest.approx(400e9, rel=1e-4)
    assert model.collective_time("send_recv", S, 2, link) == pytest.approx(5e-6 + S / 400e9)
    assert model.collective_time("all_reduce", S, 1, link) == 0.0


def test_hierarchical_reduces_to_flat_and_charges_the_network() -> None:
    nv = model.Link(alpha_s=3e-6, beta_s_per_byte=1 / 400e9)
    ib = model.Link(alpha_s=8e-6, beta_s_per_byte=1 / 50e9)
    S = 1 << 28
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"):
        flat = model.collective_time(op, S, 8, nv)
        assert model.hierarchical_time(
            op, S, gpus_per_node=8, nodes=1, intra=nv, inter=ib
        ) == pytest.approx(flat)
        two = model.hierarchical_time(op, S, gpus_per_node=8, nodes=2, intra=nv, inter=ib)
        assert two > flat
    # all-reduce over 2 nodes: 2 x RS(8, S) on NVLink + AR(2, S/8) on the network
    want = 2 * (7 * 3e-6 + 7 / 8 * S / 400e9) + 2 * (1 * 8e-6 + 0.5 * S / 8 / 50e9)
    got = model.hierarchical_time("all_reduce", S, gpus_per_node=8, nodes=2, intra=nv, inter=ib)
    assert got == pytest.approx(want)


# --- the fit ---------------------------------------------------------------


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "all_to_all", "send_recv"])
def test_fit_recovers_known_alpha_beta(op: str) -> None:
    n, alpha, beta = 4, 6e-6, 1 / 350e9
    link = model.Link(alpha_s=alpha, beta_s_per_byte=beta)
    sizes = [8 * 2**k for k in range(31)]
    times = [model.collective_time(op, s, n, link) for s in sizes]
    fit = fit_op(op, n, sizes, times)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fit.beta_s_per_byte == pytest.approx(beta, rel=1e-6)
    assert fit.rms_rel_err < 1e-9
    # with 3 % multiplicative noise the parameters stay within a few percent
    rng = np.random.default_rng(0)
    noisy = [t * (1 + 0.03 * rng.standard_normal()) for t in times]
    fit = fit_op(op, n, sizes, noisy)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.05)
    assert fit.beta_s_per_byte == pytest.approx(beta, rel=0.05)
    assert 0.01 < fit.rms_rel_err < 0.06
    assert fit.predict(1 << 30) == pytest.approx(
        model.collective_time(op, 1 << 30, n, link), rel=0.05
    )
    # and predicts other world sizes with the same link
    assert fit.predict(1 << 30, n=8) == pytest.approx(
        model.collective_time(op, 1 << 30, 8, link), rel=0.05
    )


def test_fit_keeps_parameters_non_negative() -> None:
    a, b = fit_line([8, 16, 32], [1e-5, 1e-5, 1e-5])
    assert a == pytest.approx(1e-5) and b >= 0
    a, b = fit_line([1e6, 2e6, 4e6], [1e-3, 2e-3, 4e-3])
    assert a >= 0 and b == pytest.approx(1e-9, rel=1e-6)
    assert not math.isnan(a)


def test_link_peak_from_env_then_catalog_then_unknown() -> None:
    gpus = [{"name": "NVIDIA H200", "memory_bytes": 1}] * 2
    inter = {"per_direction_bw": [[None, 478e9], [478e9, None]], "per_link_bw_source": "nvml"}
    bw, src = model.link_peak({"hardware": {"gpus": gpus, "interconnect": inter}}, [0, 1])
    assert bw == 478e9 and "parlab env" in src
    bw, src = model.link_peak({"hardware": {"gpus": gpus, "interconnect": None}})
    assert bw == 450e9 and "catalog H200" in src
    assert model.link_peak({"hardware": {"gpus": [{"name": "Mystery GPU"}]}})[0] is None
    assert model.link_peak({"hardware": {"gpus": []}})[0] is None
