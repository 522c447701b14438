"""``parlab project model-internal`` runs: the parallel runs train like one rank; documents valid."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

# imported here once, so the forked ranks do not each import them (~2 s each)
import torch._dynamo
import torch.distributed.device_mesh
import torch.fx.experimental.symbolic_shapes  # noqa: F401

from parlab.contract import read_document, write_result
from parlab.hardware.env import snapshot
from parlab.projects.model_internal import comparison_set, document, mi_many
from parlab.runtime.testing import run_ranks

pytestmark = pytest.mark.timeout(120)


def test_parallel_runs_reproduce_single_rank_losses_and_write_valid_documents(
    tmp_path: Path,
) -> None:
    pairs = comparison_set("cpu", seq=32, steps=1)
    pick = {c.name: (b, c) for b, c in pairs}
    runs = []
    for name in ("tp2-sp", "pp2-1f1b", "cp2-ring"):
        b, c = pick[name]
        runs += [dataclasses.replace(b, warmup=1), dataclasses.replace(c, warmup=1)]
    out = run_ranks(mi_many, 2, [r.to_json() for r in runs], timeout=100)
    env = snapshot(probe_links=False)
    docs = {}
    for i, cfg in enumerate(runs):
        res = [out[r][i] for r in range(cfg.nproc)]
        doc = document(cfg, res, None, command="test", backend="gloo", environment=env)
        docs[cfg.name] = read_document(write_result(doc, tmp_path))
    for name in ("tp2-sp", "pp2-1f1b", "cp2-ring"):
        par, one = docs[name], docs[f"single-{name}"]
        # same seed, same data, AdamW: every step's loss matches the one-rank run
        for a, b in zip(par.workload["losses"], one.workload["losses"], strict=True):
            assert a == pytest.approx(b, abs=1e-4), name
        assert par.evidence_level == "cpu-mechanism" and par.role == "candidate"
        # every measured step is kept, and step_time is their median (one step here)
        assert par.workload["step_times"] == [par.metric("step_time")]
    pp = docs["pp2-1f1b"]
    # 4 micro-batches of 1 x 32 tokens x hidden 64 x fp32, sent once per boundary per rank
    assert pp.metric("comm_bytes_per_step.pp") == 4 * 32 * 64 * 4
    assert 0.0 <= pp.metric("pp_bubble") < 1.0 and "pp_bubble" in pp.predictions
    tp = docs["tp2-sp"]
    assert tp.metrics["comm_op_bytes.tp.all_gather"].value > 0
    assert tp.metric("param_bytes") == tp.predictions["param_bytes"].value
    cp = docs["cp2-ring"]
    assert cp.metric("comm_bytes_per_step.cp") > 0
    # the dispatcher-level meter also sees DDP's gradient all-reduce over the CP ranks
    assert cp.metric("c10d_bytes_per_step.all_reduce") >= cp.metric("param_bytes")


def test_a_failing_run_is_its_own_failure_and_the_set_goes_on() -> None:
    pairs = {c.name: (b, c) for b, c in comparison_set("cpu", seq=32, steps=1)}
    single, tp = pairs["tp2-sp"]
    runs = [
        dataclasses.replace(single, model="no-such-model"),  # fails on rank 0 alone
        dataclasses.replace(tp, model="no-such-model"),  # fails on both ranks
        tp,
    ]
    out = run_ranks(mi_many, 2, [r.to_json() for r in runs], timeout=100)
    assert out[0][0]["failure"]["kind"] == "crash" and out[1][0] is None
    assert all("failure" in out[r][1] for r in range(2))
    assert all("failure" not in out[r][2] and out[r][2]["losses"] for r in range(2))


def test_budget_skips_runs_that_do_not_fit() -> None:
    import time

    pairs = {c.name: (b, c) for b, c in comparison_set("cpu", seq=32, steps=1)}
    _, tp = pairs["tp2-sp"]
    runs = [tp.to_json(), tp.to_json()]
    # the deadline leaves time for the first run only (nothing is known before it)
    out = run_ranks(mi_many, 2, runs, deadline=time.time() + 1.0, timeout=100)
    assert "losses" in out[0][0]
    assert all(out[r][1]["failure"]["kind"] == "timeout" for r in range(2))


def test_torch_dtensor_tp_trains_like_one_rank() -> None:
    # parallelize_module leaves embeddings and norms plain: AdamW must take the mix
    pairs = {c.name: (b, c) for b, c in comparison_set("cpu", seq=32, steps=1)}
    single, tp = pairs["tp2-dtensor"]
    out = run_ranks(mi_many, 2, [single.to_json(), tp.to_json()], timeout=100)
    one, par = out[0][0]["losses"], out[0][1]["losses"]
    assert par == pytest.approx(one, abs=1e-4)


def test_torch_zero_bubble_v_trains_like_one_rank() -> None:
    """torch's ScheduleZBVZeroBubble over parlab's stages (rank 0 holds the first and the last
    stage, the loss is there): the same losses as one rank accumulating the micro-batches."""
    pairs = {c.name: (b, c) for b, c in comparison_set("cpu", seq=32, steps=1)}
    single, zbv = pairs["pp2-zbv-torch"]
    assert single.schedule == "1f1b" and zbv.vpp == 2
    out = run_ranks(mi_many, 2, [single.to_json(), zbv.to_json()], timeout=100)
    one, par = out[0][0]["losses"], out[0][1]["losses"]
    assert None not in par and par == pytest.approx(one, abs=1e-4)
    assert all(v is None for v in out[1][1]["losses"])  # rank 1 holds no loss in the V


def test_a_dead_launch_keeps_finished_runs_and_relaunches_the_rest(monkeypatch) -> None:
    import json

    import parlab.projects.model_internal.run as run_mod
    from parlab.contract import Failure
    from parlab.projects.model_internal import launch_set
    from parlab.runtime.launch import LaunchResult

    pairs = {c.name: (b, c) for b, c in comparison_set("cpu", seq=32, steps=1)}
    configs = [pairs["tp2-sp"][1], pairs["pp2-1f1b"][1], pairs["cp2-ring"][1]]
    calls: list[list[str]] = []

    def fake(entry, kwargs, config):  # type: ignore[no-untyped-def]
        names = [r["name"] for r in kwargs["runs"]]
        calls.append(names)
        if len(calls) == 1:  # finishes the first run, dies in the second
            for r in range(2):
                p = Path(kwargs["partial_dir"]) / f"run0.rank{r}.json"
                p.write_text(json.dumps({"result": {"step_times": [1.0], "rank": r}}))
            return LaunchResult(ok=False, results=[], failure=Failure(kind="timeout", message="x"))
        return LaunchResult(ok=True, results=[[{"rank": r}] for r in range(2)], failure=None)

    monkeypatch.setattr(run_mod, "launch", fake)
    outs, fails, _ = launch_set(configs, gpu=False, timeout_s=10, budget_s=100)
    assert calls == [["tp2-sp", "pp2-1f1b", "cp2-ring"], ["cp2-ring"]]
    assert outs[0] is not None and outs[0][1]["rank"] == 1 and fails[0] is None
    assert outs[1] is None and fails[1] is not None and fails[1].kind == "timeout"
    assert outs[2] is not None and fails[2] is None


def test_compiled_pipeline_runs_compile_their_baseline_too_and_tp_refuses_compile() -> None:
    from parlab.errors import UsageError
    from parlab.projects.model_internal import RunConfig

    pairs = {c.name: (b, c) for b, c in comparison_set("cpu", seq=32, steps=1)}
    for name in ("pp2-1f1b-compiled", "pp2-interleaved-compiled"):
        single, cand = pairs[name]
        assert single.compile and cand.compile and single.nproc == 1 and cand.pp == 2
    assert not pairs["pp2-1f1b"][1].compile and not pairs["pp2-1f1b"][0].compile
    with pytest.raises(UsageError, match="compile applies to parlab's pipeline"):
        RunConfig(name="x", model="tiny", nproc=2, tp=2, compile=True)
