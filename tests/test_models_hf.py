"""Hugging Face config.json loading: the same counts as the catalog, field errors named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parlab.errors import UsageError
from parlab.models import get_spec
from parlab.models.hf import load_hf_config

CONFIGS = {
    "llama3.1-8b": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
    },
    "qwen2.5-7b": {
        "model_type": "qwen2",
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    },
    "mixtral-8x7b": {
        "model_type": "mixtral",
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
    "gpt2-124m": {
        "model_type": "gpt2",
        "vocab_size": 50257,
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "n_positions": 1024,
    },
    "deepseek-v3": {
        "model_type": "deepseek_v3",
        "vocab_size": 129280,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "n_shared_experts": 1,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "moe_layer_freq": 1,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "scoring_func": "sigmoid",
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "tie_word_embeddings": False,
    },
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_hf_config_matches_catalog(name: str, tmp_path: Path) -> None:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIGS[name]))
    spec = load_hf_config(folder)
    assert spec.num_params() == get_spec(name).num_params()
    assert spec.param_shapes() == get_spec(name).param_shapes()
    # get_spec accepts the path too
    assert get_spec(str(folder / "config.json")).num_params() == spec.num_params()


def test_missing_field_is_named(tmp_path: Path) -> None:
    cfg = dict(CONFIGS["llama3.1-8b"])
    del cfg["num_hidden_layers"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match="num_hidden_layers"):
        load_hf_config(path)


def test_bad_values_and_files(tmp_path: Path) -> None:
    cfg = dict(CONFIGS["llama3.1-8b"], hidden_size=0)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match="hidden"):
        load_hf_config(path)
    with pytest.raises(UsageError, match=r"config\.json"):
        load_hf_config(tmp_path / "nowhere")
    path.write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        load_hf_config(path)
