"""The serving simulator: hand-checked steps, the fits it takes from logs, and the project's
probe of a live replica."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from parlab.models.reference import build_model
from parlab.serve import sim
from parlab.serve.engine import Engine, EngineConfig
from parlab.serve.policy import PolicyConfig
from parlab.serve.profiling import profile_engine
from parlab.serve.replica import ReplicaServer, serving_spec

pytestmark = pytest.mark.timeout(90)

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


ONE = {"replicas": 1, "policy": PolicyConfig()}


def test_sim_single_request_is_exact() -> None:
    r = sim.simulate(_work([0.0]), profile=PROF, **ONE)
    assert r["mean_ttft_ms"] == pytest.approx(130.0)  # step 20 + admit 10 + 100 * 1 ms
    assert r["mean_tpot_ms"] == pytest.approx(25.0)  # 20 + 5 * 1 ms per step
    assert r["mean_e2el_ms"] == pytest.approx(130.0 + 4 * 25.0)


def test_sim_join_interrupts_a_decode_leap_mixes_the_step_and_caches_prefix() -> None:
    # B arrives at 0.2 s while A decodes (steps of 25 ms from 0.13): it waits for the step in
    # progress (ends 0.205), then one step admits B with A's 96-token prefix cached (6 blocks)
    # and advances A: 20 + 5 (A) + 10 + 4 tokens ms
    r = sim.simulate(_work([0.0, 0.2]), profile=PROF, **ONE)
    assert r["cache_hit_rate"] == pytest.approx(96 / 200)
    ttft_b = 0.205 + 0.020 + 0.005 + 0.010 + 0.001 * (100 - 96) - 0.2
    assert r["mean_ttft_ms"] == pytest.approx((130.0 + ttft_b * 1e3) / 2)


def test_sim_charges_cached_prompt_tokens_and_decode_context() -> None:
    prof = dataclasses.replace(PROF, decode_per_token_s=1e-5)
    one = sim.simulate(_work([0.0]), profile=prof, **ONE)
    # 4 decode steps over contexts 101..104 (prompt + tokens so far): 25 + 0.01 * 102.5 ms
    assert one["mean_tpot_ms"] == pytest.approx(25.0 + 1.025)
    prof = dataclasses.replace(PROF, prefill_per_cached_token_s=0.0005)
    a = sim.simulate(_work([0.0, 0.2]), profile=prof, **ONE)
    b = sim.simulate(_work([0.0, 0.2]), profile=PROF, **ONE)
    assert (a["mean_ttft_ms"] - b["mean_ttft_ms"]) * 2 == pytest.approx(0.5 * 96)


def test_sim_charges_the_serving_loop_and_the_path() -> None:
    loop = dataclasses.replace(PROF, loop_base_s=0.002, loop_per_seq_s=0.0005)
    base = sim.simulate(_work([0.0]), profile=PROF, **ONE)
    r = sim.simulate(_work([0.0]), profile=loop, **ONE)
    assert r["mean_ttft_ms"] - base["mean_ttft_ms"] == pytest.approx(2.5)
    assert r["mean_tpot_ms"] - base["mean_tpot_ms"] == pytest.approx(2.5)
    path = sim.simulate(_work([0.0]), profile=dataclasses.replace(PROF, path_s=0.003), **ONE)
    assert path["mean_ttft_ms"] - base["mean_ttft_ms"] == pytest.approx(3.0)
    assert path["mean_tpot_ms"] == pytest.approx(base["mean_tpot_ms"])


def test_fit_profile_recovers_the_step_costs_and_never_fits_a_negative_one() -> None:
    rng = np.random.default_rng(0)
    true = dict(
        decode_base_s=0.004, prefill_base_s=0.002, prefill_per_token_s=2e-6,
        prefill_per_cached_token_s=5e-7, decode_per_seq_s=4e-5, decode_per_token_s=3e-8,
    )  # fmt: skip
    log = []
    for _ in range(80):
        e = {
            "admitted": int(rng.integers(0, 3)),
            "decode": int(rng.integers(0, 32)),
            "context": int(rng.integers(100, 60000)),
        }
        e["prefill"] = int(rng.integers(50, 3000)) if e["admitted"] else 0
        e["cached"] = int(rng.integers(0, 2000)) if e["admitted"] else 0
        e["s"] = sim.ReplicaProfile(**true).step_s(e)
        log.append(e)
    fit = sim.fit_profile(log)
    for k, v in true.items():
        assert fit[k] == pytest.approx(v, rel=1e-6), k
    falling = [{"admitted": 1, "prefill": 100, "decode": 0, "context": 100, "s": 0.01}] + [
        {"decode": 4, "context": c, "s": 0.02 - 1e-7 * c} for c in (100, 1000, 10000)
    ]
    fit = sim.fit_profile(falling)
    assert fit["decode_per_token_s"] == 0.0 and min(fit.values()) >= 0.0


def test_fit_loop_recovers_the_serving_loop_beyond_the_engine_costs() -> None:
    base, per_seq = 0.0006, 0.00002
    log = []
    for b in (1, 4, 16, 32, 8):
        e = {"batch": b, "decode": b, "context": 40 * b, "s": 1.0}
        e["wall"] = PROF.step_s(e) + base + per_seq * b - 1e-4
        e["gap"] = 1e-4
        log.append(e)
    log.append({"batch": 2, "decode": 2, "context": 20, "s": 1.0})  # no wall: left out
    fit = sim.fit_loop(log, PROF)
    assert fit["loop_base_s"] == pytest.approx(base)
    assert fit["loop_per_seq_s"] == pytest.approx(per_seq)
    assert fit["loop_iterations"] == 5
    with pytest.raises(ValueError, match="at least two"):
        sim.fit_loop(log[-2:], PROF)


def test_sim_disaggregated_adds_the_transfer() -> None:
    dis = sim.Disaggregation(
        prefill_replicas=1, decode_replicas=1, kv_bytes_per_token=1000, kv_bandwidth=1e6
    )
    r = sim.simulate(_work([0.0]), replicas=2, profile=PROF, policy=PolicyConfig(), disagg=dis)
    assert r["mean_ttft_ms"] == pytest.approx(130.0)
    # transfer 100 tokens * 1000 B / 1e6 B/s = 0.1 s, then 4 decode steps of 25 ms
    assert r["mean_e2el_ms"] == pytest.approx(130.0 + 100.0 + 100.0)


def test_sim_cache_aware_beats_round_robin_on_shared_prefixes() -> None:
    w = sim.shared_prefix_arrays(
        n=3000, groups=40, prefix_len=512, question_len=32, output_len=16, rate=60.0
    )
    prof = sim.ReplicaProfile(
        prefill_base_s=0.001, prefill_per_token_s=0.0002, decode_base_s=0.004,
        decode_per_seq_s=0.0005, max_batch=32, block=16, cache_blocks=400,
    )  # fmt: skip
    rr = sim.simulate(w, replicas=8, profile=prof, policy=PolicyConfig(name="round_robin"))
    ca = sim.simulate(w, replicas=8, profile=prof, policy=PolicyConfig(name="cache_aware"))
    assert ca["cache_hit_rate"] > rr["cache_hit_rate"] + 0.2
    assert ca["mean_ttft_ms"] < rr["mean_ttft_ms"]


def test_loop_probe_prices_the_serving_loop_and_the_request_path() -> None:
    """The project's probe of a live replica (in this process, on the CPU): the serving
    loop's fit, a positive request path from 8 lone requests through a router, and the
    replica left as it was (empty log and prefix cache)."""
    from parlab.projects.serving import get_preset, loop_probe

    async def main() -> tuple[dict, ReplicaServer]:
        eng = Engine(build_model(serving_spec("tiny"), seed=0), EngineConfig(max_batch=4))
        srv = ReplicaServer(eng, name="tiny")
        await srv.start()
        try:
            prof = await asyncio.to_thread(
                profile_engine, eng, prefill_lens=(32,), batches=(1, 4), long_prompt=64
            )
            preset = dataclasses.replace(get_preset("cpu"), max_batch=4)
            return await loop_probe(srv.url, preset, prof), srv
        finally:
            await srv.stop()

    out, srv = asyncio.run(main())
    assert out["loop_iterations"] >= 20 and min(out["loop_base_s"], out["loop_per_seq_s"]) >= 0
    assert len(out["path_samples"]) == 8 and out["path_s"] > 0
    assert not srv.engine.log and srv.engine.sched.pool.cached == 0
