"""Router logic without a process group: capacity, dropping, aux loss, gating, bias balancing."""

from __future__ import annotations

import pytest
import torch

from parlab.errors import UsageError
from parlab.models.router import (
    Router,
    RouterConfig,
    aux_loss,
    capacity,
    keep_mask,
    load_stats,
    sample_experts,
    zipf_probabilities,
)
from parlab.parallel.expert import check_ep


def test_capacity_formula_hand_checked() -> None:
    assert capacity(8, 4, 2, 1.0) == 4  # k*T/E = 4
    assert capacity(7, 4, 2, 1.25) == 5  # 4.375 -> 5
    assert capacity(10, 4, 1, 1.2) == 3  # 3.0000000000000004 in floats, still 3
    assert capacity(16, 8, 1, 0.5) == 1
    cfg = RouterConfig(num_experts=4, top_k=2, capacity_factor=1.0, drop_policy="position")
    assert cfg.capacity(8) == 4
    assert RouterConfig(num_experts=4, top_k=2).capacity(8) is None  # dropless


def test_drop_by_position_keeps_earliest_tokens() -> None:
    idx = torch.tensor([[0], [0], [1], [0], [0]])
    w = torch.ones(5, 1)
    keep = keep_mask(idx, w, 2, 2, "position")
    assert keep.squeeze(1).tolist() == [True, True, True, False, False]
    # top-2: the last token overflows both experts (capacity 3)
    idx2 = torch.tensor([[0, 1], [1, 0], [0, 1], [1, 0]])
    keep2 = keep_mask(idx2, torch.ones(4, 2), 2, 3, "position")
    assert keep2.tolist() == [[True, True], [True, True], [True, True], [False, False]]


def test_drop_by_probability_keeps_highest_weights() -> None:
    idx = torch.tensor([[0], [0], [0], [1]])
    w = torch.tensor([[0.2], [0.9], [0.5], [0.7]])
    keep = keep_mask(idx, w, 2, 2, "probability")
    assert keep.squeeze(1).tolist() == [False, True, True, True]
    # ties go to the earlier token
    keep_tie = keep_mask(idx, torch.full((4, 1), 0.5), 2, 2, "probability")
    assert keep_tie.squeeze(1).tolist() == [True, True, False, True]
    assert keep_mask(idx, w, 2, None, "none").all()


def test_router_zeroes_dropped_weights_and_counts() -> None:
    cfg = RouterConfig(num_experts=2, top_k=1, capacity_factor=0.5, drop_policy="position")
    router = Router(4, cfg)
    router.reset(0)
    forced = torch.tensor([[0], [0], [0], [1], [1], [0]])
    r = router(torch.randn(6, 4), forced)
    assert r.capacity == 2  # ceil(1 * 6 / 2 * 0.5) = 2 (1.5 -> 2)
    assert r.keep_TK.squeeze(1).tolist() == [True, True, False, True, True, False]
    assert (r.weight_TK[~r.keep_TK] == 0).all()
    assert r.counts(2).tolist() == [4, 2]
    assert r.counts(2, kept=True).tolist() == [2, 2]


def test_aux_loss_value_hand_checked() -> None:
    scores = torch.tensor([[0.7, 0.3], [0.4, 0.6]])
    # f = [0.5, 0.5], P = [0.55, 0.45]: 2 * (0.275 + 0.225) = 1.0
    assert aux_loss(scores, torch.tensor([[0], [1]]), 2, 0.01).item() == pytest.approx(0.01)
    # f = [1, 0]: 2 * 0.55 = 1.1
    assert aux_loss(scores, torch.tensor([[0], [0]]), 2, 0.01).item() == pytest.approx(0.011)
    assert aux_loss(scores, torch.tensor([[0], [0]]), 2, 0.0).item() == 0.0


def test_aux_loss_reaches_the_gate() -> None:
    cfg = RouterConfig(num_experts=4, top_k=2, aux_loss_coeff=0.1)
    router = Router(8, cfg)
    router.reset(1)
    r = router(torch.randn(16, 8))
    r.aux_loss.backward()
    assert router.gate.weight.grad is not None and router.gate.weight.grad.abs().sum() > 0


def test_sigmoid_gating_normalises_and_bias_only_steers_selection() -> None:
    cfg = RouterConfig(num_experts=4, top_k=2, gating="sigmoid")
    router = Router(8, cfg)
    router.reset(2)
    x = torch.randn(10, 8)
    r = router(x)
    assert torch.allclose(r.weight_TK.sum(-1), torch.ones(10))
    s = torch.sigmoid(x @ router.gate.weight.T)
    with torch.no_grad():
        router.expert_bias.copy_(torch.tensor([10.0, 10.0, 0.0, 0.0]))
    rb = router(x)
    assert sorted(rb.expert_idx_TK[0].tolist()) == [0, 1]  # the bias forces the choice
    sel = s.gather(1, rb.expert_idx_TK)
    assert torch.allclose(rb.weight_TK, sel / sel.sum(-1, keepdim=True))  # weights: no bias


def test_bias_balancing_reduces_max_vio() -> None:
    E = 8
    cfg = RouterConfig(num_experts=E, top_k=2, bias_update_rate=0.01)
    router = Router(16, cfg)
    router.reset(3)
    g = torch.Generator().manual_seed(0)
    hot = router.gate.weight[:2].sum(0).detach()  # inputs leaning towards experts 0 and 1
    x = torch.randn(512, 16, generator=g) + 0.8 * hot / hot.norm() * 4
    vio = []
    for _ in range(60):
        r = router(x)
        counts = r.counts(E)
        vio.append(load_stats(counts)["max_vio"])
        router.update_bias(counts)
    assert vio[0] > 1.0
    assert vio[-1] < 0.35 * vio[0]


def test_load_stats() -> None:
    s = load_stats([1, 1, 1, 5])
    assert s["mean"] == 2 and s["max"] == 5
    assert s["max_over_mean"] == 2.5 and s["max_vio"] == 1.5
    assert load_stats([3, 3])["max_vio"] == 0


def test_zipf_workload() -> None:
    p = zipf_probabilities(8, 0.0)
    assert torch.allclose(p, torch.full((8,), 1 / 8))
    p = zipf_probabilities(8, 1.2)
    assert p[0] > p[1] > p[7] and p.sum().item() == pytest.approx(1.0)
    idx = sample_experts(1000, 8, 2, p, torch.Generator().manual_seed(0))
    assert idx.shape == (1000, 2) and (idx[:, 0] != idx[:, 1]).all()
    counts = torch.bincount(idx.reshape(-1), minlength=8)
    assert counts[0] > 2 * counts[7]


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"num_experts": 4, "top_k": 5}, "--topk 5"),
        ({"num_experts": 4, "top_k": 2, "capacity_factor": 0.0, "drop_policy": "position"}, "capacity factor"),
        ({"num_experts": 4, "top_k": 2, "capacity_factor": -1.0, "drop_policy": "probability"}, "capacity factor"),
        ({"num_experts": 4, "top_k": 2, "gating": "relu"}, "gating"),
    ],
)  # fmt: skip
def test_bad_router_input_is_one_line(kwargs: dict, fragment: str) -> None:
    with pytest.raises(UsageError, match=fragment) as info:
        RouterConfig(**kwargs)
    assert "\n" not in str(info.value)


def test_experts_must_divide_over_ep() -> None:
    assert check_ep(8, 4) == 2
    with pytest.raises(UsageError, match="do not divide"):
        check_ep(6, 4)


def test_unserved_tokens_lost_every_slot() -> None:
    cfg = RouterConfig(num_experts=2, top_k=2, capacity_factor=0.5, drop_policy="position")
    router = Router(4, cfg)
    router.reset(0)
    forced = torch.tensor([[0, 1], [1, 0], [0, 1], [1, 0]])
    r = router(torch.randn(4, 4), forced)
    assert r.capacity == 2  # ceil(2 * 4 / 2 * 0.5)
    assert r.keep_TK.tolist() == [[True, True], [True, True], [False, False], [False, False]]
    assert r.unserved_tokens() == 2
