"""The model catalog: published architectures and parlab's training presets.

Published models carry the numbers of their Hugging Face ``config.json``
(cited per entry) and the total parameter count their checkpoint holds
(``published_params``); a test checks that ``ModelSpec.num_params()`` and the
reference model built on the meta device both match it.

Presets for runs:

- ``tiny``: ~230K parameters, 4 layers, GQA; builds and steps on the CPU in
  milliseconds (unit and multi-rank tests).
- ``tiny-moe``: ``tiny`` with 4 routed experts (top-2) and one shared expert.
- ``small``: ~19M parameters, 8 layers (the CPU demo model).
- ``1.3b``: Llama-style, hidden 2048, 24 layers, 16 heads (MHA), SwiGLU 5632
  (8/3 x 2048 rounded up to a multiple of 256, Llama's rule), vocab 32000
  (Llama-2's tokenizer): ~1.37B parameters, the GPU benchmark model.
- ``8b``: an alias of ``llama3.1-8b``.
"""

from __future__ import annotations

from pathlib import Path

from parlab.errors import UsageError
from parlab.models.hf import load_hf_config
from parlab.models.spec import ModelSpec
from parlab.models.variants import MLASpec, MoESpec
from parlab.units import shown

_HF = "https://huggingface.co/"

_SPECS: tuple[ModelSpec, ...] = (
    ModelSpec(
        name="gpt2-124m",
        vocab_size=50257,
        hidden=768,
        layers=12,
        heads=12,
        ffn_hidden=3072,
        activation="gelu",
        norm="layernorm",
        position="learned",
        linear_bias=True,
        tied_embeddings=True,
        max_seq_len=1024,
        published_params=124_439_808,
        source=_HF + "openai-community/gpt2 config.json",
    ),
    ModelSpec(
        name="gpt2-1.5b",
        vocab_size=50257,
        hidden=1600,
        layers=48,
        heads=25,
        ffn_hidden=6400,
        activation="gelu",
        norm="layernorm",
        position="learned",
        linear_bias=True,
        tied_embeddings=True,
        max_seq_len=1024,
        published_params=1_557_611_200,
        source=_HF + "openai-community/gpt2-xl config.json",
    ),
    ModelSpec(
        name="llama2-7b",
        vocab_size=32000,
        hidden=4096,
        layers=32,
        heads=32,
        ffn_hidden=11008,
        max_seq_len=4096,
        published_params=6_738_415_616,
        source=_HF + "meta-llama/Llama-2-7b-hf config.json",
    ),
    ModelSpec(
        name="llama2-13b",
        vocab_size=32000,
        hidden=5120,
        layers=40,
        heads=40,
        ffn_hidden=13824,
        max_seq_len=4096,
        published_params=13_015_864_320,
        source=_HF + "meta-llama/Llama-2-13b-hf config.json",
    ),
    ModelSpec(
        name="llama2-70b",
        vocab_size=32000,
        hidden=8192,
        layers=80,
        heads=64,
        kv_heads=8,
        ffn_hidden=28672,
        max_seq_len=4096,
        published_params=68_976_648_192,
        source=_HF + "meta-llama/Llama-2-70b-hf config.json",
    ),
    ModelSpec(
        name="llama3.1-8b",
        vocab_size=128256,
        hidden=4096,
        layers=32,
        heads=32,
        kv_heads=8,
        ffn_hidden=14336,
        rope_theta=500000.0,
        max_seq_len=131072,
        published_params=8_030_261_248,
        source=_HF + "meta-llama/Llama-3.1-8B config.json",
    ),
    ModelSpec(
        name="llama3.1-70b",
        vocab_size=128256,
        hidden=8192,
        layers=80,
        heads=64,
        kv_heads=8,
        ffn_hidden=28672,
        rope_theta=500000.0,
        max_seq_len=131072,
        published_params=70_553_706_496,
        source=_HF + "meta-llama/Llama-3.1-70B config.json",
    ),
    ModelSpec(
        name="llama3.1-405b",
        vocab_size=128256,
        hidden=16384,
        layers=126,
        heads=128,
        kv_heads=8,
        ffn_hidden=53248,
        rope_theta=500000.0,
        max_seq_len=131072,
        published_params=405_853_388_800,
        source=_HF + "meta-llama/Llama-3.1-405B config.json",
    ),
    ModelSpec(
        name="mixtral-8x7b",
        vocab_size=32000,
        hidden=4096,
        layers=32,
        heads=32,
        kv_heads=8,
        ffn_hidden=14336,
        rope_theta=1e6,
        max_seq_len=32768,
        moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden=14336),
        published_params=46_702_792_704,
        source=_HF + "mistralai/Mixtral-8x7B-v0.1 config.json",
    ),
    ModelSpec(
        name="qwen2.5-7b",
        vocab_size=152064,
        hidden=3584,
        layers=28,
        heads=28,
        kv_heads=4,
        ffn_hidden=18944,
        norm_eps=1e-6,
        rope_theta=1e6,
        qkv_bias=True,
        max_seq_len=131072,
        published_params=7_615_616_512,
        source=_HF + "Qwen/Qwen2.5-7B config.json",
    ),
    ModelSpec(
        name="qwen2.5-72b",
        vocab_size=152064,
        hidden=8192,
        layers=80,
        heads=64,
        kv_heads=8,
        ffn_hidden=29568,
        norm_eps=1e-6,
        rope_theta=1e6,
        qkv_bias=True,
        max_seq_len=131072,
        published_params=72_706_203_648,
        source=_HF + "Qwen/Qwen2.5-72B config.json",
    ),
    ModelSpec(
        name="deepseek-v3",
        vocab_size=129280,
        hidden=7168,
        layers=61,
        heads=128,
        ffn_hidden=18432,
        norm_eps=1e-6,
        max_seq_len=163840,
        mla=MLASpec(
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
        ),
        moe=MoESpec(
            num_experts=256,
            top_k=8,
            expert_ffn_hidden=2048,
            shared_experts=1,
            first_dense_layers=3,
            scoring="sigmoid",
            route_scale=2.5,
        ),
        # 671B main model as the paper states; the checkpoint's 685B adds the
        # multi-token-prediction module, which parlab does not model.
        published_params=671_000_000_000,
        source=_HF
        + "deepseek-ai/DeepSeek-V3 config.json; arXiv:2412.19437 (671B total, 37B active)",
    ),
    # ----- training presets ------------------------------------------------------------------
    ModelSpec(
        name="tiny",
        vocab_size=256,
        hidden=64,
        layers=4,
        heads=8,
        kv_heads=4,
        ffn_hidden=192,
        max_seq_len=256,
        source="parlab preset (tests)",
    ),
    ModelSpec(
        name="tiny-moe",
        vocab_size=256,
        hidden=64,
        layers=4,
        heads=8,
        kv_heads=4,
        ffn_hidden=192,
        max_seq_len=256,
        moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden=96, shared_experts=1),
        source="parlab preset (MoE tests)",
    ),
    ModelSpec(
        name="small",
        vocab_size=8192,
        hidden=384,
        layers=8,
        heads=8,
        kv_heads=4,
        ffn_hidden=1024,
        max_seq_len=1024,
        source="parlab preset (CPU demo)",
    ),
    ModelSpec(
        name="1.3b",
        vocab_size=32000,
        hidden=2048,
        layers=24,
        heads=16,
        ffn_hidden=5632,
        max_seq_len=4096,
        source="parlab preset (GPU benchmark, Llama-style)",
    ),
)

_BY_NAME: dict[str, ModelSpec] = {s.name: s for s in _SPECS}
ALIASES: dict[str, str] = {"8b": "llama3.1-8b", "gpt2": "gpt2-124m", "gpt2-xl": "gpt2-1.5b"}
"""Other names for catalog entries."""


def list_specs() -> list[str]:
    """Every catalog name (aliases not included), in catalog order."""
    return [s.name for s in _SPECS]


def get_spec(name: str) -> ModelSpec:
    """The catalog spec called ``name`` (case-insensitive, aliases allowed).

    A path to a Hugging Face ``config.json`` (or a folder holding one) is loaded
    with ``parlab.models.hf.load_hf_config``. Unknown names raise ``UsageError``
    listing the known ones.
    """
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key in _BY_NAME:
        return _BY_NAME[key]

    try:  # a name too long or odd for a path is no path
        is_path = name.endswith(".json") or Path(name).is_dir() or Path(name).is_file()
    except (OSError, ValueError):
        is_path = False
    if is_path:
        return load_hf_config(name)
    known = ", ".join([*list_specs(), *ALIASES])
    raise UsageError(
        f"unknown model {shown(name)}: use one of {known}, or a path to a Hugging Face config.json"
    )
