"""What a rank does in a ``parlab project moe`` run, in this order.

1. **reference all-to-all**: a plain ``all_to_all_single`` with equal splits at a few payloads
   (up to the dispatch payload), timed exactly as the layer's exchanges are, so the
   dispatch/combine busbw has a same-method reference measured in the same process;
2. **routing workloads** (``uniform``, and ``zipf:s`` for each skew): the experts each token
   goes to are drawn from a Zipf(s) law over experts (expert 0 hottest, so rank 0 holds the hot
   experts; s = 0 is uniform), the gate weights are the router's scores at the drawn experts,
   and capacity and dropping apply as configured. Each workload runs ``warmup`` + ``iters``
   forwards of the expert-parallel layer (all-to-all) and of the naive one (all-gather +
   reduce-scatter), every phase bracketed by a barrier and a device synchronisation
   (``expert_comm.BarrierTimer``): collective times are the collectives' own, compute times each
   rank's own;
3. **capacity-factor sweep**: the overflow rate of each workload at each factor (routing only,
   no exchange; counts summed with one all-reduce);
4. **learned routing**: a few training steps of the layer on clustered tokens (cluster
   frequencies Zipf-skewed), once per balancing mode (``none``, auxiliary loss,
   auxiliary-loss-free bias), on the shared step loop (``parlab.runtime.loop``), recording the
   expert load's MaxVio and the overflow at every step.

What crosses the wire besides the layer's own exchanges: one barrier per timed phase, and
``all_reduce`` of load counts (and of the router gradient in training, since the router is
replicated over the ep ranks).
"""

from __future__ import annotations

import statistics
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from parlab.comm.model import busbw
from parlab.models.moe import MoE
from parlab.models.router import keep_mask, load_stats, zipf_probabilities
from parlab.parallel import expert_comm as comm
from parlab.parallel.expert import ExpertParallelMoE
from parlab.projects.moe.config import DTYPES, MoERunConfig
from parlab.projects.moe.workloads import draw_tokens, forced_experts
from parlab.runtime.context import RankContext
from parlab.runtime.loop import LoopPlan, TrainStep, run_steps
from parlab.topology import Topology


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _max_over(group: Any, x: float, device: torch.device) -> float:
    if comm.group_size(group) == 1:
        return x
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _sum_over(group: Any, t: torch.Tensor) -> torch.Tensor:
    if comm.group_size(group) > 1:
        dist.all_reduce(t, group=group)
    return t


def _reference_a2a(
    group: Any, device: torch.device, dtype: torch.dtype, sizes: list[int], warmup: int, iters: int
) -> list[dict[str, float]]:
    """Plain equal-split all_to_all_single at each per-rank payload, timed like the layer."""
    n = comm.group_size(group)
    esize = torch.empty((), dtype=dtype).element_size()
    out = []
    for nbytes in sizes:
        rows = max(n, nbytes // esize // n * n)
        x = torch.ones(rows, dtype=dtype, device=device)
        y = torch.empty_like(x)
        times = []
        for i in range(warmup + iters):
            timer = comm.BarrierTimer(device=device, group=group)
            t0 = timer.start()
            if n > 1:
                dist.all_to_all_single(y, x, group=group)
            else:
                y.copy_(x)
            timer.stop("a2a", t0)
            if i >= warmup:
                times.append(timer.seconds["a2a"])
        t = _max_over(group, _median(times), device)
        b = rows * esize
        out.append({"bytes": b, "seconds": t, "busbw": busbw("all_to_all", b, n, t)})
    return out


def _time_layer(
    layer: ExpertParallelMoE,
    x: torch.Tensor,
    forced: torch.Tensor,
    cfg: MoERunConfig,
    group: Any,
) -> dict[str, Any]:
    """Median phase times and bytes of ``warmup + iters`` forwards (no autograd)."""
    per_iter: list[dict[str, float]] = []
    nbytes: dict[str, int] = {}
    out = None
    with torch.no_grad():
        for i in range(cfg.warmup + cfg.iters):
            timer = comm.BarrierTimer(device=x.device, group=group)
            out = layer(x, forced_idx_TK=forced, timer=timer)
            if i >= cfg.warmup:
                per_iter.append(dict(timer.seconds))
                nbytes = dict(timer.nbytes)
    assert out is not None
    phases = {p: _median([it[p] for it in per_iter]) for p in per_iter[0]}
    return {"phases": phases, "bytes": nbytes, "out": out}


def _workload_run(
    ctx: RankContext,
    cfg: MoERunConfig,
    group: Any,
    dtype: torch.dtype,
    name: str,
    skew: float,
    salt: int,
) -> dict[str, Any]:
    ep_rank = comm.group_rank(group)
    router = cfg.router_config()
    x = draw_tokens(cfg, ep_rank, salt, ctx.device, dtype)
    forced = forced_experts(cfg, ep_rank, salt, skew)
    kw: dict[str, Any] = {"seed": cfg.seed, "device": ctx.device, "dtype": dtype}
    layer = ExpertParallelMoE(cfg.hidden, cfg.ffn_hidden, router, group, mode="a2a", **kw)
    fast = _time_layer(layer, x, forced, cfg, group)
    out = fast["out"]
    routed = _sum_over(group, out.routed_E.clone())
    kept = _sum_over(group, out.kept_E.clone())
    plan = out.plan
    res: dict[str, Any] = {
        "name": name,
        "skew": skew,
        "phases": fast["phases"],
        "bytes": fast["bytes"],
        "routed_E": routed.tolist(),
        "kept_E": kept.tolist(),
        "unserved_tokens": out.unserved_tokens,
        "rows_computed": sum(plan.tokens_per_local_expert) if plan else None,
        "send_counts": plan.send_counts if plan else None,
        "capacity": cfg.router_config().capacity(cfg.tokens),
        "expert_impl": layer.experts.resolved_impl(x),
    }
    # the unsharded layer (every expert, same seed) on this rank's tokens must give the same rows
    with torch.no_grad():
        ref = MoE(cfg.hidden, cfg.ffn_hidden, router, **kw)
        y_ref = ref(x, forced_idx_TK=forced).y_TH.float()
        del ref
    res["unsharded_max_abs_diff"] = float((out.y_TH.float() - y_ref).abs().max())
    res["output_max_abs"] = float(y_ref.abs().max())
    if cfg.naive:
        naive = ExpertParallelMoE(cfg.hidden, cfg.ffn_hidden, router, group, mode="naive", **kw)
        slow = _time_layer(naive, x, forced, cfg, group)
        res["naive_phases"] = slow["phases"]
        res["naive_bytes"] = slow["bytes"]
        res["naive_max_abs_diff"] = float((slow["out"].y_TH.float() - out.y_TH.float()).abs().max())
        del naive
    del layer
    return res


def _sweep(ctx: RankContext, cfg: MoERunConfig, group: Any) -> list[dict[str, Any]]:
    """Overflow of each workload at each capacity factor (routing only)."""
    ep_rank = comm.group_rank(group)
    policy = cfg.drop if cfg.drop != "none" else "position"
    out = []
    for salt, (name, skew) in enumerate(cfg.workloads()):
        idx = forced_experts(cfg, ep_rank, 1000 + salt, skew)
        g = torch.Generator().manual_seed(cfg.seed + ep_rank)
        weights = torch.rand(idx.shape, generator=g)  # only orders the probability policy
        for cf in cfg.sweep:
            cap = cfg.router_config(capacity_factor=cf, drop_policy=policy).capacity(cfg.tokens)
            keep = keep_mask(idx, weights, cfg.experts, cap, policy)
            counts = torch.tensor(
                [idx.numel(), int(keep.sum())], dtype=torch.int64, device=ctx.device
            )
            counts = _sum_over(group, counts).tolist()
            out.append(
                {
                    "workload": name,
                    "capacity_factor": cf,
                    "capacity": cap,
                    "routed": counts[0],
                    "kept": counts[1],
                }
            )
    return out


class RoutingStep(TrainStep):
    """One step of learned routing on clustered tokens (cluster frequencies Zipf-skewed): the
    layer's MSE against ``tanh(x A)`` plus its auxiliary loss; Adam; MaxVio and overflow after.

    The loss of the whole ep group is the mean of the ranks' losses: each rank's share reaches
    its experts' gradients through the all-to-all backward; the replicated router's gradient
    is summed over the ranks (one all-reduce); the balancing bias moves on the global load."""

    def __init__(
        self, ctx: RankContext, cfg: MoERunConfig, group: Any, dtype: torch.dtype, mode: str
    ) -> None:
        over: dict[str, Any] = {}
        if mode == "aux":
            over["aux_loss_coeff"] = cfg.aux_coeff
        if mode == "bias":
            over["bias_update_rate"] = cfg.bias_rate
        self.ctx, self.cfg, self.group, self.dtype = ctx, cfg, group, dtype
        self.ep_rank, self.n = comm.group_rank(group), comm.group_size(group)
        router = cfg.router_config(**over)
        self.layer = ExpertParallelMoE(
            cfg.hidden, cfg.ffn_hidden, router, group, seed=cfg.seed, device=ctx.device, dtype=dtype
        )
        self.params = list(self.layer.parameters())
        self.moments = [
            (torch.zeros_like(p, dtype=torch.float32), torch.zeros_like(p, dtype=torch.float32))
            for p in self.params
        ]
        clusters = 4 * cfg.experts
        dev = ctx.device
        g = torch.Generator(device=dev).manual_seed(cfg.seed + 17)  # same centres on every rank
        self.centres = torch.randn(clusters, cfg.hidden, generator=g, device=dev) * 2
        self.target_map = torch.randn(cfg.hidden, cfg.hidden, generator=g, device=dev)
        self.target_map /= cfg.hidden**0.5
        self.cluster_p = zipf_probabilities(clusters, cfg.skews[0] if cfg.skews else 1.0)
        self.out: Any = None

    def data(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, dev = self.cfg, self.ctx.device
        gc = torch.Generator().manual_seed(cfg.seed * 31 + self.ep_rank * 1009 + i)
        cid = torch.multinomial(self.cluster_p, cfg.tokens, replacement=True, generator=gc).to(dev)
        noise = torch.randn(cfg.tokens, cfg.hidden, generator=gc).to(dev)
        x = (self.centres[cid] + noise).to(self.dtype)
        return x, torch.tanh(x.float() @ self.target_map).to(self.dtype)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, target = batch
        self.out = self.layer(x)
        return F.mse_loss(self.out.y_TH.float(), target.float()) + self.out.aux_loss

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self.n).backward()
        grad = self.layer.router.gate.weight.grad
        if grad is not None and self.n > 1:
            dist.all_reduce(grad, group=self.group)

    def begin(self, i: int, *, metered: bool) -> None:
        self.step = i

    def optimizer(self) -> None:
        _adam_step(self.params, self.moments, self.step + 1, self.cfg.train_lr)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def end(self, i: int, loss: torch.Tensor) -> dict[str, Any]:
        routed = _sum_over(self.group, self.out.routed_E.clone())
        kept = _sum_over(self.group, self.out.kept_E.clone())
        self.layer.router.update_bias(routed)
        self.ctx.sync()
        return {
            "step": i,
            "loss": float(loss.detach()),
            "max_vio": load_stats(routed.tolist())["max_vio"],
            "overflow": 1 - float(kept.sum()) / max(1.0, float(routed.sum())),
        }


def learned_routing(
    ctx: RankContext, cfg: MoERunConfig, group: Any, dtype: torch.dtype, mode: str
) -> dict[str, Any]:
    """``train_steps`` steps of learned routing (``RoutingStep``) on the shared step loop, each
    step's seconds its own; and a checksum of the replicated router, the same on every rank."""
    step = RoutingStep(ctx, cfg, group, dtype, mode)
    record = run_steps(step, LoopPlan(timed=cfg.train_steps), ctx.device)
    steps = [{**r, "seconds": s} for r, s in zip(record.records, record.step_times, strict=True)]
    router = step.layer.router
    return {
        "mode": mode,
        "steps": steps,
        # the replicated router must stay identical on every rank
        "router_checksum": [
            float(router.gate.weight.detach().float().sum()),
            float(router.expert_bias.abs().sum()),
        ],
    }


@torch.no_grad()
def _adam_step(
    params: list[torch.Tensor], moments: list[tuple[torch.Tensor, torch.Tensor]], t: int, lr: float
) -> None:
    """One Adam step (betas 0.9/0.999, fp32 moments). torch.optim's first step costs each
    fresh process seconds of imports, more than the whole learned-routing workload."""
    b1, b2, eps = 0.9, 0.999, 1e-8
    for p, (m, v) in zip(params, moments, strict=True):
        if p.grad is None:
            continue
        g = p.grad.float()
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        update = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
        p.add_(update.to(p.dtype), alpha=-lr)


def moe_rank(ctx: RankContext, **config: Any) -> dict[str, Any]:
    """Everything one rank measures (see the module docstring)."""
    cfg = MoERunConfig.from_json(config)
    topo = Topology(world_size=ctx.world_size, dp=ctx.world_size, ep=cfg.ep)
    group = comm.build_ep_group(topo, ctx.rank)
    dtype = _dtype(cfg, ctx.device)
    esize = torch.empty((), dtype=dtype).element_size()
    dispatch_bytes = cfg.tokens * cfg.topk * cfg.hidden * esize
    sizes = sorted({max(1024, dispatch_bytes >> s) for s in (8, 6, 4, 2, 1, 0)})
    reference = _reference_a2a(group, ctx.device, dtype, sizes, cfg.warmup, cfg.iters)
    workloads = []
    for salt, (name, skew) in enumerate(cfg.workloads()):
        w = _workload_run(ctx, cfg, group, dtype, name, skew, salt)
        # the same-payload reference: equal splits at this workload's mean send buffer
        sent = torch.tensor(
            [float(w["bytes"].get("dispatch", 0))], dtype=torch.float64, device=ctx.device
        )
        mean_bytes = int(_sum_over(group, sent).item() / comm.group_size(group))
        w["reference_a2a"] = _reference_a2a(
            group, ctx.device, dtype, [mean_bytes], cfg.warmup, cfg.iters
        )[0]
        workloads.append(w)
    sweep = _sweep(ctx, cfg, group)
    training = (
        [learned_routing(ctx, cfg, group, dtype, mode) for mode in cfg.balance]
        if cfg.train_steps
        else []
    )
    return {
        "rank": ctx.rank,
        "ep_rank": comm.group_rank(group),
        "device": torch.cuda.get_device_name(ctx.device) if ctx.is_cuda else "cpu",
        "backend": ctx.backend,
        "dtype": "bf16" if dtype == torch.bfloat16 else "fp32",
        "reference_a2a": reference,
        "workloads": workloads,
        "sweep": sweep,
        "training": training,
    }


def _dtype(cfg: MoERunConfig, device: torch.device) -> torch.dtype:
    if cfg.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[cfg.dtype]
