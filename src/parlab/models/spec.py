"""The model spec: one frozen description of a decoder-only transformer.

A ``ModelSpec`` is data only (no torch): vocabulary, width, depth, the
attention variant (MHA, GQA/MQA through ``kv_heads``, DeepSeek's multi-head
latent attention through ``mla``), the FFN (SwiGLU or GeLU), norms, position
encoding, tied embeddings and the MoE layout (``mla`` and ``moe`` are
``parlab.models.variants``' dataclasses). Every analytic answer (FLOPs,
memory ledger, wire table) and the reference torch model
(``parlab.models.reference``) are computed from it.

``ModelSpec.param_shapes()`` lists the parameters *exactly* as the reference
model registers them (names, shapes, order of ``model.named_parameters()``), so
parameter counts, ZeRO flat-shard sizes and FSDP per-parameter shard sizes are
computed from the same list a real model allocates. Nothing here touches a
process group or a device.

Naming follows torchtitan: ``tok_embeddings``, ``layers.<i>.attention_norm``,
``layers.<i>.attention.{wq,wk,wv,wo}`` (MLA: ``wq_a, q_norm, wq_b, wkv_a,
kv_norm, wkv_b, wo``), ``layers.<i>.ffn_norm``, ``layers.<i>.feed_forward.{w1,w2,w3}``
(w1 gate, w3 up, w2 down; GeLU FFNs have only ``w1`` up and ``w2`` down) or
``layers.<i>.moe.{router.gate, experts.{w1,w2,w3}, shared_experts.{w1,w2,w3}}``,
``norm``, ``output``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

from parlab.errors import UsageError
from parlab.models.variants import MLASpec, MoESpec, check_positive

ACTIVATIONS = ("swiglu", "gelu")
NORMS = ("rmsnorm", "layernorm")
POSITIONS = ("rope", "learned")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer, as data."""

    name: str
    """Catalog name, e.g. ``llama3.1-8b``."""
    vocab_size: int
    """Vocabulary size (rows of the embedding and of the output projection)."""
    hidden: int
    """Model width (``dim``, ``d_model``)."""
    layers: int
    """Number of transformer blocks."""
    heads: int
    """Query heads."""
    kv_heads: int | None = None
    """Key/value heads (GQA; 1 is MQA); ``None``: as many as ``heads`` (MHA)."""
    head_dim: int | None = None
    """Per-head dimension; ``None``: ``hidden // heads``."""
    ffn_hidden: int
    """FFN inner width of a dense layer (for SwiGLU the width of gate and up)."""
    activation: str = "swiglu"
    """``swiglu`` (gate w1, up w3, down w2) or ``gelu`` (up w1, down w2)."""
    norm: str = "rmsnorm"
    """``rmsnorm`` (weight only) or ``layernorm`` (weight and bias)."""
    norm_eps: float = 1e-5
    """Epsilon of every norm."""
    position: str = "rope"
    """``rope`` (rotary, no parameters) or ``learned`` (GPT-2's ``pos_embeddings``)."""
    rope_theta: float = 10000.0
    """Rotary base."""
    qkv_bias: bool = False
    """Biases on the q/k/v projections (Qwen2)."""
    linear_bias: bool = False
    """Biases on every linear except ``output`` (GPT-2); implies ``qkv_bias``."""
    tied_embeddings: bool = False
    """``output`` shares its weight with ``tok_embeddings``."""
    max_seq_len: int = 2048
    """Longest sequence the model was trained for (learned position table size)."""
    mla: MLASpec | None = None
    """Multi-head latent attention (DeepSeek); ``None``: MHA/GQA."""
    moe: MoESpec | None = None
    """Mixture-of-experts layout; ``None``: every layer dense."""
    published_params: int | None = None
    """Total parameter count as published (model card or checkpoint), for checking."""
    source: str = ""
    """Where the numbers come from."""

    def __post_init__(self) -> None:
        check_positive(
            self.name or "spec",
            vocab_size=self.vocab_size,
            hidden=self.hidden,
            layers=self.layers,
            heads=self.heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            ffn_hidden=self.ffn_hidden,
            norm_eps=self.norm_eps,
            rope_theta=self.rope_theta,
            max_seq_len=self.max_seq_len,
        )
        if self.activation not in ACTIVATIONS:
            raise UsageError(
                f"activation = {self.activation!r}: use one of {', '.join(ACTIVATIONS)}"
            )
        if self.norm not in NORMS:
            raise UsageError(f"norm = {self.norm!r}: use one of {', '.join(NORMS)}")
        if self.position not in POSITIONS:
            raise UsageError(f"position = {self.position!r}: use one of {', '.join(POSITIONS)}")
        if self.mla is None:
            if self.heads % self.n_kv_heads:
                raise UsageError(
                    f"kv_heads = {self.n_kv_heads} does not divide heads = {self.heads}: "
                    "each KV head must serve a whole group of query heads"
                )
            if self.head_dim is None and self.hidden % self.heads:
                raise UsageError(
                    f"hidden = {self.hidden} is not divisible by heads = {self.heads}: "
                    "set head_dim or change heads"
                )
            if self.position == "rope" and self.d_head % 2:
                raise UsageError(f"head_dim = {self.d_head}: rotary embedding needs an even size")
        if self.moe is not None and self.moe.first_dense_layers > self.layers:
            raise UsageError(
                f"moe.first_dense_layers = {self.moe.first_dense_layers} exceeds layers = {self.layers}"
            )

    # ----- derived sizes -------------------------------------------------------------------

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads (``heads`` for MHA)."""
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def d_head(self) -> int:
        """Per-head dimension of q, k and v (MLA: the value head dim)."""
        if self.mla is not None:
            return self.mla.v_head_dim
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def attention_kind(self) -> str:
        """``mha``, ``gqa``, ``mqa`` or ``mla``."""
        if self.mla is not None:
            return "mla"
        if self.n_kv_heads == self.heads:
            return "mha"
        return "mqa" if self.n_kv_heads == 1 else "gqa"

    @property
    def q_dim(self) -> int:
        """Width of all query heads together (``heads * head_dim``; MLA: with the rope part)."""
        if self.mla is not None:
            return self.heads * self.mla.qk_head_dim
        return self.heads * self.d_head

    @property
    def kv_dim(self) -> int:
        """Width of all key heads together (= value heads), the K or V row of a KV cache."""
        return self.n_kv_heads * self.d_head

    def is_moe_layer(self, i: int) -> bool:
        """Whether block ``i`` holds a MoE (else a dense FFN)."""
        m = self.moe
        if m is None or i < m.first_dense_layers:
            return False
        return (i - m.first_dense_layers) % m.layer_freq == 0

    @property
    def moe_layers(self) -> int:
        """How many blocks are MoE."""
        return sum(self.is_moe_layer(i) for i in range(self.layers))

    @property
    def ffn_mats(self) -> int:
        """Weight matrices in one FFN: 3 for SwiGLU, 2 for GeLU."""
        return 3 if self.activation == "swiglu" else 2

    def replace(self, **changes: Any) -> ModelSpec:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    # ----- parameters, exactly as the reference model registers them -------------------------

    def _norm_shapes(self, prefix: str, width: int) -> list[tuple[str, tuple[int, ...]]]:
        out = [(f"{prefix}.weight", (width,))]
        if self.norm == "layernorm":
            out.append((f"{prefix}.bias", (width,)))
        return out

    def _linear(
        self, prefix: str, out_f: int, in_f: int, bias: bool
    ) -> list[tuple[str, tuple[int, ...]]]:
        out = [(f"{prefix}.weight", (out_f, in_f))]
        if bias:
            out.append((f"{prefix}.bias", (out_f,)))
        return out

    def _ffn_shapes(self, prefix: str, width: int) -> list[tuple[str, tuple[int, ...]]]:
        h, b = self.hidden, self.linear_bias
        out = self._linear(f"{prefix}.w1", width, h, b) + self._linear(f"{prefix}.w2", h, width, b)
        if self.activation == "swiglu":
            out += self._linear(f"{prefix}.w3", width, h, b)
        return out

    def attention_shapes(self, prefix: str = "attention") -> list[tuple[str, tuple[int, ...]]]:
        """Parameters of one attention module, in registration order."""
        h = self.hidden
        qkv_b = self.qkv_bias or self.linear_bias
        if self.mla is not None:
            m = self.mla
            out: list[tuple[str, tuple[int, ...]]] = []
            if m.q_lora_rank:
                out += self._linear(f"{prefix}.wq_a", m.q_lora_rank, h, False)
                out += [(f"{prefix}.q_norm.weight", (m.q_lora_rank,))]
                out += self._linear(f"{prefix}.wq_b", self.q_dim, m.q_lora_rank, False)
            else:
                out += self._linear(f"{prefix}.wq", self.q_dim, h, False)
            out += self._linear(f"{prefix}.wkv_a", m.kv_lora_rank + m.qk_rope_head_dim, h, False)
            out += [(f"{prefix}.kv_norm.weight", (m.kv_lora_rank,))]
            out += self._linear(
                f"{prefix}.wkv_b",
                self.heads * (m.qk_nope_head_dim + m.v_head_dim),
                m.kv_lora_rank,
                False,
            )
            out += self._linear(f"{prefix}.wo", h, self.heads * m.v_head_dim, False)
            return out
        return (
            self._linear(f"{prefix}.wq", self.q_dim, h, qkv_b)
            + self._linear(f"{prefix}.wk", self.kv_dim, h, qkv_b)
            + self._linear(f"{prefix}.wv", self.kv_dim, h, qkv_b)
            + self._linear(f"{prefix}.wo", h, self.q_dim, self.linear_bias)
        )

    def block_shapes(self, i: int) -> list[tuple[str, tuple[int, ...]]]:
        """Parameters of block ``i`` (names relative to the block), in registration order."""
        out = self._norm_shapes("attention_norm", self.hidden)
        out += self.attention_shapes("attention")
        out += self._norm_shapes("ffn_norm", self.hidden)
        if self.is_moe_layer(i):
            m = self.moe
            assert m is not None
            e, f, h = m.num_experts, m.expert_ffn_hidden, self.hidden
            out += [("moe.router.gate.weight", (e, h))]
            out += [("moe.experts.w1", (e, f, h)), ("moe.experts.w2", (e, h, f))]
            if self.activation == "swiglu":
                out += [("moe.experts.w3", (e, f, h))]
            if m.shared_hidden:
                out += self._ffn_shapes("moe.shared_experts", m.shared_hidden)
        else:
            out += self._ffn_shapes("feed_forward", self.ffn_hidden)
        return out

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Every parameter as ``(name, shape)``, in the order of ``model.named_parameters()``."""
        out: list[tuple[str, tuple[int, ...]]] = [
            ("tok_embeddings.weight", (self.vocab_size, self.hidden))
        ]
        if self.position == "learned":
            out.append(("pos_embeddings.weight", (self.max_seq_len, self.hidden)))
        for i in range(self.layers):
            out += [(f"layers.{i}.{n}", s) for n, s in self.block_shapes(i)]
        out += self._norm_shapes("norm", self.hidden)
        if not self.tied_embeddings:
            out.append(("output.weight", (self.vocab_size, self.hidden)))
        return out

    # ----- counts ------------------------------------------------------------------------------

    @functools.cache  # noqa: B019 -- frozen and hashable: one entry per spec and block
    def block_params(self, i: int) -> int:
        """Parameters of block ``i``."""
        return sum(math.prod(s) for _, s in self.block_shapes(i))

    def embedding_params(self) -> int:
        """Parameters of the embedding tables (token, and learned positions)."""
        n = self.vocab_size * self.hidden
        if self.position == "learned":
            n += self.max_seq_len * self.hidden
        return n

    def output_params(self) -> int:
        """Parameters of the output projection (0 when tied)."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden

    def num_params(self, *, embedding: bool = True) -> int:
        """Total parameters; ``embedding=False`` leaves out the embedding tables (PaLM's N).

        The output projection counts as non-embedding when untied (it is a matmul per token),
        as torchtitan and PaLM count it; a tied output is the embedding itself.
        """
        blocks = self._blocks_total()
        final_norm = self.hidden * (2 if self.norm == "layernorm" else 1)
        n = blocks + final_norm + self.output_params()
        if embedding:
            n += self.embedding_params()
        return n

    @functools.cache  # noqa: B019 -- frozen and hashable: one entry per spec
    def _blocks_total(self) -> int:
        # blocks are identical except dense/MoE: count the two kinds once each
        dense = [i for i in range(self.layers) if not self.is_moe_layer(i)]
        moe = [i for i in range(self.layers) if self.is_moe_layer(i)]
        total = 0
        if dense:
            total += len(dense) * self.block_params(dense[0])
        if moe:
            total += len(moe) * self.block_params(moe[0])
        return total

    def num_active_params(self, *, embedding: bool = True) -> int:
        """Parameters one token touches: MoE layers count only ``top_k`` routed experts."""
        n = self.num_params(embedding=embedding)
        m = self.moe
        if m is not None:
            per_expert = self.ffn_mats * m.expert_ffn_hidden * self.hidden
            n -= self.moe_layers * (m.num_experts - m.top_k) * per_expert
        return n

    def to_json(self) -> dict[str, Any]:
        """The spec as plain JSON (for a document's ``workload``), with its counts."""
        out = dataclasses.asdict(self)
        out["params"] = self.num_params()
        out["active_params"] = self.num_active_params()
        out["attention_kind"] = self.attention_kind
        return out
