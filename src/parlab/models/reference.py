"""parlab's reference decoder: the unsharded model every mechanism is tested against.

``build_model(spec)`` makes a Llama-style decoder (RMSNorm, RoPE, GQA through
``F.scaled_dot_product_attention(is_causal=True)``, SwiGLU) or a GPT-2 style one
(learned positions, LayerNorm with biases, GeLU MLP, biases on every linear),
with optional tied embeddings, MoE blocks (``parlab.models.moe.MoE``: router + routed
experts + shared experts, dropless token choice) and DeepSeek's multi-head latent attention.
Its ``named_parameters()`` are exactly ``spec.param_shapes()`` (names, shapes,
order). No communication happens here: this is the single-process reference.

Module names follow torchtitan so parallel code can target them::

    model.tok_embeddings            nn.Embedding(V, H)
    model.pos_embeddings            nn.Embedding(max_seq, H)    (learned positions only)
    model.layers                    nn.ModuleList[TransformerBlock]
      .attention_norm, .ffn_norm    RMSNorm / LayerNorm
      .attention.{wq,wk,wv,wo}      nn.Linear (MLA: wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo)
      .feed_forward.{w1,w3,w2}      gate, up, down (GeLU: w1 up, w2 down)
      .moe.router.gate              nn.Linear(H, E)
      .moe.experts.{w1,w2,w3}       stacked expert weights [E, F, H], [E, H, F], [E, F, H]
      .moe.shared_experts           FeedForward (all shared experts merged)
    model.norm, model.output        final norm, nn.Linear(H, V) (tied: shares tok_embeddings.weight)

Blocks are usable on their own (pipeline stages, tensor-parallel wrapping):
``block(x_BSH, rope_SD2)`` with ``rope_SD2 = model.rope(positions_S)`` (``None``
for learned positions). Attention infers its local head count from the
projection's output width (``view(B, S, -1, head_dim)``), so column-sharded
``wq/wk/wv`` work unchanged. ``Transformer.forward`` skips a ``None``
``tok_embeddings`` / ``norm`` / ``output`` (then it takes and returns hidden
states), the way torchtitan prunes a model into pipeline stages.

Shape suffixes: B batch, S sequence, H hidden, V vocab, N heads, D head dim,
T tokens (B*S), E experts, F FFN width, K top-k.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from parlab.models.moe import GroupedExperts, MoE
from parlab.models.spec import ModelSpec

INIT_STD = 0.02
"""Standard deviation of the normal init (GPT-2); output projections (wo, w2) are scaled by
1/sqrt(2 * layers)."""


# ----- rotary embedding --------------------------------------------------------------------------


def rope_table(positions_S: torch.Tensor, rot_dim: int, theta: float) -> torch.Tensor:
    """cos/sin of every position and frequency: float32 ``[S, rot_dim // 2, 2]``."""
    freqs = 1.0 / (
        theta
        ** (torch.arange(0, rot_dim, 2, device=positions_S.device, dtype=torch.float32) / rot_dim)
    )
    angles_SD = torch.outer(positions_S.to(torch.float32), freqs)
    return torch.stack((angles_SD.cos(), angles_SD.sin()), dim=-1)


def apply_rope(x_BSND: torch.Tensor, rope_SD2: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs ``(x[2i], x[2i+1])`` of the last dim (Meta/torchtitan layout).

    Each pair is one complex number times ``cos + i sin`` (torchtitan's ``view_as_complex``
    rotation: two kernels each way instead of a dozen); float32 math, result in ``x``'s dtype.
    ``rope_SD2`` (``[..., S, D/2, 2]`` of cos, sin; float32, or bf16 where FSDP's mixed
    precision cast the block's inputs) is read as the complex table.
    """
    table = rope_SD2.float()
    cis = torch.view_as_complex(table if table.stride(-1) == 1 else table.contiguous())
    xc = torch.view_as_complex(x_BSND.float().unflatten(-1, (-1, 2)).contiguous())
    out = torch.view_as_real(xc * cis.unsqueeze(-2))  # [..., S, 1, D/2] against [B, S, N, D/2]
    return out.flatten(-2).type_as(x_BSND)


# ----- building blocks ---------------------------------------------------------------------------


def norm_kernel(device_type: str) -> str:
    """How ``RMSNorm`` runs on ``device_type`` (the ledger's ``norm_kernel``): ``F.rms_norm``
    is one fused kernel on CUDA and torch's decomposition elsewhere."""
    return "fused" if device_type == "cuda" else "composite"


class RMSNorm(nn.Module):
    """``x / rms(x) * weight``, computed in float32: ``F.rms_norm``, one fused kernel each way
    on CUDA (it keeps only its input and a float32 rstd per token for backward)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def make_norm(spec: ModelSpec, dim: int) -> nn.Module:
    if spec.norm == "layernorm":
        return nn.LayerNorm(dim, eps=spec.norm_eps)
    return RMSNorm(dim, spec.norm_eps)


class FeedForward(nn.Module):
    """SwiGLU ``w2(silu(w1 x) * w3 x)`` or GeLU ``w2(gelu(w1 x))``."""

    def __init__(self, spec: ModelSpec, width: int) -> None:
        super().__init__()
        h, b = spec.hidden, spec.linear_bias
        self.swiglu = spec.activation == "swiglu"
        self.w1 = nn.Linear(h, width, bias=b)
        self.w2 = nn.Linear(width, h, bias=b)
        self.w3 = nn.Linear(h, width, bias=b) if self.swiglu else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            assert self.w3 is not None
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


class Attention(nn.Module):
    """Causal self-attention, MHA/GQA/MQA; K/V heads are repeated to the query heads before SDPA."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, d = spec.hidden, spec.d_head
        qkv_b = spec.qkv_bias or spec.linear_bias
        self.head_dim = d
        self.use_rope = spec.position == "rope"
        self.wq = nn.Linear(h, spec.q_dim, bias=qkv_b)
        self.wk = nn.Linear(h, spec.kv_dim, bias=qkv_b)
        self.wv = nn.Linear(h, spec.kv_dim, bias=qkv_b)
        self.wo = nn.Linear(spec.q_dim, h, bias=spec.linear_bias)

    def forward(self, x_BSH: torch.Tensor, rope_SD2: torch.Tensor | None) -> torch.Tensor:
        B, S, _ = x_BSH.shape
        q = self.wq(x_BSH).view(B, S, -1, self.head_dim)
        k = self.wk(x_BSH).view(B, S, -1, self.head_dim)
        v = self.wv(x_BSH).view(B, S, -1, self.head_dim)
        if self.use_rope:
            assert rope_SD2 is not None
            q, k = apply_rope(q, rope_SD2), apply_rope(k, rope_SD2)
        o = self.attend(*(t.transpose(1, 2) for t in (q, k, v)))
        return self.wo(o.transpose(1, 2).reshape(B, S, -1))

    def attend(
        self, q_BNSD: torch.Tensor, k_BKSD: torch.Tensor, v_BKSD: torch.Tensor
    ) -> torch.Tensor:
        """Causal SDPA, the K/V heads repeated to the query heads."""
        rep = q_BNSD.shape[1] // k_BKSD.shape[1]
        if rep > 1:
            k_BKSD = k_BKSD.repeat_interleave(rep, dim=1)
            v_BKSD = v_BKSD.repeat_interleave(rep, dim=1)
        return F.scaled_dot_product_attention(q_BNSD, k_BKSD, v_BKSD, is_causal=True)


class MLAttention(nn.Module):
    """DeepSeek multi-head latent attention (no KV-cache absorption: the training form)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        m = spec.mla
        assert m is not None
        h, n = spec.hidden, spec.heads
        self.nope, self.rope_dim, self.v_dim, self.kv_rank = (
            m.qk_nope_head_dim,
            m.qk_rope_head_dim,
            m.v_head_dim,
            m.kv_lora_rank,
        )
        if m.q_lora_rank:
            self.wq_a = nn.Linear(h, m.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(m.q_lora_rank, spec.norm_eps)
            self.wq_b = nn.Linear(m.q_lora_rank, spec.q_dim, bias=False)
        else:
            self.wq = nn.Linear(h, spec.q_dim, bias=False)
        self.wkv_a = nn.Linear(h, m.kv_lora_rank + m.qk_rope_head_dim, bias=False)
        self.kv_norm = RMSNorm(m.kv_lora_rank, spec.norm_eps)
        self.wkv_b = nn.Linear(m.kv_lora_rank, n * (m.qk_nope_head_dim + m.v_head_dim), bias=False)
        self.wo = nn.Linear(n * m.v_head_dim, h, bias=False)

    def forward(self, x_BSH: torch.Tensor, rope_SD2: torch.Tensor | None) -> torch.Tensor:
        assert rope_SD2 is not None
        B, S, _ = x_BSH.shape
        if hasattr(self, "wq_a"):
            q = self.wq_b(self.q_norm(self.wq_a(x_BSH)))
        else:
            q = self.wq(x_BSH)
        q = q.view(B, S, -1, self.nope + self.rope_dim)
        q_nope, q_pe = q.split([self.nope, self.rope_dim], dim=-1)
        q = torch.cat([q_nope, apply_rope(q_pe, rope_SD2)], dim=-1)
        kv, k_pe = self.wkv_a(x_BSH).split([self.kv_rank, self.rope_dim], dim=-1)
        k_pe = apply_rope(k_pe.unsqueeze(2), rope_SD2)  # one rope key shared by all heads
        kv = self.wkv_b(self.kv_norm(kv)).view(B, S, -1, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, -1, k_nope.shape[2], -1)], dim=-1)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(B, S, -1))


class TransformerBlock(nn.Module):
    """Pre-norm block: ``x + attention(attention_norm(x))``, then ``+ ffn(ffn_norm(x))``."""

    def __init__(self, spec: ModelSpec, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = make_norm(spec, spec.hidden)
        self.attention: nn.Module = MLAttention(spec) if spec.mla is not None else Attention(spec)
        self.ffn_norm = make_norm(spec, spec.hidden)
        self.moe: nn.Module | None = None
        self.feed_forward: FeedForward | None = None
        if spec.is_moe_layer(layer_id):
            m = spec.moe
            assert m is not None
            shared = FeedForward(spec, m.shared_hidden) if m.shared_hidden else None
            self.moe = MoE.from_spec(spec, shared)
        else:
            self.feed_forward = FeedForward(spec, spec.ffn_hidden)

    def ffn(self, x_BSH: torch.Tensor) -> torch.Tensor:
        """The block's FFN: its MoE layer (or that layer's expert-parallel shard) over the flat
        tokens, or the dense one."""
        if self.moe is not None:
            return self.moe(x_BSH.reshape(-1, x_BSH.shape[-1])).y_TH.view_as(x_BSH)
        assert self.feed_forward is not None
        return self.feed_forward(x_BSH)

    def forward(self, x_BSH: torch.Tensor, rope_SD2: torch.Tensor | None) -> torch.Tensor:
        h = x_BSH + self.attention(self.attention_norm(x_BSH), rope_SD2)
        return h + self.ffn(self.ffn_norm(h))


class Transformer(nn.Module):
    """The whole decoder: ``forward(tokens_BS) -> logits_BSV``."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(spec.vocab_size, spec.hidden)
        self.pos_embeddings: nn.Embedding | None = None
        if spec.position == "learned":
            self.pos_embeddings = nn.Embedding(spec.max_seq_len, spec.hidden)
        self.layers = nn.ModuleList(TransformerBlock(spec, i) for i in range(spec.layers))
        self.norm: nn.Module | None = make_norm(spec, spec.hidden)
        self.output: nn.Linear | None = nn.Linear(spec.hidden, spec.vocab_size, bias=False)
        if spec.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def rope(self, positions_S: torch.Tensor) -> torch.Tensor | None:
        """The rotary table for these positions (``None`` with learned positions)."""
        s = self.spec
        if s.position != "rope":
            return None
        rot = s.mla.qk_rope_head_dim if s.mla is not None else s.d_head
        return rope_table(positions_S, rot, s.rope_theta)

    def forward(
        self, tokens_BS: torch.Tensor, positions_S: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits ``[B, S, V]`` (or hidden states when stages pruned ``tok_embeddings``/``output``).

        ``positions_S`` defaults to ``0..S-1`` (context parallel passes its chunk's positions).
        """
        S = tokens_BS.shape[1]
        if positions_S is None:
            positions_S = torch.arange(S, device=tokens_BS.device)
        h = self.tok_embeddings(tokens_BS) if self.tok_embeddings is not None else tokens_BS
        if self.pos_embeddings is not None:
            h = h + self.pos_embeddings(positions_S)[None]
        rope = self.rope(positions_S)
        for layer in self.layers:
            h = layer(h, rope)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h


@torch.no_grad()
def init_weights(model: Transformer) -> None:
    """GPT-2 style init: normal(0, 0.02) weights, zero biases, unit norms; ``wo``/``w2`` scaled
    by 1/sqrt(2 * layers). Uses the current RNG state (``build_model`` seeds it)."""
    out_std = INIT_STD / math.sqrt(2 * model.spec.layers)
    for name, mod in model.named_modules():
        if isinstance(mod, (RMSNorm, nn.LayerNorm)):
            mod.reset_parameters()
        elif isinstance(mod, nn.Linear):
            std = out_std if name.endswith((".wo", ".w2")) else INIT_STD
            nn.init.normal_(mod.weight, 0.0, std)
            if mod.bias is not None:
                nn.init.zeros_(mod.bias)
        elif isinstance(mod, nn.Embedding):
            nn.init.normal_(mod.weight, 0.0, INIT_STD)
        elif isinstance(mod, GroupedExperts):
            nn.init.normal_(mod.w1, 0.0, INIT_STD)
            nn.init.normal_(mod.w2, 0.0, out_std)
            if mod.w3 is not None:
                nn.init.normal_(mod.w3, 0.0, INIT_STD)


def build_model(
    spec: ModelSpec,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int | None = None,
) -> Transformer:
    """The reference model for ``spec`` on ``device`` with parameters in ``dtype``.

    On ``meta`` nothing is allocated or initialised (count parameters of any size).
    Otherwise the weights are initialised by ``init_weights``; with ``seed`` the
    init is deterministic (same weights on every rank of the same device type),
    and the caller's RNG state is left as it was.
    """
    device = torch.device(device)
    with torch.device(device):
        model = Transformer(spec)
    model = model.to(dtype=dtype)
    if device.type == "meta":
        return model
    if seed is None:
        init_weights(model)
        return model
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        init_weights(model)
    return model
