"""A parlab reference model as a Hugging Face Llama folder, so third-party engines
(``transformers``, vLLM, SGLang) serve the very weights and tokenizer parlab's engine does.

``export_llama(model, folder)`` writes ``config.json`` (``LlamaForCausalLM``),
``model.safetensors`` (or ``pytorch_model.bin`` where ``safetensors`` is missing),
``generation_config.json`` and the tokenizer (``tokenizer.export_hf``). Weight names follow
Hugging Face's Llama; the query and key projections are permuted from the interleaved RoPE
pairs parlab (and Meta) rotate to the half-split pairs Hugging Face rotates (the permutation
of ``convert_llama_weights_to_hf.py``), so both compute the same function.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from parlab.errors import UsageError
from parlab.serve import tokenizer


def _permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a q/k projection from interleaved pairs to half-split: per head, rows
    ``(0, 1), (2, 3), ...`` become ``0..D/2-1`` and ``D/2..D-1``."""
    out, hidden = w.shape
    return w.view(heads, out // heads // 2, 2, hidden).transpose(1, 2).reshape(out, hidden)


def llama_config(spec: Any, *, eos: bool = True) -> dict[str, Any]:
    tok = tokenizer.get()
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn_hidden,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.n_kv_heads,
        "head_dim": spec.d_head,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_seq_len,
        "rms_norm_eps": spec.norm_eps,
        "rope_theta": spec.rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": bool(spec.tied_embeddings),
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": None,
        "eos_token_id": tok.end_id if eos else None,
        "pad_token_id": tok.eos_id,
        "torch_dtype": "bfloat16",
    }


def export_llama(model: Any, folder: str | Path, *, eos: bool = True) -> Path:
    """Write ``model`` (a Llama-style reference model: RoPE, RMSNorm, SwiGLU, no biases, no
    MoE) as a Hugging Face folder; ``eos=False`` leaves generation unstopped by the
    end-of-sequence token (``ignore_eos`` for engines that lack the flag)."""
    spec = model.spec
    bad = spec.position != "rope" or spec.norm != "rmsnorm" or spec.activation != "swiglu"
    if bad or spec.moe is not None or spec.mla is not None or spec.linear_bias:
        raise UsageError(f"model {spec.name!r} is not Llama-style: only those export to HF")
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    sd: dict[str, torch.Tensor] = {"model.embed_tokens.weight": model.tok_embeddings.weight}
    for i, layer in enumerate(model.layers):
        a, f, p = layer.attention, layer.feed_forward, f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = _permute(a.wq.weight, spec.heads)
        sd[p + "self_attn.k_proj.weight"] = _permute(a.wk.weight, spec.n_kv_heads)
        sd[p + "self_attn.v_proj.weight"] = a.wv.weight
        sd[p + "self_attn.o_proj.weight"] = a.wo.weight
        sd[p + "mlp.gate_proj.weight"] = f.w1.weight
        sd[p + "mlp.up_proj.weight"] = f.w3.weight
        sd[p + "mlp.down_proj.weight"] = f.w2.weight
        sd[p + "input_layernorm.weight"] = layer.attention_norm.weight
        sd[p + "post_attention_layernorm.weight"] = layer.ffn_norm.weight
    sd["model.norm.weight"] = model.norm.weight
    if not spec.tied_embeddings:
        sd["lm_head.weight"] = model.output.weight
    sd = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in sd.items()}
    try:
        from safetensors.torch import save_file  # lazy: safetensors

        save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    except ImportError:
        torch.save(sd, d / "pytorch_model.bin")
    cfg = llama_config(spec, eos=eos)
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    gen = {"eos_token_id": cfg["eos_token_id"], "pad_token_id": cfg["pad_token_id"]}
    (d / "generation_config.json").write_text(json.dumps(gen, indent=2))
    tokenizer.export_hf(d)
    return d
