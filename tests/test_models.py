"""Model specs, catalog and the reference model: counts, names, forward semantics."""

from __future__ import annotations

import pytest
import torch

from parlab.errors import UsageError
from parlab.models import MLASpec, MoESpec, get_spec, list_specs
from parlab.models.reference import FeedForward, build_model

PUBLISHED = [n for n in list_specs() if get_spec(n).published_params]


@pytest.mark.parametrize("name", list_specs())
def test_meta_model_parameters_equal_spec_shapes(name: str) -> None:
    spec = get_spec(name)
    model = build_model(spec, device="meta")
    got = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert got == spec.param_shapes()
    assert sum(p.numel() for p in model.parameters()) == spec.num_params()


@pytest.mark.parametrize("name", PUBLISHED)
def test_param_count_matches_published(name: str) -> None:
    spec = get_spec(name)
    published = spec.published_params
    assert published is not None
    if name == "deepseek-v3":  # published as "671B"
        assert abs(spec.num_params() - published) / published < 0.001
        assert 36.5e9 < spec.num_active_params() < 38e9  # "37B activated"
    else:
        assert spec.num_params() == published


def test_presets_and_aliases() -> None:
    assert 1e5 < get_spec("tiny").num_params() < 1e6
    assert 10e6 < get_spec("small").num_params() < 30e6
    s = get_spec("1.3b")
    assert (s.hidden, s.layers, s.heads, s.vocab_size, s.activation) == (
        2048,
        24,
        16,
        32000,
        "swiglu",
    )
    assert get_spec("8B") is get_spec("llama3.1-8b")
    m = get_spec("mixtral-8x7b")
    assert 12.5e9 < m.num_active_params() < 13e9


def test_unknown_model_names_known_ones() -> None:
    with pytest.raises(UsageError, match=r"llama3\.1-405b"):
        get_spec("llama9-1t")


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"heads": 8, "kv_heads": 3}, "kv_heads"),
        ({"hidden": 0}, "hidden"),
        ({"layers": -1}, "layers"),
        ({"activation": "relu"}, "activation"),
        ({"hidden": 60, "heads": 8}, "hidden"),
    ],
)
def test_bad_spec_names_field(changes: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        get_spec("tiny").replace(**changes)


def _tiny_variants() -> dict[str, object]:
    tiny = get_spec("tiny")
    return {
        "tiny": tiny,
        "tiny-moe": get_spec("tiny-moe"),
        "gpt2-like": tiny.replace(
            name="tiny-gpt2",
            activation="gelu",
            norm="layernorm",
            position="learned",
            linear_bias=True,
            tied_embeddings=True,
            kv_heads=None,
        ),
        "mqa-qkv-bias": tiny.replace(name="tiny-mqa", kv_heads=1, qkv_bias=True),
        "mla": tiny.replace(
            name="tiny-mla",
            mla=MLASpec(
                q_lora_rank=32,
                kv_lora_rank=16,
                qk_nope_head_dim=8,
                qk_rope_head_dim=4,
                v_head_dim=8,
            ),
            moe=MoESpec(
                num_experts=4,
                top_k=2,
                expert_ffn_hidden=32,
                shared_experts=1,
                first_dense_layers=1,
                scoring="sigmoid",
                route_scale=2.5,
            ),
        ),
    }


@pytest.mark.parametrize("variant", list(_tiny_variants()))
def test_forward_backward_causal_and_seeded(variant: str) -> None:
    spec = _tiny_variants()[variant]
    model = build_model(spec, seed=3)
    again = build_model(spec, seed=3)
    for (n, a), (_, b) in zip(model.named_parameters(), again.named_parameters(), strict=True):
        assert torch.equal(a, b), n
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, spec.vocab_size, (2, 12), generator=gen)
    logits = model(tokens)
    assert logits.shape == (2, 12, spec.vocab_size)
    assert torch.isfinite(logits).all()
    # causal: changing the last token leaves every earlier position unchanged
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % spec.vocab_size
    with torch.no_grad():
        assert torch.allclose(model(changed)[:, :-1], logits[:, :-1], atol=1e-5)
    logits.float().square().mean().backward()
    for n, p in model.named_parameters():
        assert p.grad is not None, n


def test_blocks_alone_reproduce_the_model() -> None:
    spec = get_spec("tiny")
    model = build_model(spec, seed=0)
    tokens = torch.randint(0, spec.vocab_size, (2, 10))
    with torch.no_grad():
        h = model.tok_embeddings(tokens)
        rope = model.rope(torch.arange(10))
        for block in model.layers:
            h = block(h, rope)
        out = model.output(model.norm(h))
        assert torch.allclose(out, model(tokens), atol=1e-6)
        # a pipeline-style stage: tok_embeddings pruned, hidden states in and out
        model.tok_embeddings, model.norm, model.output = None, None, None
        h0 = build_model(spec, seed=0).tok_embeddings(tokens)
        assert torch.allclose(model(h0), h, atol=1e-6)


def test_gqa_equals_mha_with_repeated_kv_heads() -> None:
    gqa = get_spec("tiny")
    mha = gqa.replace(name="tiny-mha", kv_heads=None)
    a, b = build_model(gqa, seed=1), build_model(mha, seed=1)
    rep = gqa.heads // gqa.n_kv_heads
    d = gqa.d_head
    with torch.no_grad():
        sd = a.state_dict()
        for k, v in list(sd.items()):
            if k.endswith(("wk.weight", "wv.weight")):
                sd[k] = v.view(-1, d, v.shape[1]).repeat_interleave(rep, 0).reshape(-1, v.shape[1])
        b.load_state_dict(sd)
        tokens = torch.randint(0, gqa.vocab_size, (2, 9))
        assert torch.allclose(a(tokens), b(tokens), atol=1e-5)


def test_moe_with_one_expert_is_its_ffn() -> None:
    spec = get_spec("tiny").replace(
        name="tiny-1e", moe=MoESpec(num_experts=1, top_k=1, expert_ffn_hidden=48)
    )
    model = build_model(spec, seed=0)
    moe = model.layers[0].moe
    ffn = FeedForward(spec, 48)
    with torch.no_grad():
        ffn.w1.weight.copy_(moe.experts.w1[0])
        ffn.w2.weight.copy_(moe.experts.w2[0])
        ffn.w3.weight.copy_(moe.experts.w3[0])
        x = torch.randn(2, 5, spec.hidden)
        assert torch.allclose(
            moe(x.reshape(-1, spec.hidden)).y_TH, ffn(x).reshape(-1, spec.hidden), atol=1e-6
        )


def test_dtype_and_meta() -> None:
    m = build_model(get_spec("tiny"), dtype=torch.bfloat16, seed=0)
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    big = build_model(get_spec("llama3.1-405b"), device="meta")
    assert next(big.parameters()).is_meta
