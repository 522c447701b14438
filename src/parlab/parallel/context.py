"""Context parallelism: the sequence split over the CP group, attention by ring or all-gather.

Sharding (causal load balancing): the sequence is cut in ``2c`` equal chunks
and CP rank ``i`` holds chunks ``i`` and ``2c-1-i``, so every rank has the
same number of (query, key) pairs under the causal mask. Every op except
attention is per token and runs on the local ``S/c`` tokens unchanged (the
reference model takes the chunks' true ``positions_S`` for RoPE).

Attention, two variants (``tensor`` legend: ``q_BNSD`` local queries,
``k_BKSD``/``v_BKSD`` local KV heads ``K``):

- ``ring``: K/V blocks travel round the ring (``c-1`` send/recv shifts
  forward, each overlapping the current block's attention; ``c`` shifts of K,
  V, dK, dV backward). Each block's partial output and log-sum-exp are merged
  by the online softmax (``o = o*exp(l - l') + o_i*exp(l_i - l')``,
  ``l' = logaddexp(l, l_i)``). Per (query chunk, key chunk) pair: key chunk
  later than query chunk is skipped, equal is causal, earlier is full.
  Backward recomputes each block with the merged output and log-sum-exp (the
  flash-attention identity), so nothing but ``q, k, v, o, lse`` is kept.
- ``allgather``: all-gather K and V (``B*K*S*D`` each), attend the local
  queries to every key with the causal mask of their true positions;
  backward reduce-scatters dK and dV. More memory for K/V, one collective.

Block kernels: flash attention (``aten._scaled_dot_product_flash_attention``
and its backward, which accept the merged output and LSE) on CUDA in
bf16/fp16; an exact float32 math path elsewhere (CPU tests).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel

from parlab.errors import UsageError
from parlab.models.reference import Attention
from parlab.parallel.context_comm import gather_kv, ring_shift_start

VARIANTS = ("ring", "allgather")


def chunk_ids(cp: int, rank: int) -> list[int]:
    """The two chunks (of ``2*cp``) CP rank ``rank`` holds."""
    return [rank, 2 * cp - 1 - rank]


def local_positions(seq: int, cp: int, rank: int, device: Any = None) -> torch.Tensor:
    """The global token positions of this rank's chunks, in local order."""
    if seq % (2 * cp):
        raise UsageError(f"seq {seq} is not divisible by 2*cp = {2 * cp}: pad or change cp")
    c = seq // (2 * cp)
    return torch.cat([torch.arange(i * c, (i + 1) * c, device=device) for i in chunk_ids(cp, rank)])


def shard_sequence(x: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """This rank's chunks of ``x`` along ``dim``."""
    pos = local_positions(x.shape[dim], cp, rank, device=x.device)
    return x.index_select(dim, pos)


def unshard_sequence(parts: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """Reassemble the whole sequence from every rank's local tensor (rank order)."""
    cp = len(parts)
    chunks: dict[int, torch.Tensor] = {}
    for r, p in enumerate(parts):
        a, b = p.chunk(2, dim=dim)
        ids = chunk_ids(cp, r)
        chunks[ids[0]], chunks[ids[1]] = a, b
    return torch.cat([chunks[i] for i in range(2 * cp)], dim=dim)


# ----- block kernels: (out, lse) forward and (dq, dk, dv) backward with given out/lse ----------


_FALLBACKS: list[str] = []
"""Why a block fell back from flash attention to the math path (reported by runs)."""


def _use_flash(q: torch.Tensor) -> bool:
    return q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and q.shape[-1] <= 256


def _block_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor, tuple[Any, ...] | None]:
    """(out, lse, flash aux) of one block; aux is what the flash backward needs besides out/lse."""
    if _use_flash(q):
        out = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, causal, False, scale=scale
        )
        # cum_seq_q, cum_seq_k, max_q, max_k, philox seed, philox offset (all chunks equal size)
        return out[0], out[1], (out[2], out[3], out[4], out[5], out[6], out[7])
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return (torch.exp(s - lse.unsqueeze(-1)) @ v.float()).to(q.dtype), lse, None


def _block_bwd(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float,
    aux: tuple[Any, ...] | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if _use_flash(q) and aux is not None:
        cq, ck, mq, mk, seed, offset = aux
        do, q, k, v = (t.contiguous() for t in (do, q, k, v))
        try:
            dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
                do, q, k, v, o, lse, cq, ck, mq, mk, 0.0, causal, seed, offset, scale=scale
            )
            return dq.float(), dk.float(), dv.float()
        except RuntimeError as exc:  # an unexpected flash signature: the exact math path below
            _FALLBACKS.append(f"flash backward failed ({exc}); used the math path")
    qf, kf, vf, dof, of = (t.float() for t in (q, k, v, do, o))
    s = (qf @ kf.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.exp(s - lse.unsqueeze(-1))
    dv = p.transpose(-1, -2) @ dof
    dp = dof @ vf.transpose(-1, -2)
    delta = (dof * of).sum(-1, keepdim=True)
    ds = p * (dp - delta)
    return (ds @ kf) * scale, (ds.transpose(-1, -2) @ qf) * scale, dv


def _merge(
    acc: tuple[torch.Tensor, torch.Tensor] | None, o: torch.Tensor, lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if acc is None:
        return o.float(), lse
    o_acc, l_acc = acc
    new = torch.logaddexp(l_acc, lse)
    o_new = o_acc * torch.exp(l_acc - new).unsqueeze(-1) + o.float() * torch.exp(
        lse - new
    ).unsqueeze(-1)
    return o_new, new


def _pairs(cp: int, me: int, src: int, causal: bool) -> list[tuple[int, int, bool]]:
    """(local q chunk, block k chunk, causal?) pairs that see each other."""
    out = []
    for qi, qid in enumerate(chunk_ids(cp, me)):
        for kj, kid in enumerate(chunk_ids(cp, src)):
            if not causal or kid < qid:
                out.append((qi, kj, False))
            elif kid == qid:
                out.append((qi, kj, True))
    return out


def _rep(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.repeat_interleave(n, dim=1) if n > 1 else t


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any, causal: bool
    ) -> torch.Tensor:
        cp, me = dist.get_world_size(group), dist.get_rank(group)
        rep = q.shape[1] // k.shape[1]
        scale = 1.0 / math.sqrt(q.shape[-1])
        qs = q.chunk(2, dim=2)
        acc: list[tuple[torch.Tensor, torch.Tensor] | None] = [None, None]
        kv = [k, v]
        aux = None
        for t in range(cp):
            pending = ring_shift_start(kv, group) if t < cp - 1 else None
            src = (me - t) % cp
            ks, vs = kv[0].chunk(2, dim=2), kv[1].chunk(2, dim=2)
            for qi, kj, cz in _pairs(cp, me, src, causal):
                o, lse, aux = _block_fwd(qs[qi], _rep(ks[kj], rep), _rep(vs[kj], rep), cz, scale)
                acc[qi] = _merge(acc[qi], o, lse)
            if pending is not None:
                kv = pending.wait()
        assert acc[0] is not None and acc[1] is not None, "the diagonal chunk is always seen"
        out = torch.cat([acc[0][0], acc[1][0]], dim=2).to(q.dtype)
        lse = torch.cat([acc[0][1], acc[1][1]], dim=2)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal, ctx.scale, ctx.rep, ctx.aux = group, causal, scale, rep, aux
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        group, rep, scale = ctx.group, ctx.rep, ctx.scale
        cp, me = dist.get_world_size(group), dist.get_rank(group)
        qs, os_, ls, dos = (t.chunk(2, dim=2) for t in (q, out, lse, dout.contiguous()))
        dq = [torch.zeros_like(x, dtype=torch.float32) for x in qs]
        cur_k, cur_v = k, v
        dk = torch.zeros_like(k, dtype=torch.float32)
        dv = torch.zeros_like(v, dtype=torch.float32)
        for t in range(cp):
            src = (me - t) % cp
            ks, vs = cur_k.chunk(2, dim=2), cur_v.chunk(2, dim=2)
            dks, dvs = list(dk.chunk(2, dim=2)), list(dv.chunk(2, dim=2))
            for qi, kj, cz in _pairs(cp, me, src, ctx.causal):
                gq, gk, gv = _block_bwd(
                    dos[qi], qs[qi], _rep(ks[kj], rep), _rep(vs[kj], rep),
                    os_[qi].contiguous(), ls[qi].contiguous(), cz, scale, ctx.aux,
                )  # fmt: skip
                dq[qi] += gq
                if rep > 1:
                    gk = gk.unflatten(1, (-1, rep)).sum(2)
                    gv = gv.unflatten(1, (-1, rep)).sum(2)
                dks[kj] += gk
                dvs[kj] += gv
            dk, dv = torch.cat(dks, dim=2), torch.cat(dvs, dim=2)
            if t < cp - 1:
                cur_k, cur_v, dk, dv = ring_shift_start([cur_k, cur_v, dk, dv], group).wait()
            else:
                dk, dv = ring_shift_start([dk, dv], group).wait()
        grad_q = torch.cat(dq, dim=2).to(q.dtype)
        return grad_q, dk.to(k.dtype), dv.to(v.dtype), None, None


def ring_attention(
    q_BNSD: torch.Tensor,
    k_BKSD: torch.Tensor,
    v_BKSD: torch.Tensor,
    group: Any,
    *,
    causal: bool = True,
) -> torch.Tensor:
    """Attention of the local (load-balanced) queries over the whole sequence, by ring."""
    if dist.get_world_size(group) == 1:
        rep = q_BNSD.shape[1] // k_BKSD.shape[1]
        return F.scaled_dot_product_attention(
            q_BNSD, _rep(k_BKSD, rep), _rep(v_BKSD, rep), is_causal=causal
        )
    return _RingAttention.apply(q_BNSD, k_BKSD, v_BKSD, group, causal)


def allgather_attention(
    q_BNSD: torch.Tensor,
    k_BKSD: torch.Tensor,
    v_BKSD: torch.Tensor,
    group: Any,
    *,
    causal: bool = True,
) -> torch.Tensor:
    """Attention of the local queries over all-gathered K/V, with the true-position mask."""
    cp, me = dist.get_world_size(group), dist.get_rank(group)
    rep = q_BNSD.shape[1] // k_BKSD.shape[1]
    if cp == 1:
        return F.scaled_dot_product_attention(
            q_BNSD, _rep(k_BKSD, rep), _rep(v_BKSD, rep), is_causal=causal
        )
    k_all, v_all = gather_kv(k_BKSD, group), gather_kv(v_BKSD, group)
    seq = k_all.shape[2]
    kpos = torch.cat([local_positions(seq, cp, r, device=q_BNSD.device) for r in range(cp)])
    qpos = local_positions(seq, cp, me, device=q_BNSD.device)
    mask = (kpos[None, :] <= qpos[:, None]) if causal else None
    return F.scaled_dot_product_attention(q_BNSD, _rep(k_all, rep), _rep(v_all, rep), mask)


class ContextParallelAttention(Attention):
    """The reference ``Attention`` with its SDPA replaced by ring or all-gather CP attention."""

    cp_group: Any
    variant: str

    def attend(
        self, q_BNSD: torch.Tensor, k_BKSD: torch.Tensor, v_BKSD: torch.Tensor
    ) -> torch.Tensor:
        fn = ring_attention if self.variant == "ring" else allgather_attention
        return fn(q_BNSD, k_BKSD, v_BKSD, self.cp_group)


def apply_context_parallel(model: nn.Module, cp_group: Any, *, variant: str = "ring") -> nn.Module:
    """Swap every attention of a reference model for CP attention over ``cp_group`` (in place).

    Call the model with this rank's tokens and positions:
    ``model(shard_sequence(tokens, cp, rank), positions_S=local_positions(S, cp, rank))``.
    Gradients of the (replicated) parameters must then be averaged over the CP
    group, as over DP (``compose`` folds CP into the data-parallel reduction).
    """
    if variant not in VARIANTS:
        raise UsageError(f"CP variant {variant!r}: use one of {', '.join(VARIANTS)}")
    for block in model.layers:
        attn = block.attention
        if type(attn) is not Attention and not isinstance(attn, ContextParallelAttention):
            raise UsageError("context parallelism here covers GQA/MHA attention (not MLA)")
        attn.__class__ = ContextParallelAttention
        attn.cp_group = cp_group
        attn.variant = variant
    return model


def torch_cp_agreement(
    ctx: Any, *, seq: int = 8192, heads: int = 16, head_dim: int = 128
) -> dict[str, Any]:
    """Rank function (GPU): parlab's ring attention vs torch's ``context_parallel`` on SDPA.

    Both shard the sequence head-tail (chunks ``i`` and ``2c-1-i``); the same random
    bf16 q, k, v go through each; returns the largest output and input-gradient
    differences on this rank. torch's CP has no CPU sharding rule for causal SDPA,
    so on CPU it reports ``unsupported``.
    """

    if ctx.device.type != "cuda":
        return {"status": "unsupported", "reason": "torch context_parallel needs CUDA SDPA"}
    try:
        return _torch_cp_agreement(ctx, seq=seq, heads=heads, head_dim=head_dim)
    except Exception as exc:  # torch's CP API is experimental: report, do not fail the run
        return {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:500]}


def _torch_cp_agreement(ctx: Any, *, seq: int, heads: int, head_dim: int) -> dict[str, Any]:
    cp, me = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cuda", (cp,), mesh_dim_names=("cp",))
    g = torch.Generator(device=ctx.device).manual_seed(0)
    shape = (1, heads, seq, head_dim)
    q, k, v, do = (
        torch.randn(shape, generator=g, device=ctx.device, dtype=torch.bfloat16) for _ in range(4)
    )
    mine = [shard_sequence(t, cp, me, dim=2).requires_grad_() for t in (q, k, v)]
    out_mine = ring_attention(*mine, mesh.get_group(), causal=True)
    out_mine.backward(shard_sequence(do, cp, me, dim=2))
    # context_parallel shards its buffers in place (and restores them on exit, a resize a
    # tensor that requires grad refuses): it gets plain copies; the leaves that take
    # gradients are clones of the shards, made inside the context
    theirs = [t.clone() for t in (q, k, v, do)]
    with context_parallel(mesh, buffers=theirs, buffer_seq_dims=[2, 2, 2, 2]):
        tq, tk, tv = (t.detach().clone().requires_grad_() for t in theirs[:3])
        tdo = theirs[3].detach().clone()
        out_t = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
        out_t.backward(tdo)
    return {
        "status": "ok",
        "out": (out_t.float() - out_mine.float()).abs().max().item(),
        "dq": (tq.grad.float() - mine[0].grad.float()).abs().max().item(),
        "dk": (tk.grad.float() - mine[1].grad.float()).abs().max().item(),
        "dv": (tv.grad.float() - mine[2].grad.float()).abs().max().item(),
        "fallbacks": list(_FALLBACKS),
    }
