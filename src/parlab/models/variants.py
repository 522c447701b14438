"""The variants a ``ModelSpec`` may hold: DeepSeek's latent attention (``MLASpec``) and the
mixture-of-experts layout (``MoESpec``), data only, each checked on construction."""

from __future__ import annotations

from dataclasses import dataclass

from parlab.errors import UsageError

SCORINGS = ("softmax", "sigmoid")


def check_positive(owner: str, **values: int | float | None) -> None:
    """``UsageError`` naming ``<owner>.<field>`` for a value that is set and not positive."""
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise UsageError(f"{owner}.{name} = {value!r}: it must be a positive number")


@dataclass(frozen=True, kw_only=True)
class MLASpec:
    """DeepSeek multi-head latent attention: low-rank query and key/value projections."""

    q_lora_rank: int
    """Rank of the query down-projection (0: a plain ``wq`` without compression)."""
    kv_lora_rank: int
    """Rank of the joint key/value down-projection (the latent that a KV cache keeps)."""
    qk_nope_head_dim: int
    """Per-head query/key dimension without rotary embedding."""
    qk_rope_head_dim: int
    """Per-head query/key dimension with rotary embedding (the key part is shared by all heads)."""
    v_head_dim: int
    """Per-head value dimension."""

    def __post_init__(self) -> None:
        if self.q_lora_rank < 0:
            raise UsageError(
                f"mla.q_lora_rank = {self.q_lora_rank}: give 0 (no compression) or more"
            )
        check_positive(
            "mla",
            kv_lora_rank=self.kv_lora_rank,
            qk_nope_head_dim=self.qk_nope_head_dim,
            qk_rope_head_dim=self.qk_rope_head_dim,
            v_head_dim=self.v_head_dim,
        )
        if self.qk_rope_head_dim % 2:
            raise UsageError(
                f"mla.qk_rope_head_dim = {self.qk_rope_head_dim}: rotary needs an even size"
            )

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True, kw_only=True)
class MoESpec:
    """Mixture-of-experts layout: routed experts (token choice, top-k) plus optional shared experts."""

    num_experts: int
    """Routed experts per MoE layer."""
    top_k: int
    """Experts each token is sent to."""
    expert_ffn_hidden: int
    """FFN width of one routed expert."""
    shared_experts: int = 0
    """Shared experts every token goes through (DeepSeek); merged into one FFN of width
    ``shared_experts * shared_ffn_hidden`` named ``moe.shared_experts``."""
    shared_ffn_hidden: int | None = None
    """FFN width of one shared expert (default: ``expert_ffn_hidden``)."""
    first_dense_layers: int = 0
    """The first this-many layers use a dense FFN of width ``ModelSpec.ffn_hidden``."""
    layer_freq: int = 1
    """After the dense ones, every ``layer_freq``-th layer is MoE (the others dense)."""
    scoring: str = "softmax"
    """Router scores: ``softmax`` (Mixtral) or ``sigmoid`` (DeepSeek-V3)."""
    normalize_top_k: bool = True
    """Renormalise the top-k scores of a token to sum to 1."""
    route_scale: float = 1.0
    """Factor applied to the routed output (DeepSeek-V3: 2.5)."""

    def __post_init__(self) -> None:
        check_positive(
            "moe",
            num_experts=self.num_experts,
            top_k=self.top_k,
            expert_ffn_hidden=self.expert_ffn_hidden,
            shared_ffn_hidden=self.shared_ffn_hidden,
            layer_freq=self.layer_freq,
            route_scale=self.route_scale,
        )
        if self.top_k > self.num_experts:
            raise UsageError(
                f"moe.top_k = {self.top_k} exceeds moe.num_experts = {self.num_experts}: "
                "route each token to at most every expert"
            )
        if self.shared_experts < 0 or self.first_dense_layers < 0:
            raise UsageError("moe.shared_experts and moe.first_dense_layers must be 0 or more")
        if self.scoring not in SCORINGS:
            raise UsageError(f"moe.scoring = {self.scoring!r}: use one of {', '.join(SCORINGS)}")

    @property
    def shared_hidden(self) -> int:
        """Width of the merged shared-expert FFN (0 when there is none)."""
        return self.shared_experts * (self.shared_ffn_hidden or self.expert_ffn_hidden)
