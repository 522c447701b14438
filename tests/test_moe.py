"""MoE layers: the reference against a dense per-token computation, and expert parallelism
(all-to-all and naive) against the reference -- outputs and gradients, per rank, 2 and 4 gloo ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from parlab.models import MoESpec as ModelMoESpec
from parlab.models.moe import GroupedExperts, MoE
from parlab.models.reference import FeedForward
from parlab.models.router import RouterConfig, sample_experts, zipf_probabilities
from parlab.models.spec import ModelSpec
from parlab.parallel import expert_comm as comm
from parlab.parallel.expert import ExpertParallelMoE
from parlab.runtime.testing import run_ranks

H, FF, T = 16, 24, 12  # hidden, expert FFN, tokens per rank


def _layer(E: int, K: int, *, seed: int | None = None, **router: object) -> MoE:
    return MoE(H, FF, RouterConfig(num_experts=E, top_k=K, **router), seed=seed)


def _dense_reference(layer: MoE, x: torch.Tensor, groups: int) -> torch.Tensor:
    """Every kept (token, slot): weight x expert(token), one token at a time; then the route
    scale and the shared experts."""
    ex = layer.experts
    n = x.shape[0] // groups
    rows = []
    for g in range(groups):
        xg = x[g * n : (g + 1) * n]
        r = layer.router(xg)
        for t in range(n):
            acc = torch.zeros(H)
            for k in range(r.expert_idx_TK.shape[1]):
                if r.keep_TK[t, k]:
                    e = int(r.expert_idx_TK[t, k])
                    if ex.w3 is not None:
                        hid = F.silu(ex.w1[e] @ xg[t]) * (ex.w3[e] @ xg[t])
                    else:
                        hid = F.gelu(ex.w1[e] @ xg[t], approximate="tanh")
                    acc = acc + r.weight_TK[t, k] * (ex.w2[e] @ hid)
            rows.append(acc)
    y = torch.stack(rows) * layer.route_scale
    return y if layer.shared_experts is None else y + layer.shared_experts(x)


@pytest.mark.parametrize(
    "router",
    [
        {},
        {"gating": "sigmoid"},
        {"capacity_factor": 0.75, "drop_policy": "position"},
        {"capacity_factor": 1.0, "drop_policy": "probability", "normalize_weights": True},
    ],
)
def test_reference_layer_equals_dense(router: dict) -> None:
    torch.manual_seed(0)
    layer = _layer(4, 2, seed=5, **router)
    x = torch.randn(2 * T, H)
    out = layer(x, groups=2)
    want = _dense_reference(layer, x, 2)
    torch.testing.assert_close(out.y_TH, want, atol=1e-5, rtol=1e-5)
    assert int(out.kept_E.sum()) <= int(out.routed_E.sum()) == 2 * T * 2


def test_grouped_mm_equals_loop() -> None:
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    a = GroupedExperts(3, H, FF, seed=1, impl="grouped_mm")
    b = GroupedExperts(3, H, FF, seed=1, impl="loop")
    x = torch.randn(10, H)
    counts = [4, 0, 6]
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = a(xa, counts), b(xb, counts)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    torch.testing.assert_close(ya, yb, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(xa.grad, xb.grad, atol=1e-5, rtol=1e-5)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa.grad, pb.grad, atol=1e-5, rtol=1e-5)


def _ep_vs_reference(ctx, E: int, K: int, router: dict, mode: str, skew: float | None) -> dict:
    """On every rank: the reference on all tokens, the EP layer on this rank's tokens."""
    ep, rank = ctx.world_size, ctx.rank
    ref = _layer(E, K, seed=11, **router)
    g = torch.Generator().manual_seed(123)
    x = torch.randn(ep * T, H, generator=g)
    w_out = torch.randn(ep * T, H, generator=g)  # a loss that weighs every output differently
    forced = None
    if skew is not None:
        forced = sample_experts(ep * T, E, K, zipf_probabilities(E, skew), g)
    xr = x.clone().requires_grad_()
    out_ref = ref(xr, groups=ep, forced_idx_TK=forced)
    ((out_ref.y_TH * w_out).sum() + out_ref.aux_loss).backward()

    group = dist.group.WORLD
    layer = ExpertParallelMoE.from_reference(ref, group, mode=mode)
    mine = slice(rank * T, (rank + 1) * T)
    xl = x[mine].clone().requires_grad_()
    out = layer(xl, forced_idx_TK=None if forced is None else forced[mine])
    aux_total = out.aux_loss.detach().clone()
    dist.all_reduce(aux_total)
    ((out.y_TH * w_out[mine]).sum() + out.aux_loss).backward()
    router_grad = layer.router.gate.weight.grad.clone()
    dist.all_reduce(router_grad)  # the router is replicated: its gradient sums over ranks

    L = E // ep
    experts = slice(rank * L, (rank + 1) * L)
    errs = {
        "y": (out.y_TH - out_ref.y_TH[mine]).abs().max().item(),
        "x_grad": (xl.grad - xr.grad[mine]).abs().max().item(),
        "router_grad": (router_grad - ref.router.gate.weight.grad).abs().max().item(),
        "aux": abs(aux_total.item() - out_ref.aux_loss.item()),
    }
    for name in ("w1", "w3", "w2"):
        mine_g = getattr(layer.experts, name).grad
        ref_g = getattr(ref.experts, name).grad[experts]
        errs[name] = (mine_g - ref_g).abs().max().item()
    routed = out.routed_E.clone()
    kept = out.kept_E.clone()
    dist.all_reduce(routed)
    dist.all_reduce(kept)
    return {
        "errs": errs,
        "routed": routed.tolist(),
        "kept": kept.tolist(),
        "ref_routed": out_ref.routed_E.tolist(),
        "ref_kept": out_ref.kept_E.tolist(),
        "recv": None if out.plan is None else out.plan.recv_splits,
        "grad_norm": float(xr.grad.norm()),
    }


CASES = [
    # (world, E, K, router, skew)
    (2, 4, 2, {}, None),
    (2, 4, 1, {"gating": "sigmoid"}, 1.5),
    (2, 8, 2, {"capacity_factor": 0.75, "drop_policy": "position", "aux_loss_coeff": 0.01}, 1.2),
    (4, 8, 2, {"capacity_factor": 1.0, "drop_policy": "probability"}, 1.2),
    (4, 4, 2, {"aux_loss_coeff": 0.01}, None),
]


@pytest.mark.parametrize("mode", ["a2a", "naive"])
@pytest.mark.parametrize("world, E, K, router, skew", CASES)
def test_expert_parallel_equals_reference(
    mode: str, world: int, E: int, K: int, router: dict, skew: float | None
) -> None:
    results = run_ranks(_ep_vs_reference, world, E, K, router, mode, skew)
    for rank, res in enumerate(results):
        for name, err in res["errs"].items():
            assert err < 1e-5, f"rank {rank}: {name} differs by {err}"
        assert res["routed"] == res["ref_routed"] and res["kept"] == res["ref_kept"]
        assert res["grad_norm"] > 0
    if "drop_policy" in router:
        assert sum(results[0]["kept"]) < sum(results[0]["routed"])  # something was dropped
    if mode == "a2a" and skew is not None:
        recv = [sum(r["recv"]) for r in results]
        assert len(set(recv)) > 1  # skew made the exchange uneven


def _uneven_all_to_all(ctx) -> dict:
    n, r = ctx.world_size, ctx.rank
    in_splits = [r + d + 1 for d in range(n)]  # rank r sends r + d + 1 rows to rank d
    out_splits = [s + r + 1 for s in range(n)]
    rows = [torch.full((r + d + 1, 3), float(100 * r + d)) for d in range(n)]
    x = torch.cat(rows).requires_grad_()
    plan = comm.exchange_plan(torch.tensor(in_splits).view(n, 1), dist.group.WORLD)
    y = comm.all_to_all(x, plan.recv_splits, plan.send_splits, dist.group.WORLD)
    y.backward(torch.arange(y.shape[0], dtype=torch.float32).unsqueeze(1).expand(-1, 3))
    return {
        "plan_recv": plan.recv_splits,
        "out_splits": out_splits,
        "y": y[:, 0].tolist(),
        "grad": x.grad[:, 0].tolist(),
    }


@pytest.mark.parametrize("world", [2, 4])
def test_uneven_all_to_all_and_its_backward(world: int) -> None:
    results = run_ranks(_uneven_all_to_all, world)
    for r, res in enumerate(results):
        assert res["plan_recv"] == res["out_splits"]
        want = [float(100 * s + r) for s in range(world) for _ in range(s + r + 1)]
        assert res["y"] == want
    # backward: the gradient row j of rank d's output returns to the row that sent it
    for r, res in enumerate(results):
        grad = []
        for d in range(world):
            offset = sum(s + d + 1 for s in range(r))  # where rank r's rows sit in rank d's output
            grad += [float(offset + i) for i in range(r + d + 1)]
        assert res["grad"] == grad


def test_world_size_one_reduces_to_the_reference() -> None:
    ref = _layer(4, 2, seed=3, capacity_factor=1.0, drop_policy="position")
    x = torch.randn(T, H)
    for mode in ("a2a", "naive"):
        layer = ExpertParallelMoE.from_reference(ref, None, mode=mode)
        torch.testing.assert_close(layer(x).y_TH, ref(x).y_TH, atol=1e-6, rtol=1e-6)


def test_plan_formats_as_a_grid() -> None:
    text = comm.format_plan([[[3, 1], [0, 2]], [[1, 1], [4, 0]]])
    lines = text.splitlines()
    assert "r0e0" in lines[0] and "r1e3" in lines[0]
    assert lines[-1].split()[1:] == ["4", "2", "4", "2", "12"]


@pytest.mark.parametrize(
    "moe",
    [
        {"scoring": "softmax"},
        {"scoring": "sigmoid", "route_scale": 2.5, "shared_experts": 1, "shared_ffn_hidden": 8},
    ],
)
@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
def test_the_reference_models_moe_block_equals_dense(moe: dict, activation: str) -> None:
    """The reference model's MoE block (``MoE.from_spec``: dropless, top-k renormalised, route
    scale, shared experts; SwiGLU or GeLU experts) against the per-token formula."""
    mspec = ModelSpec(
        name="t", vocab_size=32, hidden=H, layers=1, heads=2, ffn_hidden=32, activation=activation,
        moe=ModelMoESpec(num_experts=4, top_k=2, expert_ffn_hidden=FF, **moe),
    )  # fmt: skip

    shared = FeedForward(mspec, mspec.moe.shared_hidden) if mspec.moe.shared_hidden else None
    block = MoE.from_spec(mspec, shared)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    x = torch.randn(T, H)
    torch.testing.assert_close(block(x).y_TH, _dense_reference(block, x, 1), atol=1e-5, rtol=1e-5)


def _model_vs_reference(ctx, mode: str) -> dict:
    """tiny-moe, rank r runs batch row r with its experts sharded; the reference runs both rows."""
    import copy

    from parlab.models import get_spec
    from parlab.models.reference import build_model
    from parlab.parallel.expert import apply_expert_parallel

    ref = build_model(get_spec("tiny-moe"), seed=0)
    model = apply_expert_parallel(copy.deepcopy(ref), dist.group.WORLD, mode=mode)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (ctx.world_size, 16), generator=g)
    w = torch.randn(ctx.world_size, 16, 256, generator=g)
    out_ref = ref(tokens)
    (out_ref * w).sum().backward()
    r = ctx.rank
    out = model(tokens[r : r + 1])
    (out * w[r : r + 1]).sum().backward()
    errs = {"logits": (out - out_ref[r : r + 1]).abs().max().item()}
    ref_params = dict(ref.named_parameters())
    assert [n for n, _ in model.named_parameters()] == list(ref_params)  # the same names
    for name, p in model.named_parameters():
        grad = p.grad.clone()
        if ".moe.experts." in name:  # local experts: this rank's slice of w1/w3/w2
            L = grad.shape[0]
            want = ref_params[name].grad[r * L : (r + 1) * L]
        else:  # replicated: gradients sum over ranks
            dist.all_reduce(grad)
            want = ref_params[name].grad
        errs[name] = (grad - want).abs().max().item()
    return errs


@pytest.mark.parametrize("mode", ["a2a", "naive"])
def test_apply_expert_parallel_to_the_reference_model(mode: str) -> None:
    for rank, errs in enumerate(run_ranks(_model_vs_reference, 2, mode)):
        assert len(errs) > 10
        for name, err in errs.items():
            assert err < 1e-4, f"rank {rank}: {name} differs by {err}"


def _ep_subgroups(ctx) -> dict:
    from parlab.topology import Topology

    topo = Topology(world_size=4, dp=4, ep=2)  # ep groups [0, 1] and [2, 3]
    group = comm.build_ep_group(topo, ctx.rank)
    ref = _layer(4, 2, seed=2)
    x_all = torch.randn(4 * T, H, generator=torch.Generator().manual_seed(9))
    layer = ExpertParallelMoE.from_reference(ref, group)
    mine = slice(ctx.rank * T, (ctx.rank + 1) * T)
    y = layer(x_all[mine]).y_TH
    return {
        "ep": layer.ep,
        "ep_rank": layer.ep_rank,
        "err": (y - ref(x_all[mine]).y_TH).abs().max().item(),
    }


def test_ep_groups_inside_a_larger_world() -> None:
    results = run_ranks(_ep_subgroups, 4)
    assert [(r["ep"], r["ep_rank"]) for r in results] == [(2, 0), (2, 1), (2, 0), (2, 1)]
    assert all(r["err"] < 1e-5 for r in results)
