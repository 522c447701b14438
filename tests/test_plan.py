"""``parlab plan``: the space, admission with reasons, the estimate's parts, ranking, Pareto, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema_rs
import pytest

from parlab import contract
from parlab.comm.model import collective_time, hierarchical_time
from parlab.ledger import Implementation, predict
from parlab.ledger.traffic import traffic
from parlab.models import get_spec
from parlab.plan.estimate import item_time
from parlab.plan.planner import plan
from parlab.plan.request import PlanRequest, PlanResult, Verdict
from parlab.plan.space import Candidate, make_cluster
from parlab.plan.throughput import Throughput, flops_per_token, measured_throughput
from parlab.topology import Topology
from tests.test_decide import training_doc


def request(model: str, gpus: str, *, per_node: int = 8, gb: int = 64, seq: int = 4096,
            **kw: object) -> PlanRequest:  # fmt: skip
    cluster = make_cluster(gpus=gpus, gpus_per_node=per_node)
    peak = cluster.gpu.peak("bf16")
    assert peak
    th = Throughput(mfu=0.4, peak_flops=peak, source="assumed MFU 0.4", assumed=True)
    old = dict(dtype="bf16-compute", optimizer="adamw", implementation=Implementation())
    return PlanRequest(
        spec=get_spec(model),
        cluster=cluster,
        global_batch=gb,
        seq=seq,
        compute=th,
        **{**old, **kw},
    )  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def small() -> PlanResult:
    return plan(request("1.3b", "8xH100"))


def _ddp8(res: PlanResult) -> Verdict:
    return next(
        v for v in res.ranked
        if (v.cand.strategy, v.cand.dp, v.cand.micro_batch, v.cand.recompute) == ("ddp", 8, 1, "none")
    )  # fmt: skip


def test_small_model_on_8_gpus_is_plain_data_parallel(small: PlanResult) -> None:
    top = small.top
    assert top is not None
    c = top.cand
    assert (c.dp, c.tp, c.pp, c.cp, c.recompute) == (8, 1, 1, 1, "none")
    # plain DDP ties with the top (nothing to shard away on 8 GPUs of 80 GB)
    ddp = _ddp8(small)
    assert ddp.tokens_per_s_per_gpu == pytest.approx(top.tokens_per_s_per_gpu, rel=0.01)
    # DDP's bucketed all-reduce runs once a step, under the last micro-batch's backward: all
    # but its last bucket hides there; no bubble
    e = ddp.estimate
    assert e is not None and e.comm_exposed_s < 0.2 * e.comm_overlappable_s
    assert e.bubble_s == 0.0
    # every candidate got a verdict, and every rejection a reason
    assert len(small.ranked) + len(small.rejected) > 1000
    assert all(v.reason and v.kind for v in small.rejected)


def test_step_time_parts_come_from_the_ledger_and_the_cost_model(small: PlanResult) -> None:
    req = small.request
    top = _ddp8(small)
    assert top.estimate is not None
    e, c = top.estimate, top.cand
    # compute = FLOPs of the batch / GPUs / achieved FLOP/s
    fpt, _ = flops_per_token(req.spec, req.seq)
    assert e.compute_s == pytest.approx(fpt * 64 * 4096 / 8 / req.compute.achieved)
    # the overlappable comm is exactly the ledger's wire table timed by parlab.comm
    topo = Topology(world_size=8, dp=8)
    items = traffic(req.spec, topo, "ddp", micro_batch=c.micro_batch, seq_len=4096,
                    microbatches=c.microbatches)  # fmt: skip
    expect = sum(
        collective_time("all_reduce", it.payload_bytes, 8, req.cluster.intra) * it.count_per_step
        for it in items
    )
    assert e.comm_overlappable_s == pytest.approx(expect) and expect > 0
    # the intra-node link: the catalog's NVLink at the fraction the lab's all-reduce reached
    assert (
        req.cluster.intra.bandwidth < 450e9 and "lab's NCCL all-reduce" in req.cluster.intra.source
    )
    # the peak is the ledger's
    led = predict(req.spec, strategy="ddp", topology=topo, micro_batch=c.micro_batch,
                  seq_len=4096, microbatches=c.microbatches, sp=False)  # fmt: skip
    assert top.peak_bytes == led.peak_bytes
    assert top.headroom_bytes == pytest.approx(80e9 - led.peak_bytes)
    assert e.step_s == pytest.approx(e.compute_s + e.comm_exposed_s + e.bubble_s)


def test_pipeline_bubble_and_pareto_front(small: PlanResult) -> None:
    piped = [v for v in small.ranked if v.cand.pp == 2 and v.cand.schedule == "1f1b"]
    assert piped
    v = piped[0]
    assert v.estimate is not None
    e = v.estimate
    # (sum of the stages' per-step work - the slowest's) / (v m): the other stage's work / m,
    # a little less than the slowest's, which holds the output layer
    slowest = (e.compute_s + e.comm_blocking_s) / v.cand.microbatches
    assert 0.8 * slowest < e.bubble_s < slowest
    inter = {
        w.cand.vpp for w in small.ranked if w.cand.schedule == "interleaved" and w.cand.pp == 2
    }
    assert {2, 3, 4, 6, 12} <= inter  # every v to one layer per chunk (24 layers, 2 stages)
    # the front: nobody beats a member on both axes; every other admitted one is beaten
    front = small.pareto
    assert front[0] is small.top
    for f in front:
        assert not any(
            w.tokens_per_s_per_gpu > f.tokens_per_s_per_gpu and w.peak_bytes < f.peak_bytes
            for w in small.ranked
        )  # type: ignore[operator]
    ids = {id(f) for f in front}
    for w in small.ranked[:200]:
        if id(w) not in ids:
            assert any(
                f.tokens_per_s_per_gpu >= w.tokens_per_s_per_gpu and f.peak_bytes <= w.peak_bytes
                for f in front
            )  # type: ignore[operator]


def test_tp16_on_8_gpu_nodes_is_rejected_with_the_reason() -> None:
    res = plan(request("1.3b", "16xH100", micro_batches=(1,), recompute=("none",),
                       strategies=("ddp",)))  # fmt: skip
    tp16 = [v for v in res.rejected if v.cand.tp == 16]
    assert tp16 and all(v.kind == "layout" for v in tp16)
    assert "tp <= gpus per node fails (tp 16, 8 GPUs per node" in tp16[0].reason
    assert not any(v.cand.tp == 16 for v in res.ranked)
    # tp spanning nodes is fine for the inter-node estimate of dp
    assert any(v.cand.tp == 8 and v.cand.dp == 2 for v in res.ranked)


def test_memory_rejection_says_by_how_much() -> None:
    res = plan(request("llama3.1-8b", "1xH100", gb=8, micro_batches=(1, 2)))
    assert not res.ranked
    kinds = res.rejected_by_kind()
    assert set(kinds) == {"memory"}
    ddp = [v for v in res.rejected if v.cand.strategy == "ddp"]
    # the first of a (layout, strategy) is the ledger's exact peak, with the excess
    first = next(v for v in ddp if "at least" not in v.reason)
    assert first.peak_bytes is not None
    assert first.reason.startswith(f"over memory by {(first.peak_bytes - 80e9) / 2**30:.2f} GiB")
    # its states alone -- 8.03B params x (4 + 4 + 8 AdamW) bytes -- exceed 80 GB, so the rest
    # of the group is rejected on that floor, "by at least"
    rest = [v for v in ddp if v is not first]
    assert rest and all(
        v.reason.startswith(("over memory by at least", "over memory: its peak is at least"))
        for v in rest
    )
    assert all(16 * 8.0e9 < (v.peak_bytes or 0) <= first.peak_bytes for v in rest)


def test_measured_throughput_from_a_training_document() -> None:
    doc = training_doc(role="baseline", strategy="fsdp", tps=40_000, step=1.0, mem=[1e9, 1e9])
    th = measured_throughput(doc, 989.4e12)
    assert not th.assumed and doc.run_id in th.source
    fpt, _ = flops_per_token(get_spec("1.3b"), 4096)
    assert th.mfu == pytest.approx(40_000 * fpt / 989.4e12)
    cpu = training_doc(role="baseline", strategy="ddp", tps=900, step=1.0, mem=[1e9, 1e9],
                       env={"hardware": {"gpus": []}}, level="cpu-mechanism")  # fmt: skip
    with pytest.raises(ValueError, match="MFU is unknown"):
        measured_throughput(cpu, 989.4e12)


def test_inter_node_groups_use_the_slower_link() -> None:
    req = request("1.3b", "16xH100")
    cand = Candidate(dp=16, tp=1, pp=1, cp=1, ep=1, strategy="ddp", micro_batch=1,
                     microbatches=4, recompute="none", schedule="-")  # fmt: skip
    [it] = [
        i for i in traffic(req.spec, Topology(world_size=16, dp=16), "ddp", seq_len=4096,
                           microbatches=4)[:1]
    ]  # fmt: skip
    flat_intra = collective_time("all_reduce", it.payload_bytes, 16, req.cluster.intra)
    c = req.cluster
    two_level = hierarchical_time(
        "all_reduce", it.payload_bytes, gpus_per_node=8, nodes=2, intra=c.intra, inter=c.inter
    )
    assert item_time(it, cand, c) == pytest.approx(two_level * it.count_per_step)
    assert two_level > flat_intra


def run_cli(args: list[str]) -> int:
    from parlab.cli import main

    with pytest.raises(SystemExit) as info:
        main(args)
    return int(info.value.code or 0)


def test_cli_writes_an_analytic_decision_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["plan", "--model", "1.3b", "--gpus", "8xH100", "--global-batch", "64", "--seq",
            "4096", "--micro-batch", "1", "--recompute", "none,full", "--mfu", "0.4",
            "--strategy", "ddp",
            "--results", str(tmp_path)]  # fmt: skip
    assert run_cli(args) == 0
    out = capsys.readouterr().out
    assert "Top choice: ddp dp8 mb1x8 rc:none" in out and "assumed MFU 0.4" in out
    assert out.splitlines()[1].startswith("Fits: ddp dp8")  # the answers come first
    [path] = (tmp_path / "PAR-TRAINING-STATE").glob("plan-*.json")
    data = json.loads(path.read_text())
    jsonschema_rs.validate(contract.schema(), data)
    assert data["evidence_level"] == "analytic" and data["role"] == "decision"
    assert data["decision"]["chosen"] == "ddp dp8 mb1x8 rc:none"
    assert data["layout"]["mesh"]["dp"] == 8 and data["layout"]["strategy"] == "ddp"
    for rel in data["artifacts"].values():
        assert (path.parent / rel).stat().st_size > 100
    assert run_cli([*args, "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["decision"]["chosen"] == "ddp dp8 mb1x8 rc:none"
    assert js["workload"]["ranked_top"][0]["admitted"]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--model", "gpt-9", "--gpus", "8xH100"], "unknown model 'gpt-9'"),
        (["--model", "1.3b", "--gpus", "8xV100"], "unknown GPU 'V100'"),
        (["--model", "1.3b", "--gpus", "12xH100", "--gpus-per-node", "8"], "whole nodes"),
        (["--model", "1.3b", "--gpus", "eight"], "COUNTxGPU"),
        (["--model", "1.3b", "--gpus", "8xH100", "--strategy", "ddp,magic"], "magic"),
        (["--model", "1.3b", "--gpus", "8xH100", "--strategies", "ddp"], "--strategy"),
        (["--model", "1.3b", "--gpus", "8xH100", "--mfu", "3"], "--mfu 3"),
        (["--model", "gpt2-1.5b", "--gpus", "8xH100"], "exceeds gpt2-1.5b's 1024 learned"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(
    args: list[str], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full = ["plan", *args, "--global-batch", "64", "--seq", "4096", "--results", str(tmp_path)]
    assert run_cli(full) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1
    assert not list(tmp_path.rglob("*.json"))


def test_a_calibration_replaces_the_catalog_link_for_its_ops() -> None:
    from parlab.comm.calibration import Calibration, OpFit

    slow = OpFit(op="all_reduce", algorithm="ring", group_size=8, alpha_s=1e-4,
                 beta_s_per_byte=1 / 5e9, intercept_s=0.0, slope_s_per_byte=0.0,
                 rms_rel_err=0.0, max_rel_err=0.0, points=10, min_bytes=8, max_bytes=2**30,
                 busbw_peak=5e9)  # fmt: skip
    cal = Calibration(run_id="collectives-calibration-x", source_run_id="collectives-x",
                      evidence_level="real-nccl", backend="nccl", group_size=8, devices=[],
                      link_bw=None, link_bw_source="", ops={"all_reduce": slow})  # fmt: skip
    cluster = make_cluster(gpus="8xH100", gpus_per_node=8, calibration=cal)
    link = cluster.intra_link("all_reduce")
    assert link.bandwidth == pytest.approx(5e9) and link.alpha_s == 1e-4
    assert cluster.intra_link("all_gather") is cluster.intra  # not fitted: the catalog's
    base = request("1.3b", "8xH100", micro_batches=(1,), recompute=("none",))
    from dataclasses import replace

    res = plan(replace(base, cluster=cluster))
    top = res.top
    assert top is not None and top.estimate is not None
    # a 5 GB/s all-reduce no longer hides behind backward: DDP is no longer free
    ddp = next(v for v in res.ranked if v.cand.strategy == "ddp" and v.cand.dp == 8)
    assert ddp.estimate is not None and ddp.estimate.comm_exposed_s > 0.5
    assert any("alpha-beta:collectives-calibration-x (real-nccl" in n for n in res.notes)


def test_cluster_from_an_environment_document() -> None:
    doc = training_doc(role="baseline", strategy="ddp", tps=1.0, step=1.0, mem=[1e9, 1e9])
    c = make_cluster(env_doc=doc)
    assert (c.gpu.name, c.count, c.gpus_per_node, c.nodes) == ("H200", 2, 2, 1)
    assert doc.run_id in c.source
    cpu = training_doc(role="baseline", strategy="ddp", tps=1.0, step=1.0, mem=[1e9, 1e9],
                       env={"hardware": {"gpus": []}})  # fmt: skip
    with pytest.raises(ValueError, match="lists no GPU"):
        make_cluster(env_doc=cpu)
    with pytest.raises(ValueError, match="give the cluster"):
        make_cluster()


def test_cli_documents_from_another_schema_are_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    foreign = tmp_path / "other.json"
    foreign.write_text(json.dumps({"schema": "someone-else/v3", "run_id": "x"}))
    base = ["plan", "--model", "1.3b", "--gpus", "8xH100", "--global-batch", "64", "--seq",
            "4096", "--results", str(tmp_path / "r")]  # fmt: skip
    for extra in (["--measured", str(foreign)], ["--env", str(foreign)]):
        assert run_cli([*base, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert "not a distributed-benchmark/v1 document" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_memory_rejection_says_when_a_fused_optimizer_would_fit() -> None:
    """A candidate over memory only by foreach AdamW's temporaries says that the fused form
    (no temporaries) fits, and its peak; one over memory without them says nothing of it."""

    def rejected(gpus: str) -> Verdict:
        req = PlanRequest(
            spec=get_spec("llama3.1-8b"), cluster=make_cluster(gpus=gpus, gpus_per_node=1),
            global_batch=1, seq=1024, compute=Throughput(mfu=0.4, peak_flops=1e15, source="t", assumed=True),
            micro_batches=(1,), strategies=("fsdp",), recompute=("full",), optimizer="adamw",
            dtype="bf16-compute", implementation=Implementation(),
        )  # fmt: skip
        [v] = plan(req).rejected
        return v

    near = rejected("1xH200")  # 141 GB: 160.6 GB with the temporaries, 132.7 GB without
    assert near.kind == "memory" and "with --optimizer adamw-fused" in near.reason
    assert "the peak is 123.57 GiB" in near.reason
    far = rejected("1xA100-40GB")  # 40 GB: over with or without them
    assert far.kind == "memory" and "adamw-fused" not in far.reason
