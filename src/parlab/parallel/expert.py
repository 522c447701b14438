"""Mixture-of-experts layers: the single-device reference and expert parallelism over ``ep`` ranks.

One MoE layer is a router (``parlab.parallel.router``) and E SwiGLU experts
(``down(silu(x @ gate) * (x @ up))``). Three ways to run it:

- ``MoELayer``: every expert on one device (the reference). Tokens may be
  routed in ``groups`` (capacity is counted per group, as each rank counts
  its own tokens in expert parallelism), so it reproduces an ep run exactly.
- ``ExpertParallelMoE(mode="a2a")``: rank r holds experts ``[r*L, (r+1)*L)``
  (L = E/ep) and a replica of the router. Per forward: route the local
  tokens; count tokens per (destination rank, local expert) and exchange
  those counts (the ``DispatchPlan``); permute the kept assignments so each
  destination's rows are contiguous; ``all_to_all_single`` with the plan's
  uneven splits (dispatch); regroup the received rows by local expert; run
  the local experts as one grouped computation; undo the regrouping;
  ``all_to_all_single`` back (combine); scale by the gate weights and add
  each row into its token's output (un-permute).
- ``ExpertParallelMoE(mode="naive")``: the same sharded experts, but every
  rank all-gathers every token and its routing, runs its local experts on
  the tokens routed to them, and reduce-scatters the partial outputs. It
  moves ep times more data and exists to check the fast path against.

What crosses the wire is in ``parlab.parallel.expert_comm``. Gradients: the
expert weights' gradients stay local (each expert lives on one rank); the
router is replicated, so its gradient is the sum over the ep ranks (the data
parallel all-reduce of the surrounding model does it; tests sum by hand).

Shape suffixes: T tokens (this rank), H hidden, F expert FFN, E experts,
L local experts, K top-k, N rows (kept assignments).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from parlab.errors import UsageError
from parlab.parallel import expert_comm as comm
from parlab.parallel.router import Router, RouterConfig, Routing

MODES = ("a2a", "naive")


@dataclass(frozen=True, kw_only=True)
class MoESpec:
    """The shape of one MoE layer."""

    hidden: int
    """H: model width."""
    ffn_hidden: int
    """F: each expert's FFN width."""
    router: RouterConfig
    """E, k, gating, capacity and balancing."""

    def __post_init__(self) -> None:
        if self.hidden < 1 or self.ffn_hidden < 1:
            raise UsageError(
                f"hidden {self.hidden} and expert FFN {self.ffn_hidden} must be at least 1"
            )

    @property
    def num_experts(self) -> int:
        return self.router.num_experts

    def expert_params(self) -> int:
        """Parameters of one expert (three H x F matrices)."""
        return 3 * self.hidden * self.ffn_hidden


def check_ep(num_experts: int, ep: int) -> int:
    """Local experts per rank; ``UsageError`` unless ep divides E."""
    if ep < 1:
        raise UsageError(f"--ep {ep} must be at least 1")
    if num_experts % ep:
        raise UsageError(
            f"{num_experts} experts do not divide over --ep {ep}: choose a number of experts "
            f"that is a multiple of {ep}"
        )
    return num_experts // ep


_GROUPED_MM_OK: dict[str, bool] = {}


def grouped_mm_works(device: torch.device) -> bool:
    """Whether ``torch._grouped_mm`` runs forward and backward in bf16 on ``device`` and
    matches one matmul per expert (checked once per device; ``auto`` falls back to a loop)."""
    key = str(device)
    if key not in _GROUPED_MM_OK:
        try:
            g = torch.Generator(device=device).manual_seed(0)
            x = torch.randn(40, 64, generator=g, device=device).bfloat16().requires_grad_()
            w = torch.randn(3, 64, 32, generator=g, device=device).bfloat16().requires_grad_()
            offs = torch.tensor([16, 16, 40], device=device, dtype=torch.int32)
            y = torch._grouped_mm(x, w, offs=offs)
            y.float().square().sum().backward()
            ref = torch.cat([x[:16] @ w[0], x[16:40] @ w[2]])
            ok = torch.allclose(y.float(), ref.float(), atol=0.1, rtol=0.05)
            _GROUPED_MM_OK[key] = bool(ok and x.grad is not None and w.grad is not None)
        except (RuntimeError, TypeError, NotImplementedError):
            _GROUPED_MM_OK[key] = False
    return _GROUPED_MM_OK[key]


class GroupedExperts(nn.Module):
    """L SwiGLU experts computed together over rows sorted by expert.

    ``impl``: ``grouped_mm`` runs each matrix product of all experts as one
    ``torch._grouped_mm`` call (CUDA, bf16); ``loop`` runs one matmul per
    expert; ``auto`` picks ``grouped_mm`` where it applies.
    """

    def __init__(
        self,
        num_local: int,
        hidden: int,
        ffn_hidden: int,
        *,
        first_expert: int = 0,
        seed: int = 0,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        if impl not in ("auto", "grouped_mm", "loop"):
            raise UsageError(f"expert impl {impl!r} is not one of auto, grouped_mm, loop")
        self.impl = impl
        self.first_expert = first_expert
        L, H, Fh = num_local, hidden, ffn_hidden
        kw = {"device": device, "dtype": dtype}
        self.w_gate = nn.Parameter(torch.empty(L, H, Fh, **kw))
        self.w_up = nn.Parameter(torch.empty(L, H, Fh, **kw))
        self.w_down = nn.Parameter(torch.empty(L, Fh, H, **kw))
        self.reset(seed)

    @torch.no_grad()
    def reset(self, seed: int) -> None:
        """Initialise expert e from a generator seeded by (seed, global e): shards match the whole."""
        dev = self.w_gate.device
        H, Fh = self.w_gate.shape[1], self.w_gate.shape[2]
        for le in range(self.w_gate.shape[0]):
            g = torch.Generator(device=dev).manual_seed(seed * 100_003 + self.first_expert + le)
            for w, fan_in in ((self.w_gate, H), (self.w_up, H), (self.w_down, Fh)):
                r = torch.randn(w.shape[1:], generator=g, device=dev, dtype=torch.float32)
                w[le].copy_(r / fan_in**0.5)

    def _use_grouped_mm(self, x: torch.Tensor) -> bool:
        if self.impl == "loop" or not hasattr(torch, "_grouped_mm"):
            return False
        if self.impl == "grouped_mm":
            return True
        dims_ok = all(d % 8 == 0 for d in self.w_gate.shape[1:])
        return x.is_cuda and x.dtype == torch.bfloat16 and dims_ok and grouped_mm_works(x.device)

    def resolved_impl(self, x: torch.Tensor) -> str:
        """``grouped_mm`` or ``loop``: what ``forward`` runs for inputs like ``x``."""
        return "grouped_mm" if self._use_grouped_mm(x) else "loop"

    def forward(self, x_NH: torch.Tensor, counts_L: list[int]) -> torch.Tensor:
        assert sum(counts_L) == x_NH.shape[0], "rows must equal the sum of per-expert counts"
        if self._use_grouped_mm(x_NH):
            offs = torch.tensor(counts_L, device=x_NH.device).cumsum(0).to(torch.int32)
            try:
                h = F.silu(torch._grouped_mm(x_NH, self.w_gate, offs=offs))
                h = h * torch._grouped_mm(x_NH, self.w_up, offs=offs)
                return torch._grouped_mm(h, self.w_down, offs=offs)
            except RuntimeError:
                if self.impl == "grouped_mm":
                    raise
                _GROUPED_MM_OK[str(x_NH.device)] = False  # these shapes: one matmul per expert
        outs = []
        start = 0
        for le, n in enumerate(counts_L):
            xs = x_NH[start : start + n]
            outs.append((F.silu(xs @ self.w_gate[le]) * (xs @ self.w_up[le])) @ self.w_down[le])
            start += n
        if not outs:
            return x_NH.new_zeros(x_NH.shape)
        return torch.cat(outs)

    @torch.no_grad()
    def copy_from(self, full: GroupedExperts) -> None:
        """Take this shard's experts from a full (all-expert) module."""
        s = slice(self.first_expert, self.first_expert + self.w_gate.shape[0])
        self.w_gate.copy_(full.w_gate[s])
        self.w_up.copy_(full.w_up[s])
        self.w_down.copy_(full.w_down[s])


@dataclass(frozen=True)
class MoEOutput:
    """A layer's output and what its routing did."""

    y_TH: torch.Tensor
    """The combined expert outputs (zero rows where every slot was dropped)."""
    aux_loss: torch.Tensor
    """Auxiliary load-balancing loss (summed over groups)."""
    routed_E: torch.Tensor
    """Assignments per expert before dropping (this rank's tokens)."""
    kept_E: torch.Tensor
    """Assignments per expert after dropping (this rank's tokens)."""
    unserved_tokens: int = 0
    """Tokens whose every slot was dropped (their output is zero: only the residual carries them)."""
    plan: comm.DispatchPlan | None = None
    """The dispatch plan (a2a mode)."""


def _sort_kept(routing: Routing, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept assignments to experts in [lo, hi), sorted by expert (stable: token order inside).

    Returns (assignment ids into the flattened [T*K] slots, their experts).
    """
    idx = routing.expert_idx_TK.reshape(-1)
    mask = routing.keep_TK.reshape(-1) & (idx >= lo) & (idx < hi)
    sel_N = torch.nonzero(mask).squeeze(1)
    e_N = idx[sel_N]
    order = torch.sort(e_N, stable=True).indices
    return sel_N[order], e_N[order]


class MoELayer(nn.Module):
    """The single-device MoE layer: the reference every parallel path must equal."""

    def __init__(
        self,
        spec: MoESpec,
        *,
        seed: int = 0,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        self.spec = spec
        self.router = Router(spec.hidden, spec.router).to(device=device)
        self.router.gate.to(dtype=dtype)  # the selection bias stays fp32
        self.router.reset(seed)
        self.experts = GroupedExperts(
            spec.num_experts, spec.hidden, spec.ffn_hidden, seed=seed, device=device,
            dtype=dtype, impl=impl,
        )  # fmt: skip

    def forward(
        self, x_TH: torch.Tensor, *, groups: int = 1, forced_idx_TK: torch.Tensor | None = None
    ) -> MoEOutput:
        T, H = x_TH.shape
        E = self.spec.num_experts
        if T % groups:
            raise UsageError(f"{T} tokens do not split into {groups} equal groups")
        n = T // groups
        ys, aux, routed, kept, unserved = [], [], [], [], []
        for g in range(groups):
            xg = x_TH[g * n : (g + 1) * n]
            forced = None if forced_idx_TK is None else forced_idx_TK[g * n : (g + 1) * n]
            routing = self.router(xg, forced)
            sel_N, e_N = _sort_kept(routing, 0, E)
            K = routing.expert_idx_TK.shape[1]
            tok_N = sel_N // K
            counts = torch.bincount(e_N, minlength=E).tolist()
            h_NH = self.experts(xg[tok_N], counts)
            w_N = routing.weight_TK.reshape(-1)[sel_N]
            ys.append(xg.new_zeros(n, H).index_add(0, tok_N, h_NH * w_N.unsqueeze(1)))
            aux.append(routing.aux_loss)
            routed.append(routing.counts(E))
            kept.append(routing.counts(E, kept=True))
            unserved.append(routing.unserved_tokens())
        return MoEOutput(
            y_TH=torch.cat(ys),
            aux_loss=torch.stack(aux).sum(),
            routed_E=torch.stack(routed).sum(0),
            kept_E=torch.stack(kept).sum(0),
            unserved_tokens=sum(unserved),
        )


class ExpertParallelMoE(nn.Module):
    """One MoE layer with its experts sharded over an ep process group."""

    def __init__(
        self,
        spec: MoESpec,
        group: Any,
        *,
        mode: str = "a2a",
        seed: int = 0,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        if mode not in MODES:
            raise UsageError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        self.spec = spec
        self.group = group
        self.mode = mode
        self.ep = comm.group_size(group)
        self.ep_rank = comm.group_rank(group)
        self.num_local = check_ep(spec.num_experts, self.ep)
        self.router = Router(spec.hidden, spec.router).to(device=device)
        self.router.gate.to(dtype=dtype)  # the selection bias stays fp32
        self.router.reset(seed)
        self.experts = GroupedExperts(
            self.num_local, spec.hidden, spec.ffn_hidden, first_expert=self.ep_rank * self.num_local,
            seed=seed, device=device, dtype=dtype, impl=impl,
        )  # fmt: skip

    @classmethod
    def from_reference(cls, ref: MoELayer, group: Any, *, mode: str = "a2a") -> ExpertParallelMoE:
        """This rank's shard of a reference layer (same router, its slice of the experts)."""
        w = ref.experts.w_gate
        layer = cls(
            ref.spec, group, mode=mode, device=w.device, dtype=w.dtype, impl=ref.experts.impl
        )
        with torch.no_grad():
            layer.router.load_state_dict(ref.router.state_dict())
            layer.experts.copy_from(ref.experts)
        return layer

    def forward(
        self,
        x_TH: torch.Tensor,
        *,
        forced_idx_TK: torch.Tensor | None = None,
        timer: comm.PhaseTimer | None = None,
    ) -> MoEOutput:
        timer = timer or comm.PhaseTimer(device=x_TH.device, barrier=False)
        t = timer.start()
        routing = self.router(x_TH, forced_idx_TK)
        timer.stop("route", t)
        E = self.spec.num_experts
        run = self._a2a if self.mode == "a2a" else self._naive
        y_TH, plan = run(x_TH, routing, timer)
        return MoEOutput(
            y_TH=y_TH,
            aux_loss=routing.aux_loss,
            routed_E=routing.counts(E),
            kept_E=routing.counts(E, kept=True),
            unserved_tokens=routing.unserved_tokens(),
            plan=plan,
        )

    def _a2a(
        self, x_TH: torch.Tensor, routing: Routing, timer: comm.PhaseTimer
    ) -> tuple[torch.Tensor, comm.DispatchPlan]:
        T, H = x_TH.shape
        K = routing.expert_idx_TK.shape[1]
        ep, L = self.ep, self.num_local
        esize = x_TH.element_size()

        t = timer.start()
        sel_N, e_N = _sort_kept(routing, 0, self.spec.num_experts)
        tok_N = sel_N // K
        send_NH = x_TH[tok_N]  # permute: rows for rank 0's experts first, then rank 1's, ...
        counts_RL = torch.bincount(e_N, minlength=ep * L).view(ep, L)
        timer.stop("permute", t)

        t = timer.start()
        plan = comm.exchange_plan(counts_RL, self.group)
        timer.stop("plan", t, counts_RL.numel() * 8)

        t = timer.start()
        recv_MH = comm.all_to_all(send_NH, plan.recv_splits, plan.send_splits, self.group)
        timer.stop("dispatch", t, send_NH.numel() * esize)

        t = timer.start()
        # received rows come as (source rank, local expert) blocks: regroup by local expert
        recv_counts = torch.tensor(plan.recv_counts, device=x_TH.device).view(-1)
        local_M = torch.arange(L, device=x_TH.device).repeat(ep).repeat_interleave(recv_counts)
        perm_M = torch.sort(local_M, stable=True).indices
        grouped_MH = recv_MH[perm_M]
        timer.stop("regroup", t)

        t = timer.start()
        h_MH = self.experts(grouped_MH, plan.tokens_per_local_expert)
        timer.stop("experts", t)

        t = timer.start()
        out_MH = h_MH[torch.argsort(perm_M)]
        timer.stop("ungroup", t)

        t = timer.start()
        back_NH = comm.all_to_all(out_MH, plan.send_splits, plan.recv_splits, self.group)
        timer.stop("combine", t, out_MH.numel() * esize)

        t = timer.start()
        w_N = routing.weight_TK.reshape(-1)[sel_N]
        y_TH = x_TH.new_zeros(T, H).index_add(0, tok_N, back_NH * w_N.unsqueeze(1))
        timer.stop("unpermute", t)
        return y_TH, plan

    def _naive(
        self, x_TH: torch.Tensor, routing: Routing, timer: comm.PhaseTimer
    ) -> tuple[torch.Tensor, None]:
        T, H = x_TH.shape
        K = routing.expert_idx_TK.shape[1]
        ep, L = self.ep, self.num_local
        lo = self.ep_rank * L
        esize = x_TH.element_size()

        t = timer.start()
        x_all = comm.all_gather(x_TH, self.group)
        w_all = comm.all_gather(routing.weight_TK, self.group)
        idx_all = comm.all_gather_nograd(routing.expert_idx_TK, self.group)
        keep_all = comm.all_gather_nograd(routing.keep_TK, self.group)
        timer.stop("gather", t, x_TH.numel() * esize * ep)

        t = timer.start()
        gathered = Routing(
            expert_idx_TK=idx_all, weight_TK=w_all, keep_TK=keep_all,
            scores_TE=routing.scores_TE, aux_loss=routing.aux_loss, capacity=routing.capacity,
        )  # fmt: skip
        sel_N, e_N = _sort_kept(gathered, lo, lo + L)
        tok_N = sel_N // K
        counts = torch.bincount(e_N - lo, minlength=L).tolist()
        h_NH = self.experts(x_all[tok_N], counts)
        w_N = w_all.reshape(-1)[sel_N]
        partial = x_all.new_zeros(ep * T, H).index_add(0, tok_N, h_NH * w_N.unsqueeze(1))
        timer.stop("experts", t)

        t = timer.start()
        y_TH = comm.reduce_scatter(partial, self.group)
        timer.stop("scatter", t, partial.numel() * esize)
        return y_TH, None


class ExpertParallelBlock(nn.Module):
    """The reference model's MoE block (``parlab.models.reference.MoE``) with its routed
    experts sharded over an ep group: same router, same outputs; shared experts and the
    route scale stay as they were (the shared experts are a dense FFN, replicated)."""

    def __init__(self, block: nn.Module, group: Any, *, mode: str = "a2a") -> None:
        super().__init__()
        router, experts = block.router, block.experts
        if not experts.swiglu:
            raise UsageError("expert parallelism here runs SwiGLU experts; this model's are GeLU")
        E, Fh, H = experts.w1.shape
        cfg = RouterConfig(
            num_experts=E, top_k=router.top_k, gating=router.scoring,
            normalize_weights=router.normalize,
        )  # fmt: skip
        w1 = experts.w1
        spec = MoESpec(hidden=H, ffn_hidden=Fh, router=cfg)
        self.layer = ExpertParallelMoE(spec, group, mode=mode, device=w1.device, dtype=w1.dtype)
        lo, n = self.layer.experts.first_expert, self.layer.num_local
        with torch.no_grad():
            self.layer.router.gate.weight.copy_(router.gate.weight)
            self.layer.experts.w_gate.copy_(experts.w1[lo : lo + n].transpose(1, 2))
            self.layer.experts.w_up.copy_(experts.w3[lo : lo + n].transpose(1, 2))
            self.layer.experts.w_down.copy_(experts.w2[lo : lo + n].transpose(1, 2))
        self.route_scale = float(router.scale)
        self.shared_experts = block.shared_experts

    def forward(self, x_BSH: torch.Tensor) -> torch.Tensor:
        x_TH = x_BSH.reshape(-1, x_BSH.shape[-1])
        y_TH = self.layer(x_TH).y_TH
        if self.route_scale != 1.0:
            y_TH = y_TH * self.route_scale
        if self.shared_experts is not None:
            y_TH = y_TH + self.shared_experts(x_TH)
        return y_TH.view_as(x_BSH)


def apply_expert_parallel(model: nn.Module, ep_group: Any, *, mode: str = "a2a") -> nn.Module:
    """Replace every reference MoE block of ``model`` by its expert-parallel shard, in place.

    Every rank of ``ep_group`` must hold the same weights before (build the model with the
    same seed). After it, the experts' gradients are local to their rank: a data-parallel
    wrapper must reduce them only over the ranks that hold the same experts, never over ep.
    """
    from parlab.models.reference import MoE

    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, MoE):
                setattr(module, name, ExpertParallelBlock(child, ep_group, mode=mode))
    return model
