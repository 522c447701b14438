"""Reference replica engine against the model's full forward; replica server; simulator; KV transfer."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics

import numpy as np
import pytest
import torch

from parlab.errors import UsageError
from parlab.models import get_spec
from parlab.models.reference import build_model
from parlab.runtime.testing import run_ranks
from parlab.serve import bench, datasets, kvxfer, sim
from parlab.serve.engine import (
    PRINTABLE,
    Engine,
    EngineConfig,
    Sequence,
    decode_buckets,
    encode,
    miss_buckets,
    prefill_buckets,
)
from parlab.serve.policy import PolicyConfig
from parlab.serve.replica import ReplicaServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model(get_spec("tiny"), seed=0)


def _reference_greedy(model, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    mask = torch.full((256,), float("-inf"))
    mask[PRINTABLE[0] : PRINTABLE[1]] = 0
    toks, logits = list(prompt), []
    for _ in range(n):
        with torch.no_grad():
            lg = model(torch.tensor([toks]))[0, -1].float()
        logits.append(lg)
        toks.append(int((lg + mask).argmax()))
    return toks[len(prompt) :], logits


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_engine_equals_full_forward_under_continuous_batching(model, prefix_cache: bool) -> None:
    eng = Engine(model, EngineConfig(max_batch=3, max_len=256, block=8, prefix_cache=prefix_cache))
    prompts = [
        encode("the shared system prompt, then question one"),
        encode("x"),
        encode("the shared system prompt, then question two"),
        encode("the shared system prompt, then question one"),
        encode("a different and somewhat longer prompt than the rest of them"),
    ]
    outs = eng.generate(prompts, 12)  # 5 requests through 3 slots: joins and leaves mid-run
    for p, o in zip(prompts, outs, strict=True):
        ref, _ = _reference_greedy(model, p, 12)
        assert o == ref
    kinds = {e["kind"] for e in eng.log}
    assert kinds == {0, 1}
    assert max(e["batch"] for e in eng.log if e["kind"] == 1) == 3


def test_engine_logits_equal_and_prefix_cache_hits(model) -> None:
    eng = Engine(model, EngineConfig(max_batch=2, max_len=256, block=8))
    p = encode("0123456789abcdefghijklmnopqrstuv!")  # 33 tokens: 4 full blocks
    eng.generate([p], 2)
    s = Sequence(prompt=p, max_tokens=1)
    eng.add(s)
    eng.step()
    assert s.cached_tokens == 32
    # the iteration log: the cached tokens, this thread's CPU time within the wall time
    assert eng.log[-1]["kind"] == 0 and eng.log[-1]["cached"] == 32
    assert eng.log[-1]["tokens"] == len(p) - 32
    for e in eng.log:
        assert 0 <= e["cpu"] <= e["s"] + 0.01
        if e["kind"] == 1:
            assert 0 <= e["launch"] <= e["s"]
    slot_logits = eng.forward(torch.tensor([p[:5]]), [0], [0])[0]
    with torch.no_grad():
        ref = model(torch.tensor([p[:5]]))[0, -1].float()
    torch.testing.assert_close(slot_logits, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "slots",
    [[0, 1, 2], [2, 0, 1], [0, 4, 1], [6, 0, 3]],
    ids=["in-order", "permuted", "with-holes", "sparse-gather"],
)
@pytest.mark.parametrize("new_tokens", [1, 3])
def test_batched_decode_at_different_lengths_equals_each_row_alone(
    model, slots: list[int], new_tokens: int
) -> None:
    eng = Engine(model, EngineConfig(max_batch=8, max_len=128, prefix_cache=False))
    prompts = [encode("a fairly long first prompt"), encode("hi"), encode("mid-sized one")]
    for p, s in zip(prompts, slots, strict=True):
        eng.forward(torch.tensor([p]), [s], [0])  # each row's cache at its own length
    new = [encode("xyz"[:new_tokens]), encode("!?."[:new_tokens]), encode("QRS"[:new_tokens])]
    starts = [len(p) for p in prompts]
    batched = eng.forward(torch.tensor(new), slots, starts)
    for b, (p, s) in enumerate(zip(prompts, slots, strict=True)):
        alone = eng.forward(torch.tensor([new[b]]), [s], [starts[b]])[0]
        torch.testing.assert_close(batched[b], alone, rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            full = model(torch.tensor([p + new[b]]))[0, -1].float()
        torch.testing.assert_close(batched[b], full, rtol=1e-5, atol=1e-5)


def test_sampled_rows_follow_their_seed_in_any_batch(model) -> None:
    def run(others: int) -> list[int]:
        eng = Engine(model, EngineConfig(max_batch=4, max_len=128))
        seq = Sequence(prompt=encode("sample me"), max_tokens=8, temperature=0.9, seed=7)
        eng.add(seq)
        for i in range(others):  # greedy and differently seeded neighbours
            t = 0.0 if i % 2 == 0 else 1.3
            eng.add(Sequence(prompt=encode(f"other {i}"), max_tokens=5, temperature=t, seed=i))
        while eng.has_work():
            eng.step()
        return seq.output

    alone = run(0)
    assert run(0) == alone
    assert run(3) == alone
    assert all(PRINTABLE[0] <= t < PRINTABLE[1] for t in alone)


def test_replica_server_streams_with_usage_and_cache(model) -> None:
    async def main() -> bench.BenchResult:
        srv = ReplicaServer(Engine(model, EngineConfig(max_batch=4, max_len=256)), name="tiny")
        await srv.start()
        try:
            ds = datasets.shared_prefix(
                num_groups=2, prompts_per_group=3, prefix_len=64, question_len=8, output_len=6
            )
            res = await bench.arun(
                bench.BenchConfig(base_url=srv.url, request_rate=100.0, progress=False), ds
            )
            chat = await bench.arun(
                bench.BenchConfig(base_url=srv.url, api="chat", stream=False, progress=False),
                datasets.synthetic(num_prompts=2, input_len=10, output_len=3),
            )
            assert chat.summary["completed"] == 2, chat.errors
            return res
        finally:
            await srv.stop()

    res = asyncio.run(main())
    assert res.summary["completed"] == 6, res.errors
    assert res.summary["total_output_tokens"] == 36
    assert all(len(o.generated_text) == 6 for o in res.outcomes)
    assert res.summary["cache_hit_rate"] > 0.3  # 64-token prefixes reused within groups


# ----- simulator --------------------------------------------------------------------------------


PROF = sim.ReplicaProfile(
    prefill_base_s=0.01,
    prefill_per_token_s=0.001,
    decode_base_s=0.02,
    decode_per_seq_s=0.005,
    max_batch=4,
    block=16,
    cache_blocks=100,
)


def _work(arrivals, plen=100, out=5) -> sim.Workload:
    n = len(arrivals)
    return sim.Workload(
        arrival=np.asarray(arrivals, dtype=float),
        prompt_len=np.full(n, plen),
        output_len=np.full(n, out),
        group=np.zeros(n, dtype=int),
        prefix_len=np.full(n, 96),
    )


def test_sim_single_request_is_exact() -> None:
    r = sim.simulate(_work([0.0]), replicas=1, profile=PROF, policy=PolicyConfig())
    assert r["mean_ttft_ms"] == pytest.approx(110.0)  # 10 + 100 * 1 ms
    assert r["mean_tpot_ms"] == pytest.approx(25.0)  # 20 + 5 * 1 ms per step
    assert r["mean_e2el_ms"] == pytest.approx(110.0 + 4 * 25.0)


def test_sim_join_interrupts_a_decode_leap_and_caches_prefix() -> None:
    # B arrives at 0.2 s while A decodes (steps of 25 ms from 0.11): it waits for the step
    # in progress (ends 0.21), prefills with A's 96-token prefix cached (6 blocks).
    r = sim.simulate(_work([0.0, 0.2]), replicas=1, profile=PROF, policy=PolicyConfig())
    assert r["cache_hit_rate"] == pytest.approx(96 / 200)
    ttft_b = 0.21 + 0.01 + 0.001 * (100 - 96) - 0.2
    assert r["mean_ttft_ms"] == pytest.approx((110.0 + ttft_b * 1e3) / 2)


def test_sim_charges_cached_prompt_tokens_and_decode_context() -> None:
    """A cached prompt token costs ``prefill_per_cached_token_s``; a decode step costs
    ``decode_per_token_s`` per context token (prompt + tokens generated so far)."""
    prof = dataclasses.replace(PROF, prefill_per_cached_token_s=0.0005, decode_per_token_s=1e-5)
    one = sim.simulate(_work([0.0]), replicas=1, profile=prof, policy=PolicyConfig())
    # 4 decode steps over contexts 100..103: 20 + 5 + 0.01 * 101.5 ms each
    assert one["mean_tpot_ms"] == pytest.approx(25.0 + 1.015)
    prof = dataclasses.replace(PROF, prefill_per_cached_token_s=0.0005)
    two = sim.simulate(_work([0.0, 0.2]), replicas=1, profile=prof, policy=PolicyConfig())
    ttft_b = 0.21 + 0.01 + 0.001 * (100 - 96) + 0.0005 * 96 - 0.2
    assert two["mean_ttft_ms"] == pytest.approx((110.0 + ttft_b * 1e3) / 2)


def test_fit_profile_recovers_the_costs_of_a_log_and_never_fits_a_negative_one() -> None:
    rng = np.random.default_rng(0)
    true = dict(pb=0.004, pt=2e-6, pc=5e-7, db=0.012, ds=4e-5, dt=3e-8)
    log = []
    for _ in range(60):
        b, new, hit = (
            int(rng.integers(1, 4)),
            int(rng.integers(50, 3000)),
            int(rng.integers(0, 2000)),
        )
        s = true["pb"] * b + true["pt"] * new + true["pc"] * hit
        log.append({"kind": 0, "batch": b, "tokens": new, "cached": hit, "s": s})
        b, ctx = int(rng.integers(1, 32)), int(rng.integers(100, 60000))
        log.append(
            {
                "kind": 1,
                "batch": b,
                "tokens": ctx,
                "s": true["db"] + true["ds"] * b + true["dt"] * ctx,
            }
        )
    fit = sim.fit_profile(log)
    names = dict(
        pb="prefill_base_s", pt="prefill_per_token_s", pc="prefill_per_cached_token_s",
        db="decode_base_s", ds="decode_per_seq_s", dt="decode_per_token_s",
    )  # fmt: skip
    for k, v in true.items():
        assert fit[names[k]] == pytest.approx(v, rel=1e-6), k
    # decode times that fall with the context: the cost per context token is 0, not negative
    falling = [{"kind": 0, "batch": 1, "tokens": 100, "s": 0.01}] + [
        {"kind": 1, "batch": 4, "tokens": c, "s": 0.02 - 1e-7 * c} for c in (100, 1000, 10000)
    ]
    fit = sim.fit_profile(falling)
    assert fit["decode_per_token_s"] == 0.0 and min(fit.values()) >= 0.0


def test_sim_prices_each_decode_step_at_the_bucket_of_the_longest_running_request(
    model,
) -> None:
    """With ``decode_bucket_s`` a decode step costs the bucket above the longest running
    request's length (prompt + tokens generated so far), as the engine picks its graph: a
    leap that crosses a bucket is split, and the bucket falls back when the longest leaves."""
    a_s, b_s = 0.003, 0.007  # buckets 256 and 300 (the engine's for max_len 300)
    prof = dataclasses.replace(
        PROF, decode_bucket_s=((256, a_s), (300, b_s)), cache_blocks=0, max_batch=2
    )
    # A: 254-token prompt, 5 tokens (4 decode steps at lengths 254, 255, 256, 257);
    # B: 100-token prompt, 10 tokens (9 steps, the first 4 beside A, then lengths 104..108)
    w = sim.Workload(
        arrival=np.zeros(2),
        prompt_len=np.asarray([254, 100]),
        output_len=np.asarray([5, 10]),
        group=np.asarray([0, 1]),
        prefix_len=np.zeros(2, dtype=int),
    )
    graphs = [256, 256, 300, 300, 256, 256, 256, 256, 256]  # each decode step's bucket
    r = sim.simulate(w, replicas=1, profile=prof, policy=PolicyConfig())
    ttft_a, ttft_b = 0.010 + 0.254, 0.264 + 0.010 + 0.100  # A prefills alone, then B
    end_a = ttft_b + 2 * a_s + 2 * b_s
    end_b = ttft_b + 7 * a_s + 2 * b_s
    assert r["mean_ttft_ms"] == pytest.approx((ttft_a + ttft_b) / 2 * 1e3)
    assert r["mean_e2el_ms"] == pytest.approx((end_a + end_b) / 2 * 1e3)
    # the engine's own choice of graph for the same two requests (the static decode run
    # eagerly on the CPU) is that list, step for step
    eng = Engine(model, EngineConfig(max_batch=2, max_len=300, prefix_cache=False))
    eng._static_decode = True
    for prompt, n in (("a" * 254, 5), ("b" * 100, 10)):
        eng.add(Sequence(prompt=encode(prompt), max_tokens=n))
    while eng.has_work():
        eng.step()
    assert [e["graph"] for e in eng.log if e["kind"] == 1] == graphs
    # past the table's largest bucket the largest is charged; the linear costs are unused
    assert prof.decode_step_s(4, 1e6, 299) == b_s and prof.decode_step_s(4, 1e6, 9999) == b_s


def test_fit_profile_takes_the_median_cost_of_each_decode_bucket() -> None:
    true = {256: 0.004, 1024: 0.006, 2560: 0.011}
    log: list[dict[str, float]] = [{"kind": 0, "batch": 1, "tokens": 100, "s": 0.02}]
    for L, c in true.items():
        for b, extra in ((1, 0.0), (8, 0.003), (31, -0.001), (4, 0.0), (16, 0.0)):
            # the cost is the serving loop's wall + gap; the engine's own "s" is ignored
            e = {"kind": 1, "batch": b, "tokens": b * L // 2, "s": 1.0, "graph": L}
            log.append({**e, "wall": c + extra - 1e-4, "gap": 1e-4})
    log.append({"kind": 1, "batch": 2, "tokens": 300, "s": 0.5, "graph": 0})  # an eager step
    fit = sim.fit_profile(log)
    assert fit["decode_bucket_s"] == pytest.approx(true)
    # through JSON (keys become strings) into the simulator's profile
    prof = sim.ReplicaProfile.from_json(json.loads(json.dumps(fit)))
    assert dict(prof.decode_bucket_s) == pytest.approx(true)
    assert [L for L, _ in prof.decode_bucket_s] == [256, 1024, 2560]
    # a log of eager steps: no table, the linear decode cost as before
    eager = [e for e in log if e.get("graph", 0) == 0]
    assert "decode_bucket_s" not in sim.fit_profile(eager)
    assert sim.ReplicaProfile.from_json(sim.fit_profile(eager)).decode_bucket_s is None


def test_engine_profile_times_every_bucket_with_the_prefix_cache_on(model) -> None:
    """The idle profile prices the static decode per bucket and prefills with the prefix
    cache as configured (misses and hits), and leaves the engine's prefix cache as it was."""
    cfg = EngineConfig(max_batch=4, max_len=300, block=16)
    eng = Engine(model, cfg)
    eng._static_decode = True  # the CPU hook: the static decode, run eagerly
    kept = encode("a prompt cached before the profile, two blocks long!")
    eng.generate([kept], 1)
    before = list(eng.prefix._d)
    prof = eng.profile(prefill_lens=(32, 128))
    assert list(eng.prefix._d) == before and not eng.log
    assert sorted(prof["decode_bucket_s"]) == eng.buckets == [256, 300]
    assert all(t > 0 for t in prof["decode_bucket_s"].values())
    assert all(len(t) == 5 for t in prof["samples"]["decode_bucket"].values())
    # two misses and two hits per length (one of each discarded); a hit reuses the whole
    # prompt it extends and prefills only its 64 new tokens
    pre = prof["samples"]["prefill"]
    assert sorted((new, hit) for new, hit, _ in pre) == [
        (32, 0), (32, 0), (64, 32), (64, 32), (64, 128), (64, 128), (128, 0), (128, 0),
    ]  # fmt: skip
    assert min(prof[k] for k in prof if k.endswith("_s") and "bucket" not in k) >= 0
    assert prof["prefill_bucket_s"] is None  # an eager prefill: no table of pairs
    p = sim.ReplicaProfile.from_json(json.loads(json.dumps(prof)))
    assert [L for L, _ in p.decode_bucket_s] == [256, 300]
    # the overlap model: the shortest misses give the floor, the longest misses' cost is
    # exactly what the model charges at their length
    assert p.prefill_overlap and set(prof["prefill_linear"]) == {
        "prefill_base_s", "prefill_per_token_s", "prefill_per_cached_token_s",
    }  # fmt: skip
    longest = [t for new, hit, t in pre if hit == 0 and new == 128]
    assert p.prefill_s(128, 0) == pytest.approx(max(p.prefill_base_s, statistics.median(longest)))
    shortest = [t for new, hit, t in pre if hit == 0 and new == 32]
    assert p.prefill_base_s == pytest.approx(statistics.median(shortest))
    # the cached-token cost comes from the hits of the most cached tokens (128 here)
    most = [(new, t) for new, hit, t in pre if hit == 128]
    above = [max(0.0, t - max(p.prefill_base_s, p.prefill_per_token_s * new)) / 128
             for new, t in most]  # fmt: skip
    assert p.prefill_per_cached_token_s == pytest.approx(statistics.median(above))
    # an eager engine has no bucket table; without a prefix cache nothing hits
    plain = Engine(model, dataclasses.replace(cfg, prefix_cache=False))
    prof = plain.profile(prefill_lens=(32,))
    assert prof["decode_bucket_s"] is None
    assert {hit for _, hit, _ in prof["samples"]["prefill"]} == {0}


def test_prefill_overlap_charges_the_larger_of_floor_and_work() -> None:
    base = {"prefill_base_s": 0.02, "prefill_per_token_s": 1e-5, "decode_base_s": 0.01,
            "decode_per_seq_s": 0.0, "prefill_per_cached_token_s": 1e-6}  # fmt: skip
    add = sim.ReplicaProfile.from_json(base)
    over = sim.ReplicaProfile.from_json({**base, "prefill_overlap": True})
    assert add.prefill_s(1000, 0) == pytest.approx(0.03)  # 20 ms + 10 ms
    assert over.prefill_s(1000, 0) == pytest.approx(0.02)  # the floor hides the work
    assert over.prefill_s(4000, 2000) == pytest.approx(0.04 + 0.002)  # the work, + cached
    # the simulator charges a lone request exactly that before its first token
    w = _work([0.0])
    one = {"replicas": 1, "policy": PolicyConfig()}
    t_add = sim.simulate(w, profile=add, **one)["mean_ttft_ms"]
    t_over = sim.simulate(w, profile=over, **one)["mean_ttft_ms"]
    n = int(w.prompt_len[0])
    assert t_add - t_over == pytest.approx(1e3 * (add.prefill_s(n, 0) - over.prefill_s(n, 0)))


def test_sim_disaggregated_adds_the_transfer() -> None:
    w = _work([0.0])
    dis = sim.Disaggregation(
        prefill_replicas=1, decode_replicas=1, kv_bytes_per_token=1000, kv_bandwidth=1e6
    )
    r = sim.simulate(w, replicas=2, profile=PROF, policy=PolicyConfig(), disagg=dis)
    assert r["mean_ttft_ms"] == pytest.approx(110.0)
    # transfer 100 tokens * 1000 B / 1e6 B/s = 0.1 s, then 4 decode steps of 25 ms
    assert r["mean_e2el_ms"] == pytest.approx(110.0 + 100.0 + 100.0)


def test_sim_cache_aware_beats_round_robin_on_shared_prefixes() -> None:
    w = sim.shared_prefix_arrays(
        n=3000, groups=40, prefix_len=512, question_len=32, output_len=16, rate=60.0
    )
    prof = sim.ReplicaProfile(
        prefill_base_s=0.001,
        prefill_per_token_s=0.0002,
        decode_base_s=0.004,
        decode_per_seq_s=0.0005,
        max_batch=32,
        block=16,
        cache_blocks=400,
    )
    rr = sim.simulate(w, replicas=8, profile=prof, policy=PolicyConfig(name="round_robin"))
    ca = sim.simulate(w, replicas=8, profile=prof, policy=PolicyConfig(name="cache_aware"))
    assert ca["cache_hit_rate"] > rr["cache_hit_rate"] + 0.2
    assert ca["mean_ttft_ms"] < rr["mean_ttft_ms"]


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


# ----- tensor-parallel replica ----------------------------------------------------------------------

_TP_PROMPTS = ["the shared system prompt, one", "xy", "the shared system prompt!"]


def _tp_generate(ctx):
    from parlab.serve.engine import EngineConfig as Cfg
    from parlab.serve.tp import build_tp_engine, worker_loop

    eng = build_tp_engine(
        ctx, model="tiny", dtype="float32", seed=0, config=Cfg(max_batch=2, max_len=256, block=8)
    )
    kv_heads_here = eng.k_cache[0].shape[1]
    outs = None
    if ctx.rank != 0:
        worker_loop(eng)  # in lockstep with rank 0's iterations until it says stop
    else:
        outs = eng.generate([encode(p) for p in _TP_PROMPTS], 6)
        eng.tp.stop()
    logits = eng.forward(torch.tensor([encode("abc")]), [0], [0])[0]  # both ranks: all-reduces
    return {"outs": outs, "logits": logits.tolist(), "kv_heads": kv_heads_here}


def test_tensor_parallel_engine_equals_single_process(model) -> None:
    res = run_ranks(_tp_generate, 2, timeout=90)
    single = Engine(model, EngineConfig(max_batch=2, max_len=256, block=8))
    ref = single.generate([encode(p) for p in _TP_PROMPTS], 6)
    assert res[0]["outs"] == ref
    with torch.no_grad():
        full = model(torch.tensor([encode("abc")]))[0, -1].float()
    for r in res:
        torch.testing.assert_close(torch.tensor(r["logits"]), full, rtol=1e-4, atol=1e-4)
    assert res[0]["kv_heads"] == res[1]["kv_heads"] == get_spec("tiny").n_kv_heads // 2


# ----- static decode (CUDA graphs) ----------------------------------------------------------------


def _spec_variant(name: str):
    tiny = get_spec("tiny")  # GQA: 8 query heads over 4 KV heads
    return {
        "gqa": tiny,
        "mha": dataclasses.replace(tiny, kv_heads=None),
        "mqa": dataclasses.replace(tiny, kv_heads=1),
        "learned": dataclasses.replace(
            tiny, position="learned", norm="layernorm", activation="gelu", linear_bias=True,
            max_seq_len=512,
        ),
        "moe": get_spec("tiny-moe"),
    }[name]  # fmt: skip


@pytest.mark.parametrize("variant", ["gqa", "mha", "mqa", "learned", "moe"])
def test_static_decode_equals_the_eager_forward(variant: str) -> None:
    """The static decode over every slot (free ones included) gives the running slots the
    eager forward's logits and writes the same K/V at their positions, at every bucket."""
    spec = _spec_variant(variant)
    eng = Engine(build_model(spec, seed=0), EngineConfig(max_batch=6, max_len=300))
    assert eng.buckets == [256, 300] and not eng.cuda_graphs
    caches = list(zip(eng.k_cache, eng.v_cache, strict=True))
    torch.manual_seed(1)
    for kc, vc in caches:  # stale K/V of earlier requests: only a mask keeps them out
        kc.normal_()
        vc.normal_()
    slots = [4, 0, 2]  # slots 1, 3, 5 free
    prompts = [encode("a fairly long first prompt"), encode("hi"), encode("x" * 255)]
    for p, s in zip(prompts, slots, strict=True):
        eng.forward(torch.tensor([p]), [s], [0])
    lens = [len(p) for p in prompts]
    new = [ord("q"), ord("!"), ord("Z")]
    before = [(kc.clone(), vc.clone()) for kc, vc in caches]
    eager = eng.forward(torch.tensor([[t] for t in new]), slots, lens)
    eager_kv = [(kc[slots].clone(), vc[slots].clone()) for kc, vc in caches]
    for L in eng.buckets:  # 256 holds every running slot's keys (the longest reads 256)
        for (kc, vc), (k0, v0) in zip(caches, before, strict=True):
            kc.copy_(k0)
            vc.copy_(v0)
        eng._in_2M.zero_()
        eng._in_2M[0, slots] = torch.tensor(new)
        eng._in_2M[1, slots] = torch.tensor(lens)
        logits_MV, picks_M = eng._decode_static(L)
        assert logits_MV.shape == (6, spec.vocab_size)
        torch.testing.assert_close(logits_MV[slots], eager, rtol=1e-5, atol=1e-5)
        masked = eager + eng.vocab_mask
        assert picks_M[slots].tolist() == masked.argmax(-1).tolist()
        for (kc, vc), (ke, ve) in zip(caches, eager_kv, strict=True):
            torch.testing.assert_close(kc[slots], ke, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(vc[slots], ve, rtol=1e-5, atol=1e-5)


def _generate_mixed(eng: Engine) -> tuple[list[list[int]], set[int]]:
    """Seven requests through four slots (joins and leaves mid-run, holes in the slots), one
    prompt long enough to decode past 256 keys, one sampled row."""
    prompts = [encode("y" * 248), encode("hi"), encode("mid-sized prompt")]
    prompts += [encode(f"request number {i}") for i in range(3)] + [encode("sampled")]
    seqs = [Sequence(prompt=p, max_tokens=14 if i % 2 else 12) for i, p in enumerate(prompts)]
    seqs[-1].temperature, seqs[-1].seed = 0.8, 3
    for s in seqs:
        eng.add(s)
    while eng.has_work():
        eng.step()
    return [s.output for s in seqs], {e["graph"] for e in eng.log if e["kind"] == 1}


def test_generate_with_the_static_decode_equals_eager(model) -> None:
    """Greedy (and seeded sampled) tokens are the eager path's while the static decode runs
    over every slot and its key length crosses a bucket (256 -> 300)."""
    cfg = EngineConfig(max_batch=4, max_len=300, block=8)
    eager, eager_graphs = _generate_mixed(Engine(model, cfg))
    static = Engine(model, cfg)
    static._static_decode = True  # the CPU hook: the static decode, run eagerly
    out, graphs = _generate_mixed(static)
    assert eager_graphs == {0}
    assert graphs == {256, 300}
    assert out == eager


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_decode_equals_eager_on_gpu(dtype: torch.dtype) -> None:
    """Replayed graphs give the tokens of the same static decode run eagerly (the same
    kernels); in float32 also those of the eager forward. In bfloat16 the eager forward runs
    other kernels (K/V repeated, other GEMM shapes), whose last-bit differences can flip a
    near-tie argmax over a hundred tokens: that equality is float32's, and the CPU test's."""
    m = build_model(get_spec("tiny"), device="cuda", dtype=dtype, seed=0)
    cfg = EngineConfig(max_batch=4, max_len=300, block=8)
    eager_static = Engine(m, dataclasses.replace(cfg, cuda_graphs=False))
    eager_static._static_decode = True
    ref, _ = _generate_mixed(eager_static)
    eng = Engine(m, cfg)  # auto: on for CUDA
    assert eng.cuda_graphs and sorted(eng._graphs) == [256, 300] and eng.graph_capture_s > 0
    out, graphs = _generate_mixed(eng)
    assert graphs == {256, 300}
    assert out == ref
    if dtype == torch.float32:
        eager, _ = _generate_mixed(Engine(m, dataclasses.replace(cfg, cuda_graphs=False)))
        assert out == eager


def test_cuda_graphs_where_impossible_is_a_usage_error(model) -> None:
    # powers of two from 256 to 1024, then every 512, then max_len
    assert [decode_buckets(n) for n in (4096, 2048, 1500, 1025, 600, 300, 256, 100)] == [
        [256, 512, 1024, 1536, 2048, 2560, 3072, 3584, 4096], [256, 512, 1024, 1536, 2048],
        [256, 512, 1024, 1500], [256, 512, 1024, 1025], [256, 512, 600], [256, 300], [256],
        [100],
    ]  # fmt: skip
    assert not Engine(model, EngineConfig(max_batch=2, max_len=64)).cuda_graphs
    with pytest.raises(UsageError, match="not a CUDA device") as err:
        Engine(model, EngineConfig(max_batch=2, max_len=64, cuda_graphs=True))
    assert "\n" not in str(err.value)
    eng = Engine(model, EngineConfig(max_batch=2, max_len=64, cuda_graphs=False))
    with pytest.raises(UsageError, match="off"):
        eng.warmup_graphs()


@pytest.mark.parametrize("variant", ["gqa", "mha", "mqa", "learned"])
def test_static_prefill_equals_the_eager_forward(variant: str) -> None:
    """The static prefill (padded to its query length, attending over its key length of the
    slot, or causally over its own tokens for a miss) gives the eager forward's logits and
    writes the same K/V at the prompt's positions, for a miss and for prefix hits, at every
    pair that holds them."""
    spec = _spec_variant(variant)
    eng = Engine(build_model(spec, seed=0), EngineConfig(max_batch=3, max_len=300))
    assert eng.prefill_lens == [64, 128, 256, 300] and eng.buckets == [256, 300]
    assert eng.miss_lens == [64, 128, 256, 300]
    assert eng.prefill_pairs() == [
        (64, 0), (128, 0), (256, 0), (300, 0),
        (64, 256), (64, 300), (128, 256), (128, 300), (256, 256), (256, 300), (300, 300),
    ]  # fmt: skip
    caches = list(zip(eng.k_cache, eng.v_cache, strict=True))
    torch.manual_seed(1)
    for kc, vc in caches:  # stale K/V of earlier requests: only a mask keeps them out
        kc.normal_()
        vc.normal_()
    stale = [(kc.clone(), vc.clone()) for kc, vc in caches]
    prompt = encode("z" * 40 + "a prompt whose cached head is attended to" * 4)[:200]
    # (start, n): a miss; hits of 96 and 160 cached tokens; the longest prompt that fits
    for start, n in ((0, 200), (96, 104), (160, 40), (0, 299)):
        toks = (prompt * 2)[: start + n]
        for (kc, vc), (k0, v0) in zip(caches, stale, strict=True):
            kc.copy_(k0)
            vc.copy_(v0)
        eng.forward(torch.tensor([toks[:start]]), [1], [0]) if start else None
        head = [(kc[1, :, :start].clone(), vc[1, :, :start].clone()) for kc, vc in caches]
        eager = eng.forward(torch.tensor([toks[start:]]), [1], [start])
        eager_kv = [(kc[1, :, : start + n].clone(), vc[1, :, : start + n].clone())
                    for kc, vc in caches]  # fmt: skip
        Q = next(q for q in eng.prefill_lens if q >= n)
        pairs = [(Q, L) for L in eng.buckets if start + n <= L]
        if start == 0:  # a miss runs causally over its own tokens; the masked path serves too
            pairs.append((next(q for q in eng.miss_lens if q >= n), 0))
        assert eng._prefill_slot(toks[start:], 1, start)[2] == pairs[-1 if start == 0 else 0]
        for Q, L in pairs:
            for (kc, vc), (k0, v0), (kh, vh) in zip(caches, stale, head, strict=True):
                kc.copy_(k0)
                vc.copy_(v0)
                kc[1, :, :start] = kh  # the cached head, as the prefix-cache copy leaves it
                vc[1, :, :start] = vh
            logits_1V, picks_1, pair = eng._prefill_slot(toks[start:], 1, start, (Q, L))
            assert pair == (Q, L) and logits_1V.shape == (1, spec.vocab_size)
            torch.testing.assert_close(logits_1V, eager, rtol=1e-5, atol=1e-5)
            assert picks_1.tolist() == (eager + eng.vocab_mask).argmax(-1).tolist()
            for (kc, vc), (ke, ve) in zip(caches, eager_kv, strict=True):
                torch.testing.assert_close(kc[1, :, : start + n], ke, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(vc[1, :, : start + n], ve, rtol=1e-5, atol=1e-5)
            # the other slots are untouched
            for (kc, vc), (k0, v0) in zip(caches, stale, strict=True):
                assert torch.equal(kc[[0, 2]], k0[[0, 2]]) and torch.equal(vc[[0, 2]], v0[[0, 2]])


def test_generate_with_static_prefill_and_decode_equals_eager(model) -> None:
    """Tokens (greedy and seeded sampled) are the eager engine's with every prefill and decode
    static, prefix-cache hits included; each request records the pair it ran at, the one of
    its uncached tokens and its whole prompt."""
    cfg = EngineConfig(max_batch=4, max_len=300, block=8)
    eager, _ = _generate_mixed(Engine(model, cfg))
    static = Engine(model, cfg)
    static._static_decode = static._static_prefill = True  # the CPU hooks, run eagerly
    out, graphs = _generate_mixed(static)
    assert out == eager and graphs == {256, 300}
    seqs = [Sequence(prompt=encode("y" * 248 + "tail"), max_tokens=2) for _ in range(2)]
    for s in seqs:
        static.add(s)
    while static.has_work():
        static.step()
    assert seqs[1].cached_tokens == 248  # 31 blocks of 8 from the first (and _generate_mixed's)
    assert [s.prefill_graph for s in seqs] in (
        [(64, 256), (64, 256)],  # both hit the earlier 248-token prompt's blocks
        [(256, 0), (64, 256)],  # the first missed (its blocks were evicted)
    )
    assert [s.output for s in seqs] == Engine(model, cfg).generate([s.prompt for s in seqs], 2)


def test_prefill_buckets_pad_to_the_decode_buckets() -> None:
    assert [prefill_buckets(n) for n in (4096, 300, 200, 100)] == [
        [64, 128, 256, 512, 1024, 1536, 2048, 2560, 3072, 3584, 4096], [64, 128, 256, 300],
        [64, 128, 200], [64, 100],
    ]  # fmt: skip
    # a miss pads its whole prompt, in steps of 256 past 256
    assert miss_buckets(4096) == [64, 128, *range(256, 4096, 256), 4096]
    assert [miss_buckets(n) for n in (300, 200, 100)] == [[64, 128, 256, 300], [64, 128, 200],
                                                          [64, 100]]  # fmt: skip


def test_engine_profile_times_every_prefill_pair_and_fits_the_host_around_it(model) -> None:
    """With the static prefill the idle profile times every pair's replay, and fits what the
    prefills cost around it (hashing, cached blocks in, new ones out) to their remainder; the
    simulator's prefill then costs the pair plus those terms."""
    eng = Engine(model, EngineConfig(max_batch=4, max_len=300, block=16))
    eng._static_decode = eng._static_prefill = True  # the CPU hooks: run eagerly
    prof = eng.profile(prefill_lens=(32, 128), bucket_reps=2)
    table = prof["prefill_bucket_s"]
    assert [(q, L) for q, L, _ in table] == sorted(eng.prefill_pairs())
    assert all(t > 0 for *_, t in table)
    assert all(len(t) == 2 for *_, t in prof["samples"]["prefill_bucket"])
    p = sim.ReplicaProfile.from_json(json.loads(json.dumps(prof)))
    assert not p.prefill_overlap and p.prefill_bucket_s == tuple(map(tuple, table))
    assert min(p.prefill_base_s, p.prefill_per_token_s, p.prefill_per_cached_token_s) >= 0
    secs = {(q, L): t for q, L, t in table}
    # a 64-token hit on 128 cached tokens runs at (64, 256); a 32-token miss at (64, 0),
    # causal; 128 new tokens on 160 cached at (128, 300)
    host = p.prefill_base_s + p.prefill_per_token_s * 64 + p.prefill_per_cached_token_s * 128
    assert p.prefill_s(64, 128) == pytest.approx(secs[64, 256] + host)
    assert p.prefill_pair_s(32, 32) == secs[64, 0]
    assert p.prefill_pair_s(128, 288) == secs[128, 300]
    assert p.prefill_pair_s(129, 129) == secs[256, 0]
    assert p.prefill_pair_s(5000, 9999) == secs[300, 300]  # past the table: its largest
    assert p.prefill_pair_s(5000, 5000) == secs[300, 0]
    # the eager prefill's model is kept beside it
    assert set(prof["prefill_eager"]) >= {"prefill_base_s", "prefill_overlap"}
    with pytest.raises(ValueError, match="L >= Q"):
        dataclasses.replace(p, prefill_bucket_s=((256, 64, 0.1),))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_prefill_equals_the_static_prefill_run_eagerly() -> None:
    """Replayed prefill (and decode) graphs give the tokens of the same static functions run
    eagerly, prefix hits included; float32, so also those of the eager engine."""
    m = build_model(get_spec("tiny"), device="cuda", dtype=torch.float32, seed=0)
    cfg = EngineConfig(max_batch=4, max_len=300, block=8)
    eager_static = Engine(m, dataclasses.replace(cfg, cuda_graphs=False))
    eager_static._static_decode = eager_static._static_prefill = True
    ref, _ = _generate_mixed(eager_static)
    eng = Engine(m, cfg)
    assert sorted(eng._prefill_graphs) == sorted(eng.prefill_pairs())
    out, graphs = _generate_mixed(eng)
    assert out == ref and graphs == {256, 300}
    eager, _ = _generate_mixed(Engine(m, dataclasses.replace(cfg, cuda_graphs=False)))
    assert out == eager
    off = Engine(m, dataclasses.replace(cfg, prefill_graphs=False))
    assert off.cuda_graphs and not off._prefill_graphs and not off._static_prefill


def test_sim_charges_the_serving_loop_around_every_iteration() -> None:
    """``loop_base_s + loop_per_seq_s * requests`` is added to each prefill and decode
    iteration: a lone request's TTFT and TPOT grow by exactly one iteration's loop cost."""
    loop = dataclasses.replace(PROF, loop_base_s=0.002, loop_per_seq_s=0.0005)
    one = {"replicas": 1, "policy": PolicyConfig()}
    base = sim.simulate(_work([0.0]), profile=PROF, **one)
    r = sim.simulate(_work([0.0]), profile=loop, **one)
    assert r["mean_ttft_ms"] - base["mean_ttft_ms"] == pytest.approx(2.5)
    assert r["mean_tpot_ms"] - base["mean_tpot_ms"] == pytest.approx(2.5)
    assert loop.decode_step_s(3, 0, 0) == pytest.approx(PROF.decode_step_s(3, 0, 0) + 0.0035)
    # the request's path through the router adds to TTFT and E2E, not to TPOT
    path = sim.simulate(_work([0.0]), profile=dataclasses.replace(PROF, path_s=0.003), **one)
    assert path["mean_ttft_ms"] - base["mean_ttft_ms"] == pytest.approx(3.0)
    assert path["mean_e2el_ms"] - base["mean_e2el_ms"] == pytest.approx(3.0)
    assert path["mean_tpot_ms"] == pytest.approx(base["mean_tpot_ms"])


def test_fit_loop_recovers_the_serving_loop_beyond_the_engine_costs() -> None:
    """What a served iteration cost beyond the engine's idle-profile price (its bucket, or a
    one-request prefill's cost) is fitted as ``base + per_seq * batch``; prefill iterations
    of several requests and logs without the serving loop's times are left out."""
    prof = dataclasses.replace(PROF, decode_bucket_s=((256, 0.004), (512, 0.006)))
    base, per_seq = 0.0006, 0.00002
    log: list[dict[str, float]] = []
    for b, L in ((1, 256), (4, 256), (16, 512), (32, 512), (8, 256)):
        wall = prof.decode_bucket_s[L == 512][1] + base + per_seq * b - 1e-4
        log.append({"kind": 1, "batch": b, "tokens": 10 * b, "graph": L, "s": 1.0,
                    "wall": wall, "gap": 1e-4})  # fmt: skip
    wall = prof.prefill_s(100, 32) + base + per_seq
    log.append({"kind": 0, "batch": 1, "tokens": 100, "cached": 32, "s": 1.0, "wall": wall})
    log.append({"kind": 0, "batch": 3, "tokens": 300, "cached": 0, "s": 1.0, "wall": 9.0})
    log.append({"kind": 1, "batch": 2, "tokens": 20, "graph": 256, "s": 1.0})  # no wall
    fit = sim.fit_loop(log, prof)
    assert fit["loop_base_s"] == pytest.approx(base) and fit["loop_per_seq_s"] == pytest.approx(
        per_seq
    )
    assert fit["loop_iterations"] == 6
    costs = {k: getattr(PROF, k) for k in ("prefill_base_s", "prefill_per_token_s",
                                           "decode_base_s", "decode_per_seq_s")}  # fmt: skip
    loaded = sim.ReplicaProfile.from_json({**costs, **json.loads(json.dumps(fit))})
    assert loaded.loop_base_s == pytest.approx(base)
    with pytest.raises(ValueError, match="at least two"):
        sim.fit_loop(log[-2:], prof)


def test_loop_probe_prices_the_serving_loop_and_the_request_path(model) -> None:
    """The project's probe of a live replica (here in this process, on the CPU): the serving
    loop's fit, a positive request path from 8 lone requests through a router, and the
    replica left as it was (empty log and prefix cache)."""
    from parlab.projects.serving import get_preset, loop_probe

    async def main() -> tuple[dict, ReplicaServer]:
        eng = Engine(model, EngineConfig(max_batch=4, max_len=256))
        srv = ReplicaServer(eng, name="tiny")
        await srv.start()
        try:
            prof = eng.profile(prefill_lens=(32,), batches=(1, 4))
            preset = dataclasses.replace(get_preset("cpu"), max_batch=4)
            return await loop_probe(srv.url, preset, prof), srv
        finally:
            await srv.stop()

    out, srv = asyncio.run(main())
    assert out["loop_iterations"] >= 20 and min(out["loop_base_s"], out["loop_per_seq_s"]) >= 0
    assert len(out["path_samples"]) == 8 and out["path_s"] > 0
    assert not srv.engine.log and not srv.engine.prefix._d
    p = sim.ReplicaProfile.from_json({**PROF.__dict__, **out} | {"prefill_overlap": False})
    assert p.path_s == out["path_s"] and p.loop_base_s == out["loop_base_s"]
