"""The mixture-of-experts layer on one device: the reference every expert-parallel path equals.

``MoE`` is a router (``parlab.models.router``: gating, capacity, dropping, balancing) and E
experts (``GroupedExperts``: SwiGLU ``w2(silu(w1 x) * w3 x)`` or GeLU ``w2(gelu(w1 x))``,
stacked as ``w1``/``w3`` ``[E, F, H]`` and ``w2`` ``[E, H, F]``, torchtitan's layout), plus
optional shared experts every token goes through (one dense FFN) and a route scale on the
routed output (DeepSeek-V3: 2.5). It is the reference model's MoE block (dropless, from the
model's ``MoESpec``) and the MoE project's layer (capacity and dropping, Zipf-forced routing).
Tokens may be routed in ``groups`` (capacity is counted per group, as each rank counts its
own tokens in expert parallelism), so it reproduces an expert-parallel run exactly
(``parlab.parallel.expert``). Nothing crosses the wire here.

Shape suffixes: T tokens, H hidden, F expert FFN, E experts, L local experts, K top-k,
N rows (kept assignments).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from parlab.errors import UsageError
from parlab.models.router import Router, RouterConfig, Routing
from parlab.models.spec import ModelSpec

IMPLS = ("auto", "grouped_mm", "loop")
_GROUPED_MM_OK: dict[str, bool] = {}


def grouped_mm_works(device: torch.device) -> bool:
    """Whether ``torch._grouped_mm`` runs forward and backward in bf16 on ``device`` and
    matches one matmul per expert (checked once per device; ``auto`` falls back to a loop)."""
    key = str(device)
    if key not in _GROUPED_MM_OK:
        try:
            g = torch.Generator(device=device).manual_seed(0)
            x = torch.randn(40, 64, generator=g, device=device).bfloat16().requires_grad_()
            w = torch.randn(3, 32, 64, generator=g, device=device).bfloat16().requires_grad_()
            offs = torch.tensor([16, 16, 40], device=device, dtype=torch.int32)
            y = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
            y.float().square().sum().backward()
            ref = torch.cat([x[:16] @ w[0].t(), x[16:40] @ w[2].t()])
            ok = torch.allclose(y.float(), ref.float(), atol=0.1, rtol=0.05)
            _GROUPED_MM_OK[key] = bool(ok and x.grad is not None and w.grad is not None)
        except (RuntimeError, TypeError, NotImplementedError):
            _GROUPED_MM_OK[key] = False
    return _GROUPED_MM_OK[key]


class GroupedExperts(nn.Module):
    """L experts (global ``first_expert`` on), computed together over rows sorted by expert.

    ``impl``: ``grouped_mm`` runs each matrix product of all experts as one ``torch._grouped_mm``
    call (CUDA, bf16); ``loop`` runs one matmul per expert; ``auto`` picks ``grouped_mm`` where
    it applies. ``seed``: expert e's weights drawn from a generator seeded by (seed, global e),
    so a shard's experts equal the whole layer's; None: left to ``init_weights``."""

    def __init__(
        self,
        num_local: int,
        hidden: int,
        ffn_hidden: int,
        *,
        swiglu: bool = True,
        first_expert: int = 0,
        seed: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        if impl not in IMPLS:
            raise UsageError(f"expert impl {impl!r} is not one of {', '.join(IMPLS)}")
        self.impl, self.first_expert, self.swiglu = impl, first_expert, swiglu
        kw = {"device": device, "dtype": dtype}
        self.w1 = nn.Parameter(torch.empty(num_local, ffn_hidden, hidden, **kw))
        self.w2 = nn.Parameter(torch.empty(num_local, hidden, ffn_hidden, **kw))
        self.w3 = nn.Parameter(torch.empty(num_local, ffn_hidden, hidden, **kw)) if swiglu else None
        if seed is not None:
            self.reset(seed)

    @torch.no_grad()
    def reset(self, seed: int) -> None:
        """Expert e from a generator seeded by (seed, global e): the gate, up and down
        projections ~ N(0, 1/fan_in), drawn as [H, F], [H, F], [F, H] (stored transposed)."""
        dev = self.w1.device
        Fh, H = self.w1.shape[1], self.w1.shape[2]
        for le in range(self.w1.shape[0]):
            g = torch.Generator(device=dev).manual_seed(seed * 100_003 + self.first_expert + le)
            for w, shape, fan_in in ((self.w1, (H, Fh), H), (self.w3, (H, Fh), H), (self.w2, (Fh, H), Fh)):  # fmt: skip
                r = torch.randn(shape, generator=g, device=dev, dtype=torch.float32)
                if w is not None:
                    w[le].copy_((r / fan_in**0.5).t())

    def _use_grouped_mm(self, x: torch.Tensor) -> bool:
        if self.impl == "loop" or not hasattr(torch, "_grouped_mm") or not self.swiglu:
            return False
        if self.impl == "grouped_mm":
            return True
        dims_ok = all(d % 8 == 0 for d in self.w1.shape[1:])
        return x.is_cuda and x.dtype == torch.bfloat16 and dims_ok and grouped_mm_works(x.device)

    def resolved_impl(self, x: torch.Tensor) -> str:
        """``grouped_mm`` or ``loop``: what ``forward`` runs for inputs like ``x``."""
        return "grouped_mm" if self._use_grouped_mm(x) else "loop"

    def expert(self, le: int, x_TH: torch.Tensor) -> torch.Tensor:
        """Local expert ``le`` applied to the tokens ``x_TH``."""
        if self.w3 is not None:
            hid = F.silu(x_TH @ self.w1[le].t()) * (x_TH @ self.w3[le].t())
        else:
            hid = F.gelu(x_TH @ self.w1[le].t(), approximate="tanh")
        return hid @ self.w2[le].t()

    def forward(self, x_NH: torch.Tensor, counts_L: list[int]) -> torch.Tensor:
        """The experts over rows sorted by local expert, ``counts_L`` rows each."""
        assert sum(counts_L) == x_NH.shape[0], "rows must equal the sum of per-expert counts"
        if self._use_grouped_mm(x_NH):
            assert self.w3 is not None
            offs = torch.tensor(counts_L, device=x_NH.device).cumsum(0).to(torch.int32)
            try:
                h = F.silu(torch._grouped_mm(x_NH, self.w1.transpose(-2, -1), offs=offs))
                h = h * torch._grouped_mm(x_NH, self.w3.transpose(-2, -1), offs=offs)
                return torch._grouped_mm(h, self.w2.transpose(-2, -1), offs=offs)
            except RuntimeError:
                if self.impl == "grouped_mm":
                    raise
                _GROUPED_MM_OK[str(x_NH.device)] = False  # these shapes: one matmul per expert
        outs, start = [], 0
        for le, n in enumerate(counts_L):
            outs.append(self.expert(le, x_NH[start : start + n]))
            start += n
        return torch.cat(outs) if outs else x_NH.new_zeros(x_NH.shape)

    @torch.no_grad()
    def copy_from(self, full: GroupedExperts) -> None:
        """Take this shard's experts from a full (all-expert) module."""
        s = slice(self.first_expert, self.first_expert + self.w1.shape[0])
        for mine, whole in ((self.w1, full.w1), (self.w2, full.w2), (self.w3, full.w3)):
            if mine is not None and whole is not None:
                mine.copy_(whole[s])


@dataclass(frozen=True)
class MoEOutput:
    """A layer's output and what its routing did."""

    y_TH: torch.Tensor
    """The combined expert outputs (zero rows where every slot was dropped), scaled, with the
    shared experts' output added."""
    aux_loss: torch.Tensor
    """Auxiliary load-balancing loss (summed over groups)."""
    routed_E: torch.Tensor
    """Assignments per expert before dropping (this rank's tokens)."""
    kept_E: torch.Tensor
    """Assignments per expert after dropping (this rank's tokens)."""
    unserved_tokens: int = 0
    """Tokens whose every slot was dropped (their output is zero: only the residual carries them)."""
    plan: Any = None
    """The dispatch plan (``parlab.parallel.expert_comm.DispatchPlan``; expert parallel, a2a)."""


def sort_kept(routing: Routing, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept assignments to experts in [lo, hi), sorted by expert (stable: token order inside).

    Returns (assignment ids into the flattened [T*K] slots, their experts).
    """
    idx = routing.expert_idx_TK.reshape(-1)
    mask = routing.keep_TK.reshape(-1) & (idx >= lo) & (idx < hi)
    sel_N = torch.nonzero(mask).squeeze(1)
    e_N = idx[sel_N]
    order = torch.sort(e_N, stable=True).indices
    return sel_N[order], e_N[order]


class MoE(nn.Module):
    """Router + routed experts (+ shared experts, route scale): parlab's one MoE layer."""

    def __init__(
        self,
        hidden: int,
        ffn_hidden: int,
        router: RouterConfig,
        *,
        shared: nn.Module | None = None,
        swiglu: bool = True,
        route_scale: float = 1.0,
        seed: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        impl: str = "auto",
        local: tuple[int, int] | None = None,
    ) -> None:
        """``local``: (first expert, count) of the experts this module holds (an expert-parallel
        shard); None: all of them. ``seed`` None: weights left to ``init_weights`` or a copy."""
        super().__init__()
        if hidden < 1 or ffn_hidden < 1:
            raise UsageError(f"hidden {hidden} and expert FFN {ffn_hidden} must be at least 1")
        self.hidden, self.ffn_hidden, self.route_scale = hidden, ffn_hidden, route_scale
        self.router = Router(hidden, router).to(device=device)
        self.router.gate.to(dtype=dtype)  # the selection bias stays fp32
        if seed is not None:
            self.router.reset(seed)
        first, count = local or (0, router.num_experts)
        self.experts = GroupedExperts(
            count, hidden, ffn_hidden, swiglu=swiglu, first_expert=first, seed=seed,
            device=device, dtype=dtype, impl=impl,
        )  # fmt: skip
        self.shared_experts = shared

    @classmethod
    def from_spec(cls, spec: ModelSpec, shared: nn.Module | None) -> MoE:
        """The reference model's MoE block: dropless token choice (``spec.moe``)."""
        m = spec.moe
        assert m is not None
        router = RouterConfig(num_experts=m.num_experts, top_k=m.top_k, gating=m.scoring,
                              normalize_weights=m.normalize_top_k)  # fmt: skip
        return cls(spec.hidden, m.expert_ffn_hidden, router, shared=shared,
                   swiglu=spec.activation == "swiglu", route_scale=m.route_scale)  # fmt: skip

    @property
    def num_experts(self) -> int:
        return self.router.config.num_experts

    def finish(self, x_TH: torch.Tensor, y_TH: torch.Tensor) -> torch.Tensor:
        """The routed output scaled by the route scale, plus the shared experts' output."""
        if self.route_scale != 1.0:
            y_TH = y_TH * self.route_scale
        if self.shared_experts is not None:
            y_TH = y_TH + self.shared_experts(x_TH)
        return y_TH

    def forward(
        self, x_TH: torch.Tensor, *, groups: int = 1, forced_idx_TK: torch.Tensor | None = None
    ) -> MoEOutput:
        T, H = x_TH.shape
        E = self.num_experts
        if T % groups:
            raise UsageError(f"{T} tokens do not split into {groups} equal groups")
        n = T // groups
        ys, aux, routed, kept, unserved = [], [], [], [], []
        for g in range(groups):
            xg = x_TH[g * n : (g + 1) * n]
            forced = None if forced_idx_TK is None else forced_idx_TK[g * n : (g + 1) * n]
            routing = self.router(xg, forced)
            sel_N, e_N = sort_kept(routing, 0, E)
            tok_N = sel_N // routing.expert_idx_TK.shape[1]
            h_NH = self.experts(xg[tok_N], torch.bincount(e_N, minlength=E).tolist())
            w_N = routing.weight_TK.reshape(-1)[sel_N]
            ys.append(xg.new_zeros(n, H).index_add(0, tok_N, h_NH * w_N.unsqueeze(1)))
            aux.append(routing.aux_loss)
            routed.append(routing.counts(E))
            kept.append(routing.counts(E, kept=True))
            unserved.append(routing.unserved_tokens())
        return MoEOutput(
            y_TH=self.finish(x_TH, torch.cat(ys)),
            aux_loss=torch.stack(aux).sum(),
            routed_E=torch.stack(routed).sum(0),
            kept_E=torch.stack(kept).sum(0),
            unserved_tokens=sum(unserved),
        )
