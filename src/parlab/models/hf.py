"""Load a Hugging Face ``config.json`` (a local file or a folder holding one) as a ``ModelSpec``.

No network: only the local file is read. Understood ``model_type`` values:
``gpt2``; the Llama family (``llama``, ``mistral``, ``qwen2``) and anything
else shaped like it (``hidden_size``, ``num_hidden_layers``, ...);
``mixtral`` and ``qwen2_moe`` / ``qwen3_moe`` (routed experts); ``deepseek_v2`` /
``deepseek_v3`` (MLA + MoE with shared experts; the multi-token-prediction
module is not modelled). A missing required field raises ``UsageError``
naming it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from parlab.errors import UsageError
from parlab.models.spec import MLASpec, ModelSpec, MoESpec


def _read(path: str | Path) -> tuple[dict[str, Any], Path]:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise UsageError(
            f"no config.json at {path}: give a config.json file or a folder holding one"
        )
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise UsageError(f"{p} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except (UnicodeDecodeError, RecursionError):
        raise UsageError(f"{p} is not a JSON config (not UTF-8, or nested too deep)") from None
    if not isinstance(data, dict):
        raise UsageError(f"{p} holds a JSON {type(data).__name__}, not a config object")
    return data, p


NUMERIC = (
    "n_embd", "vocab_size", "n_layer", "n_head", "n_inner", "layer_norm_epsilon", "n_positions",
    "num_attention_heads", "hidden_size", "num_hidden_layers", "num_key_value_heads", "head_dim",
    "rms_norm_eps", "rope_theta", "max_position_embeddings", "intermediate_size",
    "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size", "num_experts", "decoder_sparse_step", "q_lora_rank",
    "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
    "n_shared_experts", "first_k_dense_replace", "moe_layer_freq", "routed_scaling_factor",
)  # fmt: skip
"""The fields read as numbers: each must be one (a list, an object or text is refused)."""
WHOLE = ("layer_norm_epsilon", "rms_norm_eps", "rope_theta", "routed_scaling_factor")
"""... and all of them but these must be whole numbers."""


def _check_numbers(cfg: dict[str, Any], where: Path) -> None:
    """``UsageError`` naming the first numeric field that is not a finite number (a whole one
    where a count or size is meant), before anything converts it."""
    for field in NUMERIC:
        v = cfg.get(field)
        if v is None:
            continue
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if ok and field not in WHOLE:
            ok = float(v).is_integer() and abs(v) < 2**63
        if not ok:
            what = "a number" if field in WHOLE else "a whole number"
            raise UsageError(
                f"{where}: {field} = {str(v)[:40]!r} is a {type(v).__name__}, not {what}: fix "
                "the config"
            )


def _need(cfg: dict[str, Any], field: str, where: Path) -> Any:
    if cfg.get(field) is None:
        raise UsageError(f"{where} lacks the required field {field!r}: add it to the config")
    return cfg[field]


def load_hf_config(path: str | Path, *, name: str | None = None) -> ModelSpec:
    """The spec described by a Hugging Face ``config.json``."""
    cfg, where = _read(path)
    _check_numbers(cfg, where)
    kind = str(cfg.get("model_type", "")).lower()
    label = str(name or cfg.get("_name_or_path") or where.parent.name or kind or "hf-model")
    src = f"Hugging Face config {where}"
    if kind == "gpt2":
        return _gpt2(cfg, where, label, src)
    common = _llama_like(cfg, where, kind, label, src)
    g = lambda f: _need(cfg, f, where)  # noqa: E731
    if kind == "mixtral":
        common["ffn_hidden"] = int(g("intermediate_size"))
        common["moe"] = MoESpec(
            num_experts=int(g("num_local_experts")),
            top_k=int(g("num_experts_per_tok")),
            expert_ffn_hidden=int(g("intermediate_size")),
        )
    elif kind in ("qwen2_moe", "qwen3_moe"):
        _qwen_moe(cfg, g, common)
    elif kind in ("deepseek_v2", "deepseek_v3"):
        _deepseek(cfg, g, common)
    else:
        common["ffn_hidden"] = int(g("intermediate_size"))
    if common.get("head_dim") is not None:
        common["head_dim"] = int(common["head_dim"])
    return ModelSpec(**common)


def _gpt2(cfg: dict[str, Any], where: Path, label: str, src: str) -> ModelSpec:
    """``model_type: gpt2``: learned positions, LayerNorm, GELU, biases, tied embeddings."""
    h = int(_need(cfg, "n_embd", where))
    return ModelSpec(
        name=label,
        vocab_size=int(_need(cfg, "vocab_size", where)),
        hidden=h,
        layers=int(_need(cfg, "n_layer", where)),
        heads=int(_need(cfg, "n_head", where)),
        ffn_hidden=int(cfg.get("n_inner") or 4 * h),
        activation="gelu",
        norm="layernorm",
        norm_eps=float(cfg.get("layer_norm_epsilon") or 1e-5),
        position="learned",
        linear_bias=True,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        max_seq_len=int(_need(cfg, "n_positions", where)),
        source=src,
    )


def _llama_like(
    cfg: dict[str, Any], where: Path, kind: str, label: str, src: str
) -> dict[str, Any]:
    """The ``ModelSpec`` fields every Llama-shaped config shares (the FFN and experts apart)."""
    g = lambda f: _need(cfg, f, where)  # noqa: E731
    heads = int(g("num_attention_heads"))
    act = str(cfg.get("hidden_act", "silu")).lower()
    return dict(
        name=label,
        vocab_size=int(g("vocab_size")),
        hidden=int(g("hidden_size")),
        layers=int(g("num_hidden_layers")),
        heads=heads,
        kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=cfg.get("head_dim"),
        activation="swiglu" if act in ("silu", "swish", "swiglu") else "gelu",
        norm_eps=float(cfg.get("rms_norm_eps") or 1e-5),
        rope_theta=float(cfg.get("rope_theta") or 10000.0),
        qkv_bias=bool(cfg.get("attention_bias", kind in ("qwen2", "qwen2_moe"))),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_seq_len=int(cfg.get("max_position_embeddings") or 2048),
        source=src,
    )


def _qwen_moe(cfg: dict[str, Any], g: Callable[[str], Any], common: dict[str, Any]) -> None:
    """Qwen2-MoE / Qwen3-MoE: routed experts, an optional shared expert, a sparse step."""
    moe_ffn = int(g("moe_intermediate_size"))
    shared = int(cfg.get("shared_expert_intermediate_size") or 0)
    common["ffn_hidden"] = int(cfg.get("intermediate_size") or moe_ffn)
    common["moe"] = MoESpec(
        num_experts=int(g("num_experts")),
        top_k=int(g("num_experts_per_tok")),
        expert_ffn_hidden=moe_ffn,
        shared_experts=1 if shared else 0,
        shared_ffn_hidden=shared or None,
        layer_freq=int(cfg.get("decoder_sparse_step") or 1),
        normalize_top_k=bool(cfg.get("norm_topk_prob", False)),
    )


def _deepseek(cfg: dict[str, Any], g: Callable[[str], Any], common: dict[str, Any]) -> None:
    """DeepSeek-V2/V3: MLA attention, and routed plus shared experts after the dense layers."""
    common["kv_heads"] = None
    common["head_dim"] = None
    common["qkv_bias"] = False
    common["ffn_hidden"] = int(g("intermediate_size"))
    common["mla"] = MLASpec(
        q_lora_rank=int(cfg.get("q_lora_rank") or 0),
        kv_lora_rank=int(g("kv_lora_rank")),
        qk_nope_head_dim=int(g("qk_nope_head_dim")),
        qk_rope_head_dim=int(g("qk_rope_head_dim")),
        v_head_dim=int(g("v_head_dim")),
    )
    if cfg.get("n_routed_experts"):
        common["moe"] = MoESpec(
            num_experts=int(g("n_routed_experts")),
            top_k=int(g("num_experts_per_tok")),
            expert_ffn_hidden=int(g("moe_intermediate_size")),
            shared_experts=int(cfg.get("n_shared_experts") or 0),
            first_dense_layers=int(cfg.get("first_k_dense_replace") or 0),
            layer_freq=int(cfg.get("moe_layer_freq") or 1),
            scoring=str(cfg.get("scoring_func", "softmax")),
            normalize_top_k=bool(cfg.get("norm_topk_prob", False)),
            route_scale=float(cfg.get("routed_scaling_factor") or 1.0),
        )
