"""PAR-MOE-EXPERT (T4): routing, capacity, overflow and all-to-all over expert-parallel ranks.

``run_moe_project(config, ...)`` launches ``moe_rank`` on ``config.ep`` ranks
through torchrun (NCCL on GPUs, gloo on CPU) and turns what comes back into
contract documents and a report. On every rank, in this order:

1. **reference all-to-all**: a plain ``all_to_all_single`` with equal splits
   at a few payloads (up to the dispatch payload), timed exactly as the
   layer's exchanges are, so the dispatch/combine busbw has a same-method
   reference measured in the same process;
2. **routing workloads** (``uniform``, and ``zipf:s`` for each skew): the
   experts each token goes to are drawn from a Zipf(s) law over experts
   (expert 0 hottest, so rank 0 holds the hot experts; s = 0 is uniform), the
   gate weights are the router's scores at the drawn experts, and capacity
   and dropping apply as configured. Each workload runs ``warmup`` + ``iters``
   forwards of the expert-parallel layer (all-to-all) and of the naive one
   (all-gather + reduce-scatter), every phase bracketed by a barrier and a
   device synchronisation (``PhaseTimer``): collective times are the
   collectives' own, compute times each rank's own;
3. **capacity-factor sweep**: the overflow rate of each workload at each
   factor (routing only, no exchange; counts summed with one all-reduce);
4. **learned routing**: a few training steps of the layer on clustered
   tokens (cluster frequencies Zipf-skewed), once per balancing mode
   (``none``, auxiliary loss, auxiliary-loss-free bias), recording the
   expert load's MaxVio and the overflow at every step.

What crosses the wire besides the layer's own exchanges: one barrier per
timed phase, and ``all_reduce`` of load counts (and of the router gradient
in training, since the router is replicated over the ep ranks).

busbw follows nccl-tests: an all-to-all of S bytes per rank has busbw =
S / t x (n - 1) / n. For an exchange with uneven splits S is the mean
per-rank send buffer and t the slowest rank's time.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from parlab.comm.ops import busbw_factor
from parlab.errors import UsageError
from parlab.parallel import expert_comm as comm
from parlab.parallel.expert import ExpertParallelMoE, MoELayer, MoESpec, check_ep
from parlab.parallel.router import (
    DROP_POLICIES,
    GATINGS,
    RouterConfig,
    keep_mask,
    load_stats,
    sample_experts,
    zipf_probabilities,
)
from parlab.runtime.context import RankContext

PROJECT = "PAR-MOE-EXPERT"
BALANCE_MODES = ("none", "aux", "bias")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True, kw_only=True)
class MoERunConfig:
    """One ``parlab project moe`` run."""

    ep: int
    """Expert-parallel degree (ranks)."""
    experts: int
    """E: routed experts."""
    topk: int
    """k: experts per token."""
    capacity_factor: float | None = 1.25
    """Capacity factor of the measured runs (None with drop ``none``)."""
    drop: str = "position"
    """Overflow policy: ``position``, ``probability`` or ``none`` (dropless)."""
    gating: str = "softmax"
    """``softmax`` or ``sigmoid``."""
    hidden: int = 256
    """H: model width."""
    ffn_hidden: int = 512
    """F: expert FFN width."""
    tokens: int = 2048
    """Tokens per rank per forward."""
    skews: tuple[float, ...] = (1.2,)
    """Zipf exponents of the skewed workloads (uniform always runs)."""
    hot: str = "contiguous"
    """Where the hot experts sit: ``contiguous`` (Zipf rank j is expert j: rank 0 holds the
    hottest) or ``spread`` (Zipf ranks dealt round-robin over the ep ranks)."""
    sweep: tuple[float, ...] = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
    """Capacity factors of the overflow sweep."""
    train_steps: int = 8
    """Training steps of the learned-routing workload per balancing mode (0: skip)."""
    balance: tuple[str, ...] = BALANCE_MODES
    """Balancing modes of the learned-routing workload."""
    train_lr: float = 1e-2
    """Adam learning rate of the learned-routing workload."""
    aux_coeff: float = 0.01
    """Auxiliary-loss coefficient (balance ``aux``)."""
    bias_rate: float = 0.01
    """Bias update rate (balance ``bias``)."""
    dtype: str = "auto"
    """``bf16``, ``fp32``, or ``auto`` (bf16 on GPUs, fp32 on CPU)."""
    warmup: int = 2
    """Untimed forwards per workload."""
    iters: int = 5
    """Timed forwards per workload (the median is reported)."""
    naive: bool = True
    """Also time the naive (all-gather) path."""
    seed: int = 0
    """Seed of weights, tokens and routing draws."""
    backend: str = "auto"
    """``auto``, ``nccl`` or ``gloo``."""
    timeout_s: float = 300.0
    """Process-group timeout."""

    def __post_init__(self) -> None:
        if self.ep < 1:
            raise UsageError(f"--ep {self.ep} must be at least 1")
        check_ep(self.experts, self.ep)
        if self.drop not in DROP_POLICIES:
            raise UsageError(f"--drop {self.drop!r} is not one of {', '.join(DROP_POLICIES)}")
        if self.gating not in GATINGS:
            raise UsageError(f"--gating {self.gating!r} is not one of {', '.join(GATINGS)}")
        self.router_config()  # top-k and capacity-factor checks
        for name in ("hidden", "ffn_hidden", "tokens", "iters"):
            if getattr(self, name) < 1:
                raise UsageError(
                    f"--{name.replace('_', '-')} {getattr(self, name)} must be at least 1"
                )
        if self.warmup < 0 or self.train_steps < 0:
            raise UsageError("--warmup and --train-steps must be 0 or more")
        if any(s < 0 for s in self.skews):
            raise UsageError("a Zipf exponent must be 0 or more (zipf:0 is uniform)")
        if any(not cf > 0 for cf in self.sweep):
            raise UsageError("every capacity factor of --sweep must be above 0")
        bad = [b for b in self.balance if b not in BALANCE_MODES]
        if bad:
            raise UsageError(f"--balance {bad[0]!r} is not one of {', '.join(BALANCE_MODES)}")
        if self.hot not in ("contiguous", "spread"):
            raise UsageError(f"--hot {self.hot!r} is not one of contiguous, spread")
        if self.dtype not in ("auto", *DTYPES):
            raise UsageError(f"--dtype {self.dtype!r} is not one of auto, bf16, fp32")

    def router_config(self, **over: Any) -> RouterConfig:
        kw: dict[str, Any] = {
            "num_experts": self.experts,
            "top_k": self.topk,
            "gating": self.gating,
            "capacity_factor": self.capacity_factor if self.drop != "none" else None,
            "drop_policy": self.drop,
        }
        kw.update(over)
        return RouterConfig(**kw)

    def spec(self, **over: Any) -> MoESpec:
        return MoESpec(
            hidden=self.hidden, ffn_hidden=self.ffn_hidden, router=self.router_config(**over)
        )

    def workloads(self) -> list[tuple[str, float]]:
        return [("uniform", 0.0)] + [(f"zipf:{s:g}", s) for s in self.skews]


def parse_skews(texts: list[str] | None) -> tuple[float, ...]:
    """``["zipf:1.2", "zipf:0.8,zipf:2"]`` -> (1.2, 0.8, 2.0)."""
    out: list[float] = []
    for text in texts or []:
        for part in text.split(","):
            kind, _, value = part.strip().partition(":")
            if kind != "zipf" or not value:
                raise UsageError(
                    f"--skew {part!r}: write zipf:S with S a Zipf exponent, e.g. zipf:1.2"
                )
            try:
                out.append(float(value))
            except ValueError:
                raise UsageError(f"--skew {part!r}: {value!r} is not a number") from None
    return tuple(out)


def parse_floats(text: str, what: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"{what} {text!r}: give numbers separated by commas") from None


# ---------------------------------------------------------------------------
# On every rank


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
            timer = comm.PhaseTimer(device=device, group=group)
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
        out.append(
            {
                "bytes": b,
                "seconds": t,
                "busbw": b / t * busbw_factor("all_to_all", n) if t > 0 else 0.0,
            }
        )
    return out


def _tokens(
    cfg: MoERunConfig, rank: int, salt: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(cfg.seed * 7919 + rank * 131 + salt)
    return torch.randn(cfg.tokens, cfg.hidden, generator=g, device=device, dtype=torch.float32).to(
        dtype
    )


def hot_order(experts: int, ep: int, hot: str) -> list[int]:
    """The expert that gets Zipf rank j (``contiguous``: j; ``spread``: round-robin over ranks)."""
    L = experts // ep
    if hot == "contiguous":
        return list(range(experts))
    return [(j % ep) * L + j // ep for j in range(experts)]


def _forced(cfg: MoERunConfig, rank: int, salt: int, skew: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(cfg.seed * 104_729 + rank * 7 + salt)
    probs = zipf_probabilities(cfg.experts, skew)
    idx = sample_experts(cfg.tokens, cfg.experts, cfg.topk, probs, g)
    return torch.tensor(hot_order(cfg.experts, cfg.ep, cfg.hot))[idx]


def dispatch_plans(cfg: MoERunConfig) -> dict[str, list[list[list[int]]]]:
    """Each workload's dispatch plan -- tokens each rank sends to each expert, ``[src][dst][l]``
    -- from the routing alone, on the CPU, with no process group (``parlab project moe --plan``).

    It is what the run will exchange: the same tokens, draws and router (fp32 here; a bf16
    run can break a probability-policy tie differently)."""
    from parlab.parallel.router import Router

    L = cfg.experts // cfg.ep
    out = {}
    for salt, (name, skew) in enumerate(cfg.workloads()):
        plans = []
        for r in range(cfg.ep):
            router = Router(cfg.hidden, cfg.router_config())
            router.reset(cfg.seed)
            x = _tokens(cfg, r, salt, torch.device("cpu"), torch.float32)
            with torch.no_grad():
                routing = router(x, _forced(cfg, r, salt, skew))
            counts = routing.counts(cfg.experts, kept=True).view(cfg.ep, L)
            plans.append(counts.tolist())
        out[name] = plans
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
            timer = comm.PhaseTimer(device=x.device, group=group)
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
    spec = cfg.spec()
    x = _tokens(cfg, ep_rank, salt, ctx.device, dtype)
    forced = _forced(cfg, ep_rank, salt, skew)
    layer = ExpertParallelMoE(
        spec, group, mode="a2a", seed=cfg.seed, device=ctx.device, dtype=dtype
    )
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
        ref = MoELayer(spec, seed=cfg.seed, device=ctx.device, dtype=dtype)
        y_ref = ref(x, forced_idx_TK=forced).y_TH.float()
        del ref
    res["unsharded_max_abs_diff"] = float((out.y_TH.float() - y_ref).abs().max())
    res["output_max_abs"] = float(y_ref.abs().max())
    if cfg.naive:
        naive = ExpertParallelMoE(
            spec, group, mode="naive", seed=cfg.seed, device=ctx.device, dtype=dtype
        )
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
        idx = _forced(cfg, ep_rank, 1000 + salt, skew)
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


def _train(
    ctx: RankContext, cfg: MoERunConfig, group: Any, dtype: torch.dtype, mode: str
) -> dict[str, Any]:
    """A few steps of learned routing on clustered tokens; MaxVio and overflow per step."""
    ep_rank = comm.group_rank(group)
    over: dict[str, Any] = {}
    if mode == "aux":
        over["aux_loss_coeff"] = cfg.aux_coeff
    if mode == "bias":
        over["bias_update_rate"] = cfg.bias_rate
    layer = ExpertParallelMoE(
        cfg.spec(**over), group, seed=cfg.seed, device=ctx.device, dtype=dtype
    )
    params = list(layer.parameters())
    moments = [
        (torch.zeros_like(p, dtype=torch.float32), torch.zeros_like(p, dtype=torch.float32))
        for p in params
    ]
    clusters = 4 * cfg.experts
    g = torch.Generator(device=ctx.device).manual_seed(cfg.seed + 17)  # same centres on every rank
    centres = torch.randn(clusters, cfg.hidden, generator=g, device=ctx.device) * 2
    target_map = (
        torch.randn(cfg.hidden, cfg.hidden, generator=g, device=ctx.device) / cfg.hidden**0.5
    )
    skew = cfg.skews[0] if cfg.skews else 1.0
    pc = zipf_probabilities(clusters, skew)
    steps = []
    for step in range(cfg.train_steps):
        gc = torch.Generator().manual_seed(cfg.seed * 31 + ep_rank * 1009 + step)
        cid = torch.multinomial(pc, cfg.tokens, replacement=True, generator=gc).to(ctx.device)
        noise = torch.randn(cfg.tokens, cfg.hidden, generator=gc).to(ctx.device)
        x = (centres[cid] + noise).to(dtype)
        target = torch.tanh(x.float() @ target_map).to(dtype)
        t0 = time.perf_counter()
        out = layer(x)
        loss = torch.nn.functional.mse_loss(out.y_TH.float(), target.float()) + out.aux_loss
        for p in params:
            p.grad = None
        # the loss of the whole ep group is the mean of the ranks' losses: each rank's share
        # reaches its experts' gradients through the all-to-all backward; the replicated
        # router's gradient is summed over the ranks
        (loss / comm.group_size(group)).backward()
        grad = layer.router.gate.weight.grad
        if grad is not None and comm.group_size(group) > 1:
            dist.all_reduce(grad, group=group)
        _adam_step(params, moments, step + 1, cfg.train_lr)
        routed = _sum_over(group, out.routed_E.clone())
        kept = _sum_over(group, out.kept_E.clone())
        layer.router.update_bias(routed)
        ctx.sync()
        steps.append(
            {
                "step": step,
                "loss": float(loss.detach()),
                "max_vio": load_stats(routed.tolist())["max_vio"],
                "overflow": 1 - float(kept.sum()) / max(1.0, float(routed.sum())),
                "seconds": time.perf_counter() - t0,
            }
        )
    router = layer.router
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
    cfg = MoERunConfig(**_from_json(config))
    from parlab.topology import Topology

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
        [_train(ctx, cfg, group, dtype, mode) for mode in cfg.balance] if cfg.train_steps else []
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


def _to_json(cfg: MoERunConfig) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()}


def _from_json(d: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


# ---------------------------------------------------------------------------
# On the host: documents


@dataclass
class MoEOutcome:
    """What a run wrote."""

    documents: list[Any] = field(default_factory=list)
    """The contract documents, in the order written."""
    paths: list[Path] = field(default_factory=list)
    """Where they were written."""
    report: Path | None = None
    """The Markdown report."""
    ok: bool = True
    """False when the ranks failed (a failure document was written)."""


def _evidence(backend: str, training: bool = False) -> str:
    if backend != "nccl":
        return "cpu-mechanism"
    return "real-training" if training else "real-nccl"


def _busbw(nbytes: float, seconds: float, n: int) -> float | None:
    """nccl-tests busbw of an all-to-all in GB/s; None where it does not apply (one rank)."""
    if n < 2 or seconds <= 0:
        return None
    return nbytes / seconds * busbw_factor("all_to_all", n) / 1e9


def _per_rank(ranks: list[dict[str, Any]], i: int, key: str, phase: str) -> list[float]:
    return [float(r["workloads"][i][key].get(phase, 0.0)) for r in ranks]


def workload_document(
    cfg: MoERunConfig,
    ranks: list[dict[str, Any]],
    i: int,
    *,
    tag: str,
    command: str,
    environment: dict[str, Any],
    calibration: dict[str, Any] | None = None,
) -> Any:
    """The document of workload ``i`` (uniform or zipf:s) from every rank's results."""
    from parlab.contract import Document, Metric, Prediction, now_iso

    n = len(ranks)
    w0 = ranks[0]["workloads"][i]
    name = w0["name"]
    routed, kept = w0["routed_E"], w0["kept_E"]
    rows = [float(r["workloads"][i]["rows_computed"] or 0) for r in ranks]
    d_bytes = _per_rank(ranks, i, "bytes", "dispatch")
    c_bytes = _per_rank(ranks, i, "bytes", "combine")
    d_time = _per_rank(ranks, i, "phases", "dispatch")
    c_time = _per_rank(ranks, i, "phases", "combine")
    comp = _per_rank(ranks, i, "phases", "experts")
    phases = list(w0["phases"])
    phase_max = {p: max(_per_rank(ranks, i, "phases", p)) for p in phases}
    total_routed, total_kept = sum(routed), sum(kept)
    e_stats, r_stats = load_stats(routed), load_stats(rows)
    mean_comp = statistics.fmean(comp)
    slowest = max(range(n), key=lambda r: comp[r])
    d_mean, c_mean = statistics.fmean(d_bytes), statistics.fmean(c_bytes)
    ref = w0["reference_a2a"]
    a2a_bw = _busbw(d_mean + c_mean, max(d_time) + max(c_time), n)
    ref_bw = _busbw(ref["bytes"], ref["seconds"], n)
    m: dict[str, Metric] = {
        "tokens": Metric(value=cfg.tokens * n, unit="count"),
        "tokens_routed": Metric(value=total_routed, unit="count"),
        "effective_tokens": Metric(value=total_kept, unit="count"),
        "unsharded_max_abs_diff": Metric(
            value=max(float(r["workloads"][i]["unsharded_max_abs_diff"]) for r in ranks), unit="abs"
        ),
        "output_max_abs": Metric(
            value=max(float(r["workloads"][i]["output_max_abs"]) for r in ranks), unit="abs"
        ),
        "unserved_tokens": Metric(
            value=sum(r["workloads"][i]["unserved_tokens"] for r in ranks),
            unit="count",
            per_rank=[r["workloads"][i]["unserved_tokens"] for r in ranks],
        ),
        "overflow_rate": Metric(
            value=1 - total_kept / total_routed if total_routed else 0.0, unit="fraction"
        ),
        "capacity": Metric(value=w0["capacity"], unit="count"),
        "expert_load_max_over_mean": Metric(value=e_stats["max_over_mean"], unit="ratio"),
        "expert_load_max_vio": Metric(value=e_stats["max_vio"], unit="ratio"),
        "rank_load_max_over_mean": Metric(
            value=r_stats["max_over_mean"], unit="ratio", per_rank=rows
        ),
        "rank_load_max_vio": Metric(value=r_stats["max_vio"], unit="ratio", per_rank=rows),
        "dispatch_bytes": Metric(value=d_mean, unit="B", per_rank=d_bytes),
        "dispatch_time": Metric(value=max(d_time), unit="s", per_rank=d_time),
        "dispatch_busbw": Metric(value=_busbw(d_mean, max(d_time), n), unit="GB/s"),
        "combine_bytes": Metric(value=c_mean, unit="B", per_rank=c_bytes),
        "combine_time": Metric(value=max(c_time), unit="s", per_rank=c_time),
        "combine_busbw": Metric(value=_busbw(c_mean, max(c_time), n), unit="GB/s"),
        "a2a_busbw": Metric(value=a2a_bw, unit="GB/s"),
        "reference_a2a_bytes": Metric(value=ref["bytes"], unit="B"),
        "reference_a2a_time": Metric(value=ref["seconds"], unit="s"),
        "reference_a2a_busbw": Metric(value=ref_bw, unit="GB/s"),
        "a2a_busbw_vs_reference": Metric(
            value=100 * a2a_bw / ref_bw if a2a_bw and ref_bw else None, unit="%"
        ),
        "expert_compute_time": Metric(value=max(comp), unit="s", per_rank=comp),
        "slowest_rank": Metric(value=slowest, unit="rank"),
        "slowest_rank_excess": Metric(
            value=100 * (max(comp) - mean_comp) / mean_comp if mean_comp > 0 else 0.0, unit="%"
        ),
        "layer_time": Metric(value=sum(phase_max.values()), unit="s"),
    }
    for p in ("route", "permute", "plan", "regroup", "ungroup", "unpermute"):
        if p in phase_max:
            m[f"{p}_time"] = Metric(value=phase_max[p], unit="s")
    notes = [
        "tokens_routed and effective_tokens count token-expert assignments (tokens x k) before and "
        "after capacity; unserved_tokens are tokens that lost all k (only the residual carries them)",
        "times are medians over the timed forwards; each phase starts after a barrier and a device "
        "synchronisation, so a collective's time excludes waiting for a late peer and nothing overlaps",
        "busbw = S / t x (n-1)/n (nccl-tests all-to-all): S the mean per-rank send buffer, "
        "t the slowest rank's time; dispatch + combine: both buffers over both times",
        "reference all-to-all: a plain all_to_all_single with equal splits at the dispatch's mean "
        "payload, measured in the same run with the same timing",
        "unsharded_max_abs_diff: largest difference between the expert-parallel output and the "
        "unsharded layer (every expert on one device, same weights) on the same tokens",
        "layer_time: the sum over phases of the slowest rank's time (phases separated by barriers)",
    ]
    if n == 1:
        notes.append("one rank: the exchanges are local copies, so busbw does not apply (unknown)")
    if "naive_phases" in w0:
        nv = {
            p: max(float(r["workloads"][i]["naive_phases"][p]) for r in ranks)
            for p in w0["naive_phases"]
        }
        m["naive_layer_time"] = Metric(value=sum(nv.values()), unit="s")
        m["naive_gather_time"] = Metric(value=nv.get("gather"), unit="s")
        m["naive_scatter_time"] = Metric(value=nv.get("scatter"), unit="s")
        m["naive_gather_bytes"] = Metric(value=float(w0["naive_bytes"].get("gather", 0)), unit="B")
        m["naive_scatter_bytes"] = Metric(
            value=float(w0["naive_bytes"].get("scatter", 0)), unit="B"
        )
        m["naive_max_abs_diff"] = Metric(
            value=max(float(r["workloads"][i]["naive_max_abs_diff"]) for r in ranks), unit="abs"
        )
        if m["layer_time"].value:
            m["naive_over_a2a_time"] = Metric(
                value=sum(nv.values()) / m["layer_time"].value, unit="ratio"
            )
    predictions = {}
    ledger = ledger_dispatch_bytes(cfg, ranks[0]["dtype"])
    if ledger is not None:
        predictions["dispatch_bytes"] = Prediction(
            value=ledger, unit="B", model="ledger.traffic (dropless, all-to-all@ep forward)"
        )
    cal_workload = None
    if calibration and n > 1 and calibration.get("fit_predict") is not None:
        predict = calibration["fit_predict"]
        t_fit = predict(d_mean)
        if t_fit:
            predictions["dispatch_time_alpha_beta"] = Prediction(
                value=t_fit, unit="s", model=calibration["fit_label"]
            )
        curve = ranks[0]["reference_a2a"]
        cal_workload = {
            "fit_run_id": calibration["fit_run_id"],
            "fit_label": calibration["fit_label"],
            "fit_curve": [[c["bytes"], predict(c["bytes"])] for c in curve],
        }
    if calibration and n > 1 and calibration.get("points"):
        bw = calibration_busbw(calibration, d_mean)
        cal_workload = {
            **(cal_workload or {}),
            "run_id": calibration["run_id"],
            "points": calibration["points"],
        }
        if bw:
            m["calibration_a2a_busbw"] = Metric(value=bw / 1e9, unit="GB/s")
            m["a2a_busbw_vs_calibration"] = Metric(
                value=100 * a2a_bw / (bw / 1e9) if a2a_bw else None, unit="%"
            )
            predictions["dispatch_time"] = Prediction(
                value=d_mean * busbw_factor("all_to_all", n) / bw,
                unit="s",
                model=f"collectives-sweep:{calibration['run_id']}",
            )
            predictions["dispatch_busbw"] = Prediction(
                value=bw / 1e9, unit="GB/s", model=f"collectives-sweep:{calibration['run_id']}"
            )
    return Document(
        run_id=f"{tag}-{name.replace(':', '')}",
        created=now_iso(),
        project=PROJECT,
        task="T4",
        role="baseline" if name == "uniform" else "candidate",
        evidence_level=_evidence(ranks[0]["backend"]),
        command=command,
        environment=environment,
        workload={
            "kind": "uniform" if name == "uniform" else "zipf",
            "name": name,
            "zipf_s": w0["skew"],
            "routing": "expert choices drawn from Zipf(s) over experts; gate weights are the "
            "router's scores at the drawn experts",
            "hot_experts": cfg.hot,
            "zipf_rank_to_expert": hot_order(cfg.experts, cfg.ep, cfg.hot),
            "tokens_per_rank": cfg.tokens,
            "hidden": cfg.hidden,
            "ffn_hidden": cfg.ffn_hidden,
            "dtype": ranks[0]["dtype"],
            "warmup": cfg.warmup,
            "iters": cfg.iters,
            "per_expert_routed": routed,
            "per_expert_kept": kept,
            "dispatch_plan": [r["workloads"][i]["send_counts"] for r in ranks],
            "expert_impl": w0.get("expert_impl"),
            "phases": {p: _per_rank(ranks, i, "phases", p) for p in phases},
            "reference_a2a_curve": ranks[0]["reference_a2a"],
            "calibration_a2a": cal_workload,
        },
        layout=_layout(cfg, n, ranks[0]["backend"]),
        metrics=m,
        predictions=predictions,
        notes=notes,
    )


def ledger_dispatch_bytes(cfg: MoERunConfig, dtype: str) -> int | None:
    """The analytic ledger's all-to-all payload per rank for this layer (None if unavailable)."""
    try:
        from parlab.ledger.traffic import traffic
        from parlab.models import MoESpec as ModelMoESpec
        from parlab.models.spec import ModelSpec
        from parlab.topology import Topology

        spec = ModelSpec(
            name="moe-layer", vocab_size=8, hidden=cfg.hidden, layers=1, heads=1,
            ffn_hidden=cfg.ffn_hidden, max_seq_len=cfg.tokens,
            moe=ModelMoESpec(num_experts=cfg.experts, top_k=cfg.topk, expert_ffn_hidden=cfg.ffn_hidden),
        )  # fmt: skip
        topo = Topology(world_size=cfg.ep, dp=cfg.ep, ep=cfg.ep)
        policy = "bf16-mixed" if dtype == "bf16" else "fp32"
        items = traffic(spec, topo, "ddp", micro_batch=1, seq_len=cfg.tokens, dtype=policy)
    except (ImportError, ValueError, TypeError, AttributeError):
        return None
    for it in items:
        if it.collective == "all-to-all" and it.axis == "ep" and it.phase == "forward":
            return it.payload_bytes
    return None


def _layout(cfg: MoERunConfig, n: int, backend: str) -> dict[str, Any]:
    L = cfg.experts // cfg.ep
    return {
        "world_size": n,
        "mesh": {"ep": cfg.ep},
        "strategy": "expert-parallel (all_to_all dispatch/combine)",
        "backend": backend,
        "experts": cfg.experts,
        "top_k": cfg.topk,
        "gating": cfg.gating,
        "capacity_factor": cfg.capacity_factor if cfg.drop != "none" else None,
        "drop_policy": cfg.drop,
        "experts_per_rank": L,
        "expert_placement": [list(range(r * L, (r + 1) * L)) for r in range(cfg.ep)],
    }


def sweep_document(
    cfg: MoERunConfig,
    ranks: list[dict[str, Any]],
    *,
    tag: str,
    command: str,
    environment: dict[str, Any],
) -> Any:
    from parlab.contract import Document, Metric, now_iso

    rows = ranks[0]["sweep"]
    for r in rows:
        r["overflow_rate"] = 1 - r["kept"] / r["routed"] if r["routed"] else 0.0
    m: dict[str, Metric] = {}
    for name, _ in cfg.workloads():
        mine = [r for r in rows if r["workload"] == name]
        clean = [r["capacity_factor"] for r in mine if r["kept"] == r["routed"]]
        key = name.replace(":", "")
        m[f"min_dropless_capacity_factor_{key}"] = Metric(
            value=min(clean) if clean else None, unit="factor"
        )
        for r in mine:
            m[f"overflow_rate_{key}_cf{r['capacity_factor']:g}"] = Metric(
                value=r["overflow_rate"], unit="fraction"
            )
    policy = cfg.drop if cfg.drop != "none" else "position"
    return Document(
        run_id=f"{tag}-capacity-sweep",
        created=now_iso(),
        project=PROJECT,
        task="T4",
        role="baseline",
        evidence_level=_evidence(ranks[0]["backend"]),
        command=command,
        environment=environment,
        workload={
            "kind": "capacity-factor sweep",
            "tokens_per_rank": cfg.tokens,
            "drop_policy": policy,
            "sweep": rows,
        },
        layout=_layout(cfg, len(ranks), ranks[0]["backend"]),
        metrics=m,
        notes=[
            "overflow = 1 - kept / routed assignments, capacity counted per rank's tokens; routing only "
            "(the same draws as the workloads' law, no exchange); 'min_dropless' is the smallest swept "
            "factor with no drop (unknown if none)"
        ],
    )


def training_document(
    cfg: MoERunConfig,
    ranks: list[dict[str, Any]],
    *,
    tag: str,
    command: str,
    environment: dict[str, Any],
) -> Any:
    from parlab.contract import Document, Metric, now_iso

    runs = ranks[0]["training"]
    m: dict[str, Metric] = {}
    for j, run in enumerate(runs):
        st = run["steps"]
        mode = run["mode"]
        m[f"max_vio_first_{mode}"] = Metric(value=st[0]["max_vio"], unit="ratio")
        m[f"max_vio_last_{mode}"] = Metric(value=st[-1]["max_vio"], unit="ratio")
        m[f"overflow_rate_last_{mode}"] = Metric(value=st[-1]["overflow"], unit="fraction")
        m[f"loss_last_{mode}"] = Metric(value=st[-1]["loss"], unit="mse")
        slow = [max(r["training"][j]["steps"][k]["seconds"] for r in ranks) for k in range(len(st))]
        m[f"step_time_{mode}"] = Metric(value=statistics.median(slow[1:] or slow), unit="s")
    return Document(
        run_id=f"{tag}-learned-routing",
        created=now_iso(),
        project=PROJECT,
        task="T4",
        role="candidate",
        evidence_level=_evidence(ranks[0]["backend"], training=True),
        command=command,
        environment=environment,
        workload={
            "kind": "learned routing",
            "data": f"tokens from {4 * cfg.experts} Gaussian clusters, cluster frequencies "
            f"Zipf({cfg.skews[0] if cfg.skews else 1.0:g}); target tanh(x A)",
            "tokens_per_rank": cfg.tokens,
            "steps": cfg.train_steps,
            "optimizer": f"Adam lr {cfg.train_lr:g} on the mean loss of the ep ranks (the "
            "replicated router's gradient summed over them)",
            "aux_coeff": cfg.aux_coeff,
            "bias_rate": cfg.bias_rate,
            "per_step": {run["mode"]: run["steps"] for run in runs},
        },
        layout=_layout(cfg, len(ranks), ranks[0]["backend"]),
        metrics=m,
        notes=["MaxVio = (max - mean) / mean of the tokens routed to each expert, over all ranks"],
    )


def failure_document(
    cfg: MoERunConfig, failure: Any, *, command: str, environment: dict[str, Any], backend: str
) -> Any:
    from parlab.contract import Document, new_run_id, now_iso

    return Document(
        run_id=new_run_id(f"moe-ep{cfg.ep}-failed"),
        created=now_iso(),
        project=PROJECT,
        task="T4",
        role="failure",
        evidence_level=_evidence(backend),
        command=command,
        environment=environment,
        workload={
            "tokens_per_rank": cfg.tokens,
            "hidden": cfg.hidden,
            "ffn_hidden": cfg.ffn_hidden,
        },
        layout=_layout(cfg, cfg.ep, backend),
        metrics={},
        status="failed",
        failure=failure,
    )


# ---------------------------------------------------------------------------
# The collective calibration (a ``parlab collectives`` document)


def _walk(obj: Any) -> Any:
    if isinstance(obj, dict):
        yield obj
        for v in obj.values():
            yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)


def calibration_points(
    data: dict[str, Any], group_size: int | None = None
) -> list[tuple[float, float]]:
    """(bytes, busbw B/s) of the all_to_all records in a collectives document, by size."""
    pts = []
    for rec in _walk(data):
        if rec.get("op") not in ("all_to_all", "alltoall"):
            continue
        size = rec.get("size", rec.get("bytes"))
        bw = rec.get("busbw")
        if not isinstance(size, (int, float)) or not isinstance(bw, (int, float)) or size <= 0:
            continue
        if group_size is not None and rec.get("group_size") not in (None, group_size):
            continue
        pts.append((float(size), float(bw)))
    return sorted(set(pts))


def _fit(path: Path, group_size: int) -> dict[str, Any] | None:
    """The all_to_all alpha-beta fit of a ``parlab collectives --fit`` document, if it has one."""
    try:
        from parlab.comm.calibration import load_calibration
    except ImportError:
        return None
    cal = load_calibration(path)
    if "all_to_all" not in cal.ops or cal.group_size != group_size:
        return None
    return {
        "fit_run_id": cal.run_id,
        "fit_label": cal.label,
        "fit_predict": lambda nbytes: cal.predict("all_to_all", nbytes, group_size),
    }


def find_calibration(
    results: Path, path: Path | None, group_size: int, backend: str
) -> dict[str, Any] | None:
    """What ``parlab collectives`` measured for all_to_all over ``group_size`` ranks.

    ``run_id``/``points``: a sweep's measured (bytes, busbw) -- the reference of the 85%
    target; ``fit_*``: a calibration's alpha-beta fit (a prediction of the dispatch time).
    ``path`` may be either kind; without it, the newest of each kind in ``results`` whose
    evidence level matches this run's backend. None when there is neither.
    """
    import json

    from parlab.contract import read_document

    out: dict[str, Any] = {}
    if path is not None:
        doc = read_document(path)
        if doc.workload.get("kind") == "collectives-calibration":
            out.update(_fit(path, group_size) or {})
        else:
            pts = calibration_points(doc.to_json(), group_size)
            if pts:
                out.update(run_id=doc.run_id, points=pts, evidence_level=doc.evidence_level)
        if not out:
            raise UsageError(
                f"{path} holds no all_to_all measurement or fit over {group_size} ranks"
            )
        return out
    folder = results / "PAR-COLLECTIVES"
    if not folder.is_dir():
        return None
    want = "real-nccl" if backend == "nccl" else "cpu-mechanism"
    for p in sorted(folder.glob("*.json"), key=lambda q: q.stat().st_mtime, reverse=True):
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if data.get("evidence_level") != want or not isinstance(data.get("workload"), dict):
            continue
        if data["workload"].get("kind") == "collectives-calibration":
            if "fit_run_id" not in out:
                try:
                    out.update(_fit(p, group_size) or {})
                except ValueError:
                    continue
        elif "run_id" not in out:
            pts = calibration_points(data, group_size)
            if pts:
                out.update(run_id=data.get("run_id", p.stem), points=pts, evidence_level=want)
    return out or None


def calibration_busbw(cal: dict[str, Any], nbytes: float) -> float | None:
    """busbw (B/s) at ``nbytes``: log-linear interpolation between the calibration's sizes."""
    pts = cal["points"]
    if not pts or nbytes <= 0:
        return None
    if nbytes <= pts[0][0]:
        return pts[0][1]
    if nbytes >= pts[-1][0]:
        return pts[-1][1]
    for (s0, b0), (s1, b1) in itertools.pairwise(pts):
        if s0 <= nbytes <= s1:
            f = (math.log(nbytes) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return b0 + f * (b1 - b0)
    return None


# ---------------------------------------------------------------------------
# The report (from the documents alone)


def _fmt(v: float | None, unit: str = "") -> str:
    from parlab.units import format_bytes, format_seconds

    if v is None:
        return "unknown"
    if unit == "s":
        return format_seconds(v)
    if unit == "B":
        return format_bytes(v)
    if unit == "%":
        return f"{v:.1f}%"
    if unit == "GB/s":
        return f"{v:.1f} GB/s"
    if unit == "fraction":
        return f"{100 * v:.2f}%"
    return f"{v:.3g}"


def _m(doc: Any, name: str) -> tuple[float | None, str]:
    met = doc.metrics.get(name)
    return (None, "") if met is None else (met.value, met.unit)


def _cell(doc: Any, name: str) -> str:
    v, u = _m(doc, name)
    return _fmt(v, u)


def render_report(docs: list[Any], folder: Path, stem: str) -> dict[str, str]:
    """Write ``<stem>-report.md`` and its PNGs into ``folder``; return artifact name -> file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    loads = [d for d in docs if d.workload.get("kind") in ("uniform", "zipf")]
    sweep = next((d for d in docs if d.workload.get("kind") == "capacity-factor sweep"), None)
    train = next((d for d in docs if d.workload.get("kind") == "learned routing"), None)
    art: dict[str, str] = {}
    first = docs[0]
    lay = first.layout
    n = lay["world_size"]

    if loads:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
        width = 0.8 / len(loads)
        for j, d in enumerate(loads):
            routed = d.workload["per_expert_routed"]
            off = (j - (len(loads) - 1) / 2) * width
            ax1.bar([e + off for e in range(len(routed))], routed, width, label=d.workload["name"])
            comp = d.metrics["expert_compute_time"].per_rank or []
            rows = d.metrics["rank_load_max_over_mean"].per_rank or []
            ax2.bar([r + off for r in range(len(rows))], rows, width, label=d.workload["name"])
            for r, (h, t) in enumerate(zip(rows, comp, strict=False)):
                ax2.annotate(_fmt(t, "s"), (r + off, h), ha="center", va="bottom", fontsize=7)
        ax2.set_xticks(range(n))
        ax1.set(title="assignments routed per expert", xlabel="expert", ylabel="token assignments")
        ax2.set(
            title="rows computed per rank (label: expert compute time)",
            xlabel="rank",
            ylabel="rows",
        )
        ax1.legend()
        ax2.legend()
        fig.tight_layout()
        art["load_png"] = f"{stem}-load.png"
        fig.savefig(folder / art["load_png"], dpi=110)
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(7, 4.5))
        curve = loads[0].workload.get("reference_a2a_curve") or []
        if curve:
            ax.loglog([c["bytes"] for c in curve], [c["seconds"] for c in curve], "o-", color="gray",
                      label="all_to_all_single, equal splits (this run)")  # fmt: skip
        cal = loads[0].workload.get("calibration_a2a")
        if cal and cal.get("points") and n > 1:
            pts = cal["points"]
            ax.loglog([p[0] for p in pts], [p[0] * busbw_factor("all_to_all", n) / p[1] for p in pts], "s--",
                      color="black", markersize=4, label=f"parlab collectives {cal['run_id']}")  # fmt: skip
        if cal and cal.get("fit_curve") and n > 1:
            fc = [c for c in cal["fit_curve"] if c[1]]
            ax.loglog([c[0] for c in fc], [c[1] for c in fc], ":", color="black",
                      label=f"{cal['fit_label']}")  # fmt: skip
        cal_pred = [d.predictions.get("dispatch_time") for d in loads]
        for d in loads:
            for phase, marker in (("dispatch", "^"), ("combine", "v")):
                b, t = _m(d, f"{phase}_bytes")[0], _m(d, f"{phase}_time")[0]
                if b and t:
                    ax.loglog([b], [t], marker, markersize=9, label=f"{phase} {d.workload['name']}")
        for d, p in zip(loads, cal_pred, strict=True):
            if p is not None and p.value:
                ax.loglog([_m(d, "dispatch_bytes")[0]], [p.value], "x", markersize=10,
                          label=f"{p.model} at this payload, {d.workload['name']}")  # fmt: skip
        ax.set(title="all-to-all time against payload", xlabel="bytes per rank", ylabel="seconds")
        ax.legend(fontsize=7)
        fig.tight_layout()
        art["a2a_png"] = f"{stem}-a2a.png"
        fig.savefig(folder / art["a2a_png"], dpi=110)
        plt.close(fig)

    if sweep is not None:
        fig, ax = plt.subplots(figsize=(7, 4))
        rows = sweep.workload["sweep"]
        for name in dict.fromkeys(r["workload"] for r in rows):
            mine = [r for r in rows if r["workload"] == name]
            ax.plot(
                [r["capacity_factor"] for r in mine],
                [100 * r["overflow_rate"] for r in mine],
                "o-",
                label=name,
            )
        ax.set(title=f"overflow against capacity factor ({sweep.workload['drop_policy']})",
               xlabel="capacity factor", ylabel="dropped assignments (%)")  # fmt: skip
        ax.legend()
        fig.tight_layout()
        art["overflow_png"] = f"{stem}-overflow.png"
        fig.savefig(folder / art["overflow_png"], dpi=110)
        plt.close(fig)

    if train is not None:
        fig, ax = plt.subplots(figsize=(7, 4))
        for mode, steps in train.workload["per_step"].items():
            ax.plot([s["step"] for s in steps], [s["max_vio"] for s in steps], "o-", label=mode)
        ax.set(title="learned routing: expert-load MaxVio per step", xlabel="step", ylabel="MaxVio")
        ax.legend()
        fig.tight_layout()
        art["training_png"] = f"{stem}-training.png"
        fig.savefig(folder / art["training_png"], dpi=110)
        plt.close(fig)

    art["report"] = f"{stem}-report.md"
    (folder / art["report"]).write_text(_markdown(docs, loads, sweep, train, art, n, lay))
    return art


def _verdict(d: Any) -> str:
    parts = []
    for key, what in (("a2a_busbw_vs_reference", "plain a2a in this run"),
                      ("a2a_busbw_vs_calibration", "parlab collectives")):  # fmt: skip
        v = _m(d, key)[0]
        if v is not None:
            verdict = "met" if v >= 85 else "not met"
            if d.evidence_level == "cpu-mechanism":
                verdict = "gloo CPU ranks: no speed claim"
            parts.append(f"{v:.0f}% of {what} ({verdict})")
    name = d.workload["name"]
    return f"{name}: " + (", ".join(parts) if parts else "no reference (one rank)")


def _markdown(
    docs: list[Any],
    loads: list[Any],
    sweep: Any,
    train: Any,
    art: dict[str, str],
    n: int,
    lay: dict,
) -> str:
    first = docs[0]
    sw = first.environment.get("software", {})
    gpus = first.environment.get("hardware", {}).get("gpus", [])
    device = f"{len(gpus)} x {gpus[0]['name']}" if gpus else "CPU"
    wl = loads[0].workload if loads else {}
    out = [
        f"# MoE expert parallelism: ep {n}, {lay['experts']} experts, top-{lay['top_k']}",
        "",
        f"- evidence: **{', '.join(sorted({d.evidence_level for d in docs}))}** on {device} "
        f"({lay['backend']}; torch {sw.get('torch')}, CUDA {sw.get('cuda') or '-'}, NCCL {sw.get('nccl') or '-'})",
        f"- layer: hidden {wl.get('hidden')}, expert FFN {wl.get('ffn_hidden')}, {lay['gating']} gating, "
        f"capacity factor {lay['capacity_factor']}, drop {lay['drop_policy']}, {wl.get('dtype')}, "
        f"{wl.get('tokens_per_rank')} tokens per rank; experts per rank {lay['expert_placement']}, "
        f"hot experts {wl.get('hot_experts')}; "
        f"expert FFNs run as {wl.get('expert_impl')}",
        f"- command: `{first.command}`",
        "- documents: " + ", ".join(f"`{d.run_id}`" for d in docs),
        "",
    ]
    if loads:
        out += [
            "## Routing workloads",
            "",
            "| workload | overflow | expert max/mean | expert MaxVio | rank max/mean | dispatch | combine "
            "| a2a busbw | vs plain a2a | vs calibration | expert compute (max) | slowest rank | layer "
            "| naive layer |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for d in loads:
            slow = int(d.metrics["slowest_rank"].value or 0)
            out.append(
                f"| {d.workload['name']} | {_cell(d, 'overflow_rate')} | {_cell(d, 'expert_load_max_over_mean')} "
                f"| {_cell(d, 'expert_load_max_vio')} | {_cell(d, 'rank_load_max_over_mean')} "
                f"| {_cell(d, 'dispatch_bytes')} in {_cell(d, 'dispatch_time')} "
                f"| {_cell(d, 'combine_bytes')} in {_cell(d, 'combine_time')} | {_cell(d, 'a2a_busbw')} "
                f"| {_cell(d, 'a2a_busbw_vs_reference')} of {_cell(d, 'reference_a2a_busbw')} "
                f"| {_cell(d, 'a2a_busbw_vs_calibration')} of {_cell(d, 'calibration_a2a_busbw')} "
                f"| {_cell(d, 'expert_compute_time')} | rank {slow} (+{_cell(d, 'slowest_rank_excess')} over mean) "
                f"| {_cell(d, 'layer_time')} | {_cell(d, 'naive_layer_time')} |"
            )
        out += ["", "Correctness on these devices (outputs, largest absolute difference): " + "; ".join(
            f"{d.workload['name']}: expert-parallel vs unsharded layer {_cell(d, 'unsharded_max_abs_diff')}, "
            f"naive vs expert-parallel {_cell(d, 'naive_max_abs_diff')} (largest |y| "
            f"{_cell(d, 'output_max_abs')})" for d in loads) + "."]  # fmt: skip
        out += ["", "Target (issue 7): dispatch + combine busbw at least 85% of the all_to_all busbw at the "
                "same payload. " + "; ".join(_verdict(d) for d in loads) + "."]  # fmt: skip
        out += ["", "### How skew moves the slowest rank", "", "| workload | " + " | ".join(
            f"rank {r} rows / compute" for r in range(n)) + " |", "|---|" + "---|" * n]  # fmt: skip
        for d in loads:
            rows = d.metrics["rank_load_max_over_mean"].per_rank or []
            comp = d.metrics["expert_compute_time"].per_rank or []
            cells = [f"{int(r or 0)} / {_fmt(t, 's')}" for r, t in zip(rows, comp, strict=False)]
            out.append(f"| {d.workload['name']} | " + " | ".join(cells) + " |")
        for d in loads:
            plan = d.workload.get("dispatch_plan") or []
            if plan and all(p is not None for p in plan):
                out += ["", f"### Dispatch plan, {d.workload['name']} (tokens sent, source rank x expert)", "",
                        "```", comm.format_plan(plan), "```"]  # fmt: skip
            preds = d.predictions
            if "dispatch_bytes" in preds:
                p = preds["dispatch_bytes"]
                out += ["", f"Analytic ({p.model}) dispatch payload {_fmt(p.value, 'B')} per rank; "
                        f"measured {_cell(d, 'dispatch_bytes')} (mean; less where capacity dropped)."]  # fmt: skip
            if "dispatch_time_alpha_beta" in preds:
                p = preds["dispatch_time_alpha_beta"]
                out += ["", f"Alpha-beta fit ({p.model}) predicted dispatch {_fmt(p.value, 's')} for "
                        f"{d.workload['name']}; measured {_cell(d, 'dispatch_time')}."]  # fmt: skip
            if "dispatch_time" in preds:
                p = preds["dispatch_time"]
                out += ["", f"The measured all_to_all busbw of {p.model} at this payload implies "
                        f"dispatch {_fmt(p.value, 's')} for {d.workload['name']}; measured "
                        f"{_cell(d, 'dispatch_time')}."]  # fmt: skip
    if sweep is not None:
        rows = sweep.workload["sweep"]
        cfs = list(dict.fromkeys(r["capacity_factor"] for r in rows))
        out += ["", f"## Overflow against capacity factor (drop by {sweep.workload['drop_policy']})", "",
                "| workload | " + " | ".join(f"cf {c:g}" for c in cfs) + " |", "|---|" + "---|" * len(cfs)]  # fmt: skip
        for name in dict.fromkeys(r["workload"] for r in rows):
            cells = [f"{100 * r['overflow_rate']:.2f}%" for r in rows if r["workload"] == name]
            out.append(f"| {name} | " + " | ".join(cells) + " |")
    if train is not None:
        out += ["", "## Learned routing (a few training steps)", "", f"Data: {train.workload['data']}.", "",
                "| balancing | MaxVio first step | MaxVio last step | overflow last step | loss last step | step time |",
                "|---|---|---|---|---|---|"]  # fmt: skip
        for mode in train.workload["per_step"]:
            out.append(
                f"| {mode} | {_cell(train, f'max_vio_first_{mode}')} | {_cell(train, f'max_vio_last_{mode}')} "
                f"| {_cell(train, f'overflow_rate_last_{mode}')} | {_cell(train, f'loss_last_{mode}')} "
                f"| {_cell(train, f'step_time_{mode}')} |"
            )
    out += ["", "## Figures", ""]
    for key, title in (("load_png", "Load per expert and per rank"), ("a2a_png", "All-to-all time against payload"),
                       ("overflow_png", "Overflow against capacity factor"), ("training_png", "Learned routing")):  # fmt: skip
        if key in art:
            out.append(f"![{title}]({art[key]})")
    out += ["", "## Method", ""]
    for note in dict.fromkeys(nt for d in docs for nt in d.notes):
        out.append(f"- {note}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------
# The runner


def run_moe_project(
    cfg: MoERunConfig,
    *,
    results: Path,
    command: str,
    calibration: Path | None = None,
    quiet: bool = False,
) -> MoEOutcome:
    """Launch the ranks, write the documents and the report; see the module docstring."""
    import dataclasses

    from parlab.contract import new_run_id, write_result
    from parlab.hardware.env import snapshot
    from parlab.runtime.launch import LaunchConfig, launch

    launch_cfg = LaunchConfig(nproc=cfg.ep, backend=cfg.backend, timeout_s=cfg.timeout_s)
    backend = launch_cfg.resolved_backend()
    cal = find_calibration(results, calibration, cfg.ep, backend)
    res = launch("parlab.projects.moe:moe_rank", _to_json(cfg), launch_cfg)
    env = snapshot()
    outcome = MoEOutcome()
    if not res.ok:
        assert res.failure is not None
        doc = failure_document(cfg, res.failure, command=command, environment=env, backend=backend)
        outcome.documents.append(doc)
        outcome.paths.append(write_result(doc, results))
        outcome.ok = False
        return outcome
    ranks = sorted(res.results, key=lambda r: r["ep_rank"])
    tag = new_run_id(f"moe-ep{cfg.ep}")
    kw = {"tag": tag, "command": command, "environment": env}
    docs = [
        workload_document(cfg, ranks, i, calibration=cal, **kw) for i in range(len(cfg.workloads()))
    ]
    docs.append(sweep_document(cfg, ranks, **kw))
    if cfg.train_steps:
        docs.append(training_document(cfg, ranks, **kw))
    if cal is not None:
        used = [f"all_to_all sweep {cal['run_id']}" if "run_id" in cal else "",
                f"all_to_all fit {cal['fit_label']}" if "fit_label" in cal else ""]  # fmt: skip
        note = "parlab collectives reference: " + ", ".join(u for u in used if u)
        docs = [dataclasses.replace(d, notes=[*d.notes, note]) for d in docs]
    folder = results / PROJECT
    art = render_report(docs, folder, tag)
    for d in docs:
        d = dataclasses.replace(d, artifacts=dict(art))
        outcome.documents.append(d)
        outcome.paths.append(write_result(d, results))
    outcome.report = folder / art["report"]
    return outcome


def demo_step(results: Path, console: Any) -> None:
    """``parlab demo``: a CPU-sized run (2 ranks, 8 experts, top-2, uniform and Zipf 1.2)."""
    args = "--ep 2 --experts 8 --topk 2 --capacity-factor 1.25 --skew zipf:1.2 --hidden 64 "
    args += "--ffn-hidden 128 --tokens 256 --train-steps 4 --warmup 1 --iters 3"
    cfg = MoERunConfig(
        ep=2, experts=8, topk=2, capacity_factor=1.25, skews=(1.2,), hidden=64, ffn_hidden=128,
        tokens=256, train_steps=4, warmup=1, iters=3,
    )  # fmt: skip
    out = run_moe_project(
        cfg, results=results, command=f"parlab project moe {args} --results {results}"
    )
    if not out.ok:
        f = out.documents[0].failure
        raise RuntimeError(f"moe run failed: {f.message if f else '?'}")
    for d in out.documents[:2]:
        console.print(
            f"{d.workload['name']}: overflow {_cell(d, 'overflow_rate')}, expert load max/mean "
            f"{_cell(d, 'expert_load_max_over_mean')}, slowest rank {_cell(d, 'slowest_rank')} "
            f"(+{_cell(d, 'slowest_rank_excess')}), dispatch {_cell(d, 'dispatch_time')}"
        )
    console.print(f"report: {out.report}")
