"""Attention over the paged KV cache, for one step's flat batch of tokens.

The step's tokens are laid out as ``[decode tokens (one per decoding sequence), prompt
chunk 0, prompt chunk 1, ...]``. Per layer (``PagedAttention.__call__``):

1. RoPE on the new queries and keys, and the new keys and values written to their page
   slots (``slot = page * block + offset``, one indexed write for the whole batch);
2. the decode tokens attend over their sequences' pages in one batched call: the Triton
   kernel (``kernels.paged_decode``) on CUDA, or SDPA over the pages gathered per sequence
   (``torch`` backend: the reference, and the CPU path);
3. each prompt chunk attends causally over its sequence's earlier tokens and itself: SDPA
   over its gathered pages (a chunk from position 0 attends to its own new keys only; a
   later one with causality aligned to the lower right, ``causal_lower_right``).

Cache layout: per layer ``[num_blocks, block, K, D]`` for keys and for values.

Shape suffixes: T tokens, B decoding sequences, S chunk tokens, L keys, M pages per
sequence, N query heads, K kv heads, R query heads per kv head, D head dim.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from parlab.models.reference import apply_rope

NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""SDPA backends on CUDA: cuDNN builds an execution plan for every new shape the first time
it sees one, and a serving step's shapes change all the time (on an H200, 1.3B, bf16,
batch 32: a decode step took 56.2 ms with cuDNN allowed and 15.2 ms without)."""


@dataclass
class ChunkMeta:
    """``count`` prompt chunks of the step, side by side in the flat batch, of ``n`` tokens
    each from position ``start`` (more than one only from position 0: equal prompts prefilled
    together, one SDPA call for all of them)."""

    offset: int
    """First token's index in the step's batch."""
    n: int
    """Tokens of each chunk."""
    start: int
    """Their first token's position in their sequence (earlier tokens are in the pages)."""
    slots: torch.Tensor
    """The page slots of positions ``0 .. start + n - 1`` of each, one after the other."""
    count: int = 1

    @classmethod
    def build(
        cls, offset: int, n: int, start: int, pages: list[torch.Tensor], block: int
    ) -> ChunkMeta:
        """Slots of the chunks over ``pages`` (one page list each), once per step (every
        layer reads them)."""
        pos = torch.arange(start + n, device=pages[0].device)
        slots = torch.cat([p[pos // block] * block + pos % block for p in pages])
        return cls(offset=offset, n=n, start=start, slots=slots, count=len(pages))


@dataclass
class StepMeta:
    """What attention needs of one step (device tensors unless noted)."""

    slots_T: torch.Tensor
    """Page slot each new token's K/V goes to."""
    n_decode: int
    """Decode tokens at the front of the batch (host int)."""
    table_BM: torch.Tensor
    """Page table of the decoding sequences."""
    lens_B: torch.Tensor
    """Tokens each decoding sequence attends to (its new one included)."""
    max_pages: int
    """Pages of the longest decoding sequence (host int; the torch backend gathers that
    many)."""
    chunks: list[ChunkMeta]
    decode: Any = None
    """The Triton decode kernel's ``kernels.DecodeConfig`` (None: the torch backend)."""


class PagedAttention:
    """One model's attention over its paged cache: ``backend`` ``triton`` or ``torch``."""

    def __init__(self, *, n_heads: int, n_kv: int, head_dim: int, backend: str, device: Any):
        self.N, self.K, self.D = n_heads, n_kv, head_dim
        self.backend = backend
        self.scale = head_dim**-0.5
        self.cuda = torch.device(device).type == "cuda"
        if backend == "triton":
            from parlab.serve.engine import kernels  # lazy: triton

            self._kernels = kernels

    def sdpa_backends(self) -> Any:
        return sdpa_kernel(NO_CUDNN) if self.cuda else contextlib.nullcontext()

    def __call__(
        self,
        qkv_TX: torch.Tensor,
        rope_TD2: torch.Tensor | None,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: StepMeta,
    ) -> torch.Tensor:
        """Attention output ``[T, N * D]`` of the step's tokens (``qkv_TX``: the fused
        projection, queries then keys then values)."""
        N, K, D = self.N, self.K, self.D
        T = qkv_TX.shape[0]
        if self.backend == "triton":
            q = torch.empty((T, N, D), device=qkv_TX.device, dtype=qkv_TX.dtype)
            self._kernels.rope_store(qkv_TX, rope_TD2, meta.slots_T, q, k_cache, v_cache, N, K, D)
        else:
            q, k, v = qkv_TX.split([N * D, K * D, K * D], dim=-1)
            q, k, v = q.view(1, T, N, D), k.view(1, T, K, D), v.view(1, T, K, D)
            if rope_TD2 is not None:
                q, k = apply_rope(q, rope_TD2), apply_rope(k, rope_TD2)
            q = q[0]
            k_cache.view(-1, K, D).index_copy_(0, meta.slots_T, k[0])
            v_cache.view(-1, K, D).index_copy_(0, meta.slots_T, v[0])
        out = torch.empty((T, N, D), device=q.device, dtype=q.dtype)
        B = meta.n_decode
        if B:
            if self.backend == "triton":
                self._kernels.paged_decode(
                    q[:B], k_cache, v_cache, meta.table_BM, meta.lens_B, out[:B], self.scale,
                    meta.decode,
                )  # fmt: skip
            else:
                out[:B] = self._decode_torch(q[:B], k_cache, v_cache, meta)
        for c in meta.chunks:
            out[c.offset : c.offset + c.count * c.n] = self._chunk(q, k_cache, v_cache, c)
        return out.view(T, N * D)

    def _decode_torch(
        self, q_BND: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: StepMeta
    ) -> torch.Tensor:
        """SDPA over each sequence's gathered pages (its first ``max_pages``), masked past
        its length; the R query heads of a KV head are its query rows, so K/V are not
        repeated."""
        B, N, D = q_BND.shape
        K = self.K
        pages = meta.table_BM[:, : meta.max_pages]
        keys = k_cache[pages].reshape(B, -1, K, D).transpose(1, 2)  # B K L D
        vals = v_cache[pages].reshape(B, -1, K, D).transpose(1, 2)
        L = keys.shape[2]
        visible = torch.arange(L, device=q_BND.device)[None, :] < meta.lens_B[:, None]
        mask = visible[:, None, None, :]  # B 1 1 L
        q = q_BND.reshape(B, K, N // K, D)
        with self.sdpa_backends():
            o = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask)
        return o.reshape(B, N, D)

    def _chunk(
        self,
        q_TND: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        c: ChunkMeta,
    ) -> torch.Tensor:
        """The chunks' attention ``[count * S, N, D]``: each causal over its earlier tokens
        (from its pages) and its own."""
        N, K, D = self.N, self.K, self.D
        G, L = c.count, c.start + c.n
        q = q_TND[c.offset : c.offset + G * c.n].view(G, c.n, N, D).transpose(1, 2)  # G N S D
        keys = k_cache.view(-1, K, D)[c.slots].view(G, L, K, D).transpose(1, 2)  # G K L D
        vals = v_cache.view(-1, K, D)[c.slots].view(G, L, K, D).transpose(1, 2)
        # chunk token i sees keys 0 .. start + i: causal aligned to the lower right, which
        # SDPA runs with flash attention (a boolean mask would take the slower kernels)
        mask = causal_lower_right(c.n, L) if c.start else None
        rep = N // K
        gqa = rep > 1 and not self.cuda
        if rep > 1 and not gqa:
            keys, vals = keys.repeat_interleave(rep, dim=1), vals.repeat_interleave(rep, dim=1)
        with self.sdpa_backends():
            o = F.scaled_dot_product_attention(
                q, keys, vals, attn_mask=mask, is_causal=mask is None, enable_gqa=gqa
            )
        return o.transpose(1, 2).reshape(G * c.n, N, D)
