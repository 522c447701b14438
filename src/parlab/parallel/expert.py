"""Expert parallelism: one MoE layer's experts sharded over ``ep`` ranks.

The layer is ``parlab.models.moe.MoE`` (router and experts, the single-device reference);
``ExpertParallelMoE`` is its shard on this rank, in one of two modes:

- ``mode="a2a"``: rank r holds experts ``[r*L, (r+1)*L)`` (L = E/ep) and a replica of the
  router. Per forward: route the local tokens; count tokens per (destination rank, local
  expert) and exchange those counts (the ``DispatchPlan``); permute the kept assignments so
  each destination's rows are contiguous; ``all_to_all_single`` with the plan's uneven splits
  (dispatch); regroup the received rows by local expert; run the local experts as one grouped
  computation; undo the regrouping; ``all_to_all_single`` back (combine); scale by the gate
  weights and add each row into its token's output (un-permute).
- ``mode="naive"``: the same sharded experts, but every rank all-gathers every token and its
  routing, runs its local experts on the tokens routed to them, and reduce-scatters the
  partial outputs. It moves ep times more data and exists to check the fast path against.

Shared experts (a dense FFN) and the route scale stay as the layer has them, replicated.
``apply_expert_parallel`` shards every MoE block of the reference model in place.

What crosses the wire is in ``parlab.parallel.expert_comm``. Gradients: the expert weights'
gradients stay local (each expert lives on one rank); the router is replicated, so its
gradient is the sum over the ep ranks (the data parallel all-reduce of the surrounding model
does it; tests sum by hand).

Shape suffixes: T tokens (this rank), H hidden, F expert FFN, E experts, L local experts,
K top-k, N rows (kept assignments), M rows received.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from parlab.errors import UsageError
from parlab.models.moe import MoE, MoEOutput, sort_kept
from parlab.models.router import RouterConfig, Routing
from parlab.parallel import expert_comm as comm

MODES = ("a2a", "naive")


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


class ExpertParallelMoE(MoE):
    """One MoE layer with its experts sharded over an ep process group (this rank's shard)."""

    def __init__(
        self,
        hidden: int,
        ffn_hidden: int,
        router: RouterConfig,
        group: Any,
        *,
        mode: str = "a2a",
        **layer: Any,
    ) -> None:
        """``layer``: ``MoE``'s keywords (shared experts, seed, device, dtype, impl, ...)."""
        if mode not in MODES:
            raise UsageError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        ep, ep_rank = comm.group_size(group), comm.group_rank(group)
        num_local = check_ep(router.num_experts, ep)
        super().__init__(
            hidden, ffn_hidden, router, local=(ep_rank * num_local, num_local), **layer
        )
        self.group, self.mode, self.ep, self.ep_rank = group, mode, ep, ep_rank
        self.num_local = num_local

    @classmethod
    def from_reference(cls, ref: MoE, group: Any, *, mode: str = "a2a") -> ExpertParallelMoE:
        """This rank's shard of a layer (same router and shared experts, its slice of the
        experts)."""
        w = ref.experts.w1
        layer = cls(
            ref.hidden, ref.ffn_hidden, ref.router.config, group, mode=mode,
            shared=ref.shared_experts, swiglu=ref.experts.swiglu, route_scale=ref.route_scale,
            device=w.device, dtype=w.dtype, impl=ref.experts.impl,
        )  # fmt: skip
        with torch.no_grad():
            layer.router.load_state_dict(ref.router.state_dict())
            layer.experts.copy_from(ref.experts)
        return layer

    def forward(  # type: ignore[override]
        self,
        x_TH: torch.Tensor,
        *,
        forced_idx_TK: torch.Tensor | None = None,
        timer: comm.BarrierTimer | None = None,
    ) -> MoEOutput:
        timer = timer or comm.BarrierTimer(device=x_TH.device, barrier=False)
        t = timer.start()
        routing = self.router(x_TH, forced_idx_TK)
        timer.stop("route", t)
        E = self.num_experts
        run = self._a2a if self.mode == "a2a" else self._naive
        y_TH, plan = run(x_TH, routing, timer)
        return MoEOutput(
            y_TH=self.finish(x_TH, y_TH),
            aux_loss=routing.aux_loss,
            routed_E=routing.counts(E),
            kept_E=routing.counts(E, kept=True),
            unserved_tokens=routing.unserved_tokens(),
            plan=plan,
        )

    def _a2a(
        self, x_TH: torch.Tensor, routing: Routing, timer: comm.BarrierTimer
    ) -> tuple[torch.Tensor, comm.DispatchPlan]:
        T, H = x_TH.shape
        K = routing.expert_idx_TK.shape[1]
        ep, L = self.ep, self.num_local
        esize = x_TH.element_size()

        t = timer.start()
        sel_N, e_N = sort_kept(routing, 0, self.num_experts)
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
        self, x_TH: torch.Tensor, routing: Routing, timer: comm.BarrierTimer
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
        sel_N, e_N = sort_kept(gathered, lo, lo + L)
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


def apply_expert_parallel(model: nn.Module, ep_group: Any, *, mode: str = "a2a") -> nn.Module:
    """Replace every MoE block of ``model`` by its expert-parallel shard, in place.

    Every rank of ``ep_group`` must hold the same weights before (build the model with the
    same seed). After it, the experts' gradients are local to their rank: a data-parallel
    wrapper must reduce them only over the ranks that hold the same experts, never over ep.
    """
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, MoE):
                setattr(module, name, ExpertParallelMoE.from_reference(child, ep_group, mode=mode))
    return model
