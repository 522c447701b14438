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
from pathlib import Path
from typing import Any

from parlab.errors import UsageError
from parlab.models.spec import ModelSpec
from parlab.models.variants import MLASpec, MoESpec


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
    fields = _llama_fields(cfg, where, kind, label, src)
    if kind == "mixtral":
        fields.update(_mixtral_fields(cfg, where))
    elif kind in ("qwen2_moe", "qwen3_moe"):
        fields.update(_qwen_moe_fields(cfg, where))
    elif kind in ("deepseek_v2", "deepseek_v3"):
        fields.update(_deepseek_fields(cfg, where))
    else:
        fields["ffn_hidden"] = int(_need(cfg, "intermediate_size", where))
    if fields.get("head_dim") is not None:
        fields["head_dim"] = int(fields["head_dim"])
    return ModelSpec(**fields)


def _gpt2(cfg: dict[str, Any], where: Path, label: str, src: str) -> ModelSpec:
    """GPT-2's own field names: learned positions, LayerNorm, GELU, biases."""
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


def _llama_fields(
    cfg: dict[str, Any], where: Path, kind: str, label: str, src: str
) -> dict[str, Any]:
    """The fields every Llama-shaped config shares (all but the feed-forward)."""
    heads = int(_need(cfg, "num_attention_heads", where))
    act = str(cfg.get("hidden_act", "silu")).lower()
    return dict(
        name=label,
        vocab_size=int(_need(cfg, "vocab_size", where)),
        hidden=int(_need(cfg, "hidden_size", where)),
        layers=int(_need(cfg, "num_hidden_layers", where)),
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


def _mixtral_fields(cfg: dict[str, Any], where: Path) -> dict[str, Any]:
    """Mixtral: every layer's feed-forward is routed experts of ``intermediate_size``."""
    ffn = int(_need(cfg, "intermediate_size", where))
    moe = MoESpec(
        num_experts=int(_need(cfg, "num_local_experts", where)),
        top_k=int(_need(cfg, "num_experts_per_tok", where)),
        expert_ffn_hidden=int(_need(cfg, "intermediate_size", where)),
    )
    return {"ffn_hidden": ffn, "moe": moe}


def _qwen_moe_fields(cfg: dict[str, Any], where: Path) -> dict[str, Any]:
    """Qwen MoE: routed experts every ``decoder_sparse_step`` layers, an optional shared one."""
    moe_ffn = int(_need(cfg, "moe_intermediate_size", where))
    shared = int(cfg.get("shared_expert_intermediate_size") or 0)
    ffn = int(cfg.get("intermediate_size") or moe_ffn)
    moe = MoESpec(
        num_experts=int(_need(cfg, "num_experts", where)),
        top_k=int(_need(cfg, "num_experts_per_tok", where)),
        expert_ffn_hidden=moe_ffn,
        shared_experts=1 if shared else 0,
        shared_ffn_hidden=shared or None,
        layer_freq=int(cfg.get("decoder_sparse_step") or 1),
        normalize_top_k=bool(cfg.get("norm_topk_prob", False)),
    )
    return {"ffn_hidden": ffn, "moe": moe}


def _deepseek_fields(cfg: dict[str, Any], where: Path) -> dict[str, Any]:
    """DeepSeek V2/V3: multi-head latent attention, and routed plus shared experts."""
    g = lambda f: _need(cfg, f, where)  # noqa: E731
    fields: dict[str, Any] = {"kv_heads": None, "head_dim": None, "qkv_bias": False}
    fields["ffn_hidden"] = int(g("intermediate_size"))
    fields["mla"] = MLASpec(
        q_lora_rank=int(cfg.get("q_lora_rank") or 0),
        kv_lora_rank=int(g("kv_lora_rank")),
        qk_nope_head_dim=int(g("qk_nope_head_dim")),
        qk_rope_head_dim=int(g("qk_rope_head_dim")),
        v_head_dim=int(g("v_head_dim")),
    )
    if cfg.get("n_routed_experts"):
        fields["moe"] = MoESpec(
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
    return fields
