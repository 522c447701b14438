"""The reference replica's engine against the unbatched reference model, token for token;
its pages, scheduler, sampler and CUDA-graph step; tensor parallelism; the KV transfer."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from parlab.errors import UsageError
from parlab.models import get_spec
from parlab.models.reference import build_model
from parlab.runtime.testing import run_ranks
from parlab.serve import kvxfer
from parlab.serve.engine import Engine, EngineConfig, Sequence
from parlab.serve.engine.blocks import BlockPool
from parlab.serve.engine.sampling import sample, uniform
from parlab.serve.profiling import profile_engine
from parlab.serve.replica import serving_spec
from parlab.serve.tokenizer import get as get_tokenizer

pytestmark = pytest.mark.timeout(90)
TOK = get_tokenizer()


@pytest.fixture(scope="module")
def model():
    return build_model(serving_spec("tiny"), seed=0)


def _allowed(vocab: int) -> torch.Tensor:
    mask = torch.full((vocab,), float("-inf"))
    mask[TOK.sampleable] = 0
    return mask


def reference_greedy(model, prompt: list[int], n: int) -> list[int]:
    """The unbatched reference: the model's full forward over the growing sequence, the
    sampleable token of highest logit each time (end-of-sequence ignored)."""
    mask = _allowed(model.spec.vocab_size)
    toks = list(prompt)
    for _ in range(n):
        with torch.no_grad():
            lg = model(torch.tensor([toks]))[0, -1].float()
        toks.append(int((lg + mask).argmax()))
    return toks[len(prompt) :]


PROMPTS = [
    "the shared system prompt, then question one",
    "x",
    "the shared system prompt, then question two",
    "the shared system prompt, then question one",
    "a different and somewhat longer prompt than the rest of them, long enough to chunk",
]


@pytest.mark.parametrize(
    ("prefix_cache", "step_tokens", "block"),
    [(False, 2048, 8), (True, 2048, 8), (True, 12, 8), (False, 12, 64)],
    ids=["no-cache", "cache", "cache-chunked", "chunked-page-64"],
)  # fmt: skip
def test_engine_equals_the_reference_token_for_token(
    model, prefix_cache, step_tokens, block
) -> None:
    """5 requests through 3 rows (joins and leaves mid-run), pages of 8 tokens (or 64: a page
    longer than any prompt), and with a 12-token step budget every prompt longer than it
    prefilled in chunks mixed with decode."""
    cfg = EngineConfig(
        max_batch=3, max_len=256, block=block, cache_blocks=8, prefix_cache=prefix_cache,
        max_step_tokens=step_tokens,
    )  # fmt: skip
    eng = Engine(model, cfg)
    prompts = [TOK.encode(p) for p in PROMPTS]
    outs = eng.generate(prompts, 10, ignore_eos=True)
    for p, o in zip(prompts, outs, strict=True):
        assert o == reference_greedy(model, p, 10)
    assert max(e["decode"] for e in eng.log) == 3
    if step_tokens < 20:
        mixed = [e for e in eng.log if e["prefill"] and e["decode"]]
        assert mixed and max(e["tokens"] for e in eng.log) <= step_tokens
    if prefix_cache:
        assert sum(e["cached"] for e in eng.log) >= 8  # the repeated prompt hit its pages
    assert eng.sched.pool.available == cfg.num_blocks - 1  # every page back, page 0 never out


def test_prefix_hits_share_pages_by_reference(model) -> None:
    eng = Engine(model, EngineConfig(max_batch=2, max_len=128, block=8, cache_blocks=4))
    p = TOK.encode("0123456789 abcdefghijklmnopqrstuv the block")
    assert len(p) > 17
    a = Sequence(prompt=p, max_tokens=20, ignore_eos=True)
    eng.add(a)
    for _ in range(3):
        eng.step()
    b = Sequence(prompt=p, max_tokens=20, ignore_eos=True)
    eng.add(b)
    eng.step()
    full = (len(p) - 1) // 8
    assert b.cached_tokens == full * 8
    assert b.blocks[:full] == a.blocks[:full]  # the same pages, not copies
    assert all(eng.sched.pool.ref[x] == 2 for x in a.blocks[:full])
    while eng.has_work():
        eng.step()
    assert a.output == b.output == reference_greedy(model, p, 20)


def test_block_pool_reuses_idle_cached_pages_least_recent_first() -> None:
    pool = BlockPool(5)  # pages 1..4
    a = pool.take(2)
    for i, b in enumerate(a):
        pool.register(b, 100 + i)
    pool.release(a)  # cached and idle
    assert pool.available == 4 and pool.match([100, 101, 7]) == a
    pool.share(pool.match([100]))
    assert pool.ref[a[0]] == 1 and pool.available == 3
    got = pool.take(3)  # 2 free, then the idle cached page a[1] (its hash dropped)
    assert a[1] in got and 0 not in got and pool.match([100, 101]) == [a[0]]
    with pytest.raises(ValueError, match="available"):
        pool.take(1)


def test_admission_waits_for_pages_and_never_preempts(model) -> None:
    """A pool with pages for one request at a time: the second waits, then runs."""
    cfg = EngineConfig(max_batch=2, max_len=64, block=8, cache_blocks=0)
    eng = Engine(model, cfg)
    eng.sched.pool.take(cfg.blocks_per_seq)  # leave one sequence's worth of pages
    outs = eng.generate([TOK.encode("first one"), TOK.encode("second one")], 50, ignore_eos=True)
    assert max(e["decode"] for e in eng.log) == 1
    assert outs[1] == reference_greedy(model, TOK.encode("second one"), 50)


def test_sampled_rows_follow_their_seed_in_any_batch(model) -> None:
    def run(others: int, top_p: float = 1.0) -> list[int]:
        eng = Engine(model, EngineConfig(max_batch=4, max_len=128))
        seq = Sequence(
            prompt=TOK.encode("sample me"), max_tokens=8, temperature=0.9, seed=7, top_p=top_p,
            ignore_eos=True,
        )  # fmt: skip
        eng.add(seq)
        for i in range(others):  # greedy and differently seeded neighbours
            t = 0.0 if i % 2 == 0 else 1.3
            eng.add(Sequence(prompt=TOK.encode(f"other {i}"), max_tokens=5, temperature=t, seed=i))
        while eng.has_work():
            eng.step()
        return seq.output

    alone = run(0)
    assert run(3) == alone
    assert len(set(alone)) > 1 and all(t in set(TOK.sampleable) for t in alone)
    greedy = reference_greedy(model, TOK.encode("sample me"), 8)
    assert run(2, top_p=1e-6) == greedy  # a nucleus of one token is greedy


def test_gumbel_sampling_draws_the_softmax_and_greedy_takes_the_argmax() -> None:
    V, R = 6, 4000
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, 0.1]).repeat(R, 1)
    seed = torch.arange(R, dtype=torch.long)
    common = dict(
        allowed_V=torch.zeros(V), stop_ids=torch.tensor([5]), top_p_R=torch.ones(R),
        seed_R=seed, step_R=torch.zeros(R, dtype=torch.long), eos_ok_R=torch.zeros(R, dtype=torch.bool),
    )  # fmt: skip
    drawn = sample(logits, temperature_R=torch.ones(R), **common)
    freq = torch.bincount(drawn, minlength=V).float() / R
    want = torch.softmax(logits[0], 0).clone()
    want[5] = 0  # a stop id where end-of-sequence is not allowed
    want /= want.sum()
    assert (freq - want).abs().max() < 0.03
    assert (sample(logits, temperature_R=torch.zeros(R), **common) == 0).all()
    u = uniform(seed, torch.zeros(R, dtype=torch.long), V)
    assert float(u.min()) > 0 and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.01


def test_end_of_sequence_stops_unless_ignored() -> None:
    """A model whose output favours ``<|end|>``: generation stops there (``stop``); with
    ``ignore_eos`` it runs to ``max_tokens`` (``length``)."""
    m = build_model(serving_spec("tiny"), seed=0)
    head = torch.nn.Linear(m.spec.hidden, m.spec.vocab_size)
    with torch.no_grad():
        head.weight.copy_(m.output.weight)
        head.bias.zero_()
        head.bias[TOK.end_id] = 100.0
    m.output = head
    eng = Engine(m, EngineConfig(max_batch=2, max_len=64))
    a = Sequence(prompt=TOK.encode("stop soon"), max_tokens=10)
    b = Sequence(prompt=TOK.encode("stop soon"), max_tokens=10, ignore_eos=True)
    eng.add(a)
    eng.add(b)
    while eng.has_work():
        eng.step()
    assert a.finish_reason == "stop" and a.output[-1] == TOK.end_id and len(a.output) < 10
    assert b.finish_reason == "length" and len(b.output) == 10 and TOK.end_id not in b.output


@pytest.mark.parametrize("variant", ["gqa", "mha", "mqa", "learned", "moe"])
def test_padded_decode_step_equals_the_eager_step(variant: str) -> None:
    """The captured step's inputs (rows padded to the batch bucket with token 0 on the null
    page, the page table at full width), run eagerly, give the eager engine's tokens."""
    tiny = serving_spec("tiny")
    spec = {
        "gqa": tiny,
        "mha": dataclasses.replace(tiny, kv_heads=None),
        "mqa": dataclasses.replace(tiny, kv_heads=1),
        "learned": dataclasses.replace(
            tiny, position="learned", norm="layernorm", activation="gelu", linear_bias=True,
            max_seq_len=512,
        ),
        "moe": serving_spec("tiny-moe"),
    }[variant]  # fmt: skip
    m = build_model(spec, seed=1)
    cfg = EngineConfig(max_batch=5, max_len=96, block=8, graph_batches=(1, 2, 4))
    prompts = [TOK.encode(t) for t in ("alpha beta", "g", "a longer prompt here", "z z")]
    eager = Engine(m, cfg).generate(prompts, 7, ignore_eos=True)
    padded = Engine(m, cfg)
    padded.runner.static_decode = True
    assert padded.generate(prompts, 7, ignore_eos=True) == eager
    assert {e["graph"] for e in padded.log if e["kind"] == 1} >= {4}
    for p, o in zip(prompts, eager, strict=True):
        assert o == reference_greedy(m, p, 7)


def test_config_and_engine_reject_what_cannot_run(model) -> None:
    with pytest.raises(UsageError, match="max-step-tokens"):
        EngineConfig(max_batch=8, max_step_tokens=4)
    with pytest.raises(UsageError, match="attention"):
        EngineConfig(attention="flash")
    with pytest.raises(UsageError, match="cuda-graphs"):
        Engine(model, EngineConfig(cuda_graphs=True))
    with pytest.raises(UsageError, match="vocab"):
        Engine(build_model(get_spec("tiny"), seed=0))
    eng = Engine(model, EngineConfig(max_len=32))
    with pytest.raises(UsageError, match="max-len"):
        eng.add(Sequence(prompt=[5] * 30, max_tokens=5))
    with pytest.raises(UsageError, match="outside"):
        eng.add(Sequence(prompt=[10**6], max_tokens=1))


def test_a_failed_step_frees_its_requests_and_the_engine_goes_on(model, monkeypatch) -> None:
    eng = Engine(model, EngineConfig(max_batch=2, max_len=64))
    bad = Sequence(prompt=TOK.encode("boom"), max_tokens=4)
    eng.add(bad)
    real = eng.runner.run
    monkeypatch.setattr(eng.runner, "run", lambda inp: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        eng.step()
    assert eng.fail_step() == [bad] and bad.finish_reason == "error"
    monkeypatch.setattr(eng.runner, "run", real)
    assert not eng.has_work() and eng.sched.pool.available == eng.config.num_blocks - 1
    assert eng.generate([TOK.encode("after")], 3, ignore_eos=True)[0] == reference_greedy(
        model, TOK.encode("after"), 3
    )


def test_profile_fits_the_step_costs_from_the_engines_own_steps(model) -> None:
    eng = Engine(model, EngineConfig(max_batch=4, max_len=256))
    prof = profile_engine(eng, prefill_lens=(32, 128), batches=(1, 4), long_prompt=96)
    from parlab.serve.sim import PROFILE_TERMS

    assert all(prof[k] >= 0 for k in PROFILE_TERMS) and prof["decode_base_s"] > 0
    assert prof["steps"] == len(prof["samples"]) > 20
    assert not eng.log and eng.sched.pool.cached == 0  # the profile leaves no trace


# ----- GPU: the Triton kernels and the captured graphs ---------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("block", [16, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graphs_and_triton_equal_the_torch_engine_on_gpu(
    dtype: torch.dtype, block: int
) -> None:
    m = build_model(serving_spec("tiny"), device="cuda", dtype=dtype, seed=0)
    prompts = [TOK.encode(p) for p in PROMPTS]
    cfg = EngineConfig(max_batch=4, max_len=256, block=block, max_step_tokens=64)
    ref = Engine(m, dataclasses.replace(cfg, cuda_graphs=False, attention="torch"))
    fast = Engine(m, cfg)
    assert fast.runner.use_graphs and fast.runner.backend == "triton" and fast.runner.fused
    assert not ref.runner.fused
    a = ref.generate(prompts, 12, ignore_eos=True)
    b = fast.generate(prompts, 12, ignore_eos=True)
    same = np.mean([x == y for x, y in zip(a, b, strict=True)])
    assert same >= (1.0 if dtype == torch.float32 else 0.6)
    assert any(e["graph"] for e in fast.log)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("T", "H"), [(1, 64), (37, 2048), (130, 100)])
def test_fused_norm_and_swiglu_kernels_equal_torch_on_gpu(dtype, T: int, H: int) -> None:
    from parlab.serve.engine.kernels_norm import add_rms_norm, silu_mul

    g = torch.Generator(device="cuda").manual_seed(T)
    h, d = (torch.randn(T, H, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    w = torch.randn(H, device="cuda", dtype=dtype, generator=g)
    want_h = h + d
    want_x = torch.nn.functional.rms_norm(want_h, (H,), w, 1e-5)
    x = add_rms_norm(h, d, w, 1e-5)
    assert torch.equal(h, want_h)  # the add rounds as torch's does, in place
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(x, want_x, rtol=tol, atol=tol)
    ab = torch.randn(T, 2 * H, device="cuda", dtype=dtype, generator=g)
    a, b = ab.chunk(2, dim=-1)
    torch.testing.assert_close(silu_mul(ab), torch.nn.functional.silu(a) * b, rtol=tol, atol=tol)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("T", "N", "K", "D"), [(1, 16, 16, 128), (300, 16, 16, 128), (37, 5, 1, 48)]
)
def test_rope_store_equals_torch_on_gpu(dtype, T: int, N: int, K: int, D: int) -> None:
    """The rotated queries and keys and the values in their slots, as the torch path writes
    them; nothing else written (outputs poisoned with NaN first)."""
    from parlab.models.reference import apply_rope, rope_table
    from parlab.serve.engine.kernels import rope_store

    g = torch.Generator(device="cuda").manual_seed(T + N)
    qkv = torch.randn(T, (N + 2 * K) * D, device="cuda", dtype=dtype, generator=g)
    rope = rope_table(torch.randint(0, 4000, (T,), device="cuda", generator=g), D, 1e4)
    slots = torch.randperm(2 * T + 3, device="cuda", generator=g)[:T]

    def nan(*shape: int) -> torch.Tensor:
        return torch.full(shape, float("nan"), device="cuda", dtype=dtype)

    kc, vc, q = nan(2 * T + 3, K, D), nan(2 * T + 3, K, D), nan(T, N, D)
    rope_store(qkv, rope, slots, q, kc.view(-1, 1, K, D), vc.view(-1, 1, K, D), N, K, D)
    wq, wk, wv = qkv.view(1, T, N + 2 * K, D).split([N, K, K], dim=2)
    wkc, wvc = nan(2 * T + 3, K, D), nan(2 * T + 3, K, D)
    wkc[slots], wvc[slots] = apply_rope(wk, rope)[0], wv[0]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(q, apply_rope(wq, rope)[0], rtol=tol, atol=tol)
    torch.testing.assert_close(kc, wkc, rtol=tol, atol=tol, equal_nan=True)
    torch.testing.assert_close(vc, wvc, rtol=0, atol=0, equal_nan=True)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize(
    ("N", "K", "D", "page"), [(16, 16, 128, 16), (8, 2, 64, 64), (4, 1, 48, 8), (4, 2, 8, 8)]
)
def test_paged_decode_equals_sdpa_over_the_gathered_pages_on_gpu(
    dtype: torch.dtype, splits: int, N: int, K: int, D: int, page: int
) -> None:
    """The decode kernel, one split or several, MHA, GQA and MQA, lengths 1 to a few pages:
    float32 SDPA over each sequence's gathered pages (float32 caches to 1e-5: no TF32)."""
    from parlab.serve.engine.kernels import DecodeConfig, paged_decode

    g = torch.Generator(device="cuda").manual_seed(N + page)
    B, M = 6, 5
    kc = torch.randn(B * M + 1, page, K, D, device="cuda", dtype=dtype, generator=g)
    vc = torch.randn(kc.shape, device="cuda", dtype=dtype, generator=g)
    table = (torch.randperm(B * M, device="cuda", generator=g) + 1).view(B, M)
    lens = torch.tensor([1, page - 1, page, page + 1, 3 * page + 2, M * page], device="cuda")
    q = torch.randn(B, N, D, device="cuda", dtype=dtype, generator=g)
    out = torch.full_like(q, float("nan"))
    cfg = DecodeConfig(block_n=32, splits=splits)
    paged_decode(q, kc, vc, table, lens, out, D**-0.5, cfg)
    for b in range(B):
        n = int(lens[b])
        k = kc[table[b]].reshape(-1, K, D)[:n].float().repeat_interleave(N // K, 1)
        v = vc[table[b]].reshape(-1, K, D)[:n].float().repeat_interleave(N // K, 1)
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[b].float()[:, None], k.transpose(0, 1), v.transpose(0, 1)
        )[:, 0]
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out[b].float(), ref, rtol=tol, atol=tol)


@cuda
def test_decode_kernel_splits_only_until_every_sm_has_a_program() -> None:
    from parlab.serve.engine.kernels import decode_config

    assert decode_config(32, 16, 132).splits == 1  # 512 (sequence, kv head) programs
    assert decode_config(1, 16, 132).splits == 16  # 16 -> 256 programs
    assert decode_config(1, 1, 132).splits == 64  # at most 64
    assert decode_config(8, 2, 132, per_sm=2).splits == 32  # 16 -> 512 >= 264
    assert decode_config(128, 16, 132, block_n=32).block_n == 32


# ----- tensor-parallel replica ----------------------------------------------------------------------

_TP_PROMPTS = ["the shared system prompt, one", "xy", "the shared system prompt!"]


def _tp_generate(ctx):
    from parlab.serve.tp import build_tp_engine, worker_loop

    cfg = EngineConfig(max_batch=2, max_len=128, block=8, cache_blocks=8)
    eng = build_tp_engine(ctx, model="tiny", dtype="float32", seed=0, config=cfg)
    outs = None
    if ctx.rank != 0:
        worker_loop(eng)  # in lockstep with rank 0's steps until it says stop
    else:
        outs = eng.generate([TOK.encode(p) for p in _TP_PROMPTS], 6, ignore_eos=True)
        eng.tp.stop()
    return {"outs": outs, "kv_heads": eng.runner.K}


def test_tensor_parallel_engine_equals_the_reference(model) -> None:
    res = run_ranks(_tp_generate, 2, timeout=90)
    ref = [reference_greedy(model, TOK.encode(p), 6) for p in _TP_PROMPTS]
    assert res[0]["outs"] == ref
    assert res[0]["kv_heads"] == res[1]["kv_heads"] == get_spec("tiny").n_kv_heads // 2


# ----- KV transfer --------------------------------------------------------------------------------


def _kv(ctx):
    return kvxfer.rank_main(
        ctx, tokens=[4, 32], layers=2, kv_heads=2, head_dim=8, dtype="float32", iters=2, warmup=1
    )


def test_kv_transfer_send_recv_arrives_intact() -> None:
    out = run_ranks(_kv, 2)
    rows = next(o for o in out if o["rank"] == 1)["rows"]
    assert [r["bytes"] for r in rows] == [2 * 2 * 2 * 4 * 8 * 4, 2 * 2 * 2 * 32 * 8 * 4]
    assert all(r["wrong"] == 0 and r["time_s"] > 0 for r in rows)
    assert kvxfer.kv_bytes_per_token(2, 2, 8, "bfloat16") == 2 * 2 * 2 * 8 * 2


def test_equal_prompts_prefilled_together_equal_the_reference(model) -> None:
    """Prompts of one length admitted in one step share one attention call per layer (their
    chunks merged); each still equals the reference."""
    import random

    rng = random.Random(3)
    prompts = [TOK.encode(TOK.words(rng, 24)) for _ in range(3)]
    assert len({len(p) for p in prompts}) == 1
    eng = Engine(model, EngineConfig(max_batch=4, max_len=64, prefix_cache=False))
    groups = []
    real = eng.runner._chunk_groups
    eng.runner._chunk_groups = lambda inp, f: groups.append(real(inp, f)) or groups[-1]
    outs = eng.generate(prompts, 5, ignore_eos=True)
    assert [g.count for g in groups[0]] == [3]
    for p, o in zip(prompts, outs, strict=True):
        assert o == reference_greedy(model, p, 5)
