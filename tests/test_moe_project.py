"""``parlab project moe``: the rank function on 2 gloo ranks, its documents and report, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema_rs
import pytest

from parlab import contract
from parlab.cli import main
from parlab.projects.moe import (
    MoERunConfig,
    calibration_busbw,
    calibration_points,
    dispatch_plans,
    moe_rank,
    parse_skews,
    render_report,
    sweep_document,
    training_document,
    workload_document,
)
from parlab.runtime.testing import run_ranks

ENV = {
    "hardware": {"gpus": [], "gpu_count": 0, "cpu": {"count": 2}, "host_count": 1},
    "software": {"python": "3", "torch": "2", "parlab": "0"},
}


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(args)
    return int(info.value.code or 0)


def test_rank_function_documents_and_report(tmp_path: Path) -> None:
    cfg = MoERunConfig(
        ep=2, experts=4, topk=2, capacity_factor=1.0, hidden=16, ffn_hidden=32, tokens=64,
        skews=(1.5,), sweep=(0.5, 1.0, 4.0), train_steps=3, warmup=0, iters=1,
    )  # fmt: skip
    ranks = run_ranks(moe_rank, 2, **cfg.to_json())
    kw = {"tag": "moe-test", "command": "parlab project moe", "environment": ENV}
    cal = {"run_id": "collectives-x", "points": [(1e3, 1e9), (1e7, 2e9)]}
    docs = [workload_document(cfg, ranks, i, calibration=cal, **kw) for i in range(2)]
    docs += [sweep_document(cfg, ranks, **kw), training_document(cfg, ranks, **kw)]
    art = render_report(docs, tmp_path / "PAR-MOE-EXPERT", "moe-test")
    for d in docs:
        path = contract.write_result(d, tmp_path)
        jsonschema_rs.validate(contract.schema(), json.loads(path.read_text()))
    uniform, skewed, sweep, train = docs
    # the plan computed beforehand, with no process group, is the one the run exchanged
    plans = dispatch_plans(cfg)
    assert plans["uniform"] == uniform.workload["dispatch_plan"]
    assert plans["zipf:1.5"] == skewed.workload["dispatch_plan"]
    for d in (uniform, skewed):
        m = d.metrics
        assert d.evidence_level == "cpu-mechanism" and d.project == "PAR-MOE-EXPERT"
        assert m["tokens_routed"].value == 2 * 64 * 2
        assert m["effective_tokens"].value == sum(d.workload["per_expert_kept"])
        assert 0 <= m["unserved_tokens"].value <= m["tokens"].value
        rows = m["rank_load_max_over_mean"].per_rank
        assert sum(rows) == m["effective_tokens"].value  # every kept assignment computed once
        # the dispatch buffer is exactly the kept rows of this rank's tokens
        plans = d.workload["dispatch_plan"]
        assert m["dispatch_bytes"].per_rank == [sum(map(sum, p)) * 16 * 4 for p in plans]
        assert m["naive_max_abs_diff"].value < 1e-5  # naive and all-to-all agree
        assert m["unsharded_max_abs_diff"].value < 1e-5 < m["output_max_abs"].value
        assert m["dispatch_time"].value > 0 and m["expert_compute_time"].value > 0
        assert m["a2a_busbw"].value is not None and m["reference_a2a_busbw"].value is not None
    # skew: hot experts sit on rank 0, which computes more and drops more
    assert (
        skewed.metrics["expert_load_max_vio"].value > uniform.metrics["expert_load_max_vio"].value
    )
    assert skewed.metrics["overflow_rate"].value > uniform.metrics["overflow_rate"].value
    assert (
        skewed.metrics["rank_load_max_over_mean"].per_rank[0]
        > skewed.metrics["rank_load_max_over_mean"].per_rank[1]
    )
    # sweep: overflow falls as the capacity factor grows; nothing drops at 4
    rates = [r["overflow_rate"] for r in sweep.workload["sweep"] if r["workload"] == "zipf:1.5"]
    assert rates == sorted(rates, reverse=True) and rates[-1] == 0.0
    assert sweep.metrics["min_dropless_capacity_factor_uniform"].value in (1.0, 4.0)
    assert set(train.workload["per_step"]) == {"none", "aux", "bias"}
    for j, run in enumerate(ranks[0]["training"]):  # the replicated router stayed replicated
        assert run["router_checksum"] == ranks[1]["training"][j]["router_checksum"]
        if run["mode"] == "bias":
            assert run["router_checksum"][1] != 0.0 or run["steps"][0]["max_vio"] == 0
    # the analytic ledger's payload is the dropless one: T x k x H x 4 bytes (fp32)
    assert uniform.predictions["dispatch_bytes"].value == 64 * 2 * 16 * 4
    assert max(uniform.metrics["dispatch_bytes"].per_rank) <= 64 * 2 * 16 * 4
    pred = uniform.predictions["dispatch_time"]
    assert pred.model == "collectives-sweep:collectives-x" and pred.value > 0
    assert uniform.metrics["a2a_busbw_vs_calibration"].value is not None
    report = (tmp_path / "PAR-MOE-EXPERT" / art["report"]).read_text()
    assert "of parlab collectives" in report
    assert "How skew moves the slowest rank" in report and "r1e3" in report
    for key in ("load_png", "a2a_png", "overflow_png", "training_png"):
        assert (tmp_path / "PAR-MOE-EXPERT" / art[key]).stat().st_size > 1000


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--ep", "4", "--experts", "6"], "6 experts do not divide over --ep 4"),
        (["--experts", "4", "--topk", "5"], "--topk 5"),
        (["--capacity-factor", "0"], "--capacity-factor': '0' must be a finite number above 0"),
        (["--capacity-factor", "-1", "--drop", "probability"], "--capacity-factor"),
        (["--skew", "pareto:2"], "zipf:S"),
        (["--gating", "relu"], "gating"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(["project", "moe", "--results", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1
    assert not any(tmp_path.iterdir())  # nothing written, nothing launched


def test_dropless_accepts_any_capacity_factor() -> None:
    cfg = MoERunConfig(ep=2, experts=4, topk=2, capacity_factor=None, drop="none")
    assert cfg.router_config().capacity(100) is None


def test_parse_skews() -> None:
    assert parse_skews(["zipf:1.2", "zipf:0.5,zipf:2"]) == (1.2, 0.5, 2.0)


def test_calibration_lookup() -> None:
    data = {"workload": {"records": [
        {"op": "all_to_all", "size": 1000, "busbw": 1e9, "group_size": 2},
        {"op": "all_to_all", "size": 100_000, "busbw": 3e9, "group_size": 2},
        {"op": "all_reduce", "size": 1000, "busbw": 9e9, "group_size": 2},
        {"op": "all_to_all", "size": 1000, "busbw": 7e9, "group_size": 4},
    ]}}  # fmt: skip
    pts = calibration_points(data, 2)
    assert pts == [(1000.0, 1e9), (100_000.0, 3e9)]
    cal = {"run_id": "c", "points": pts}
    assert calibration_busbw(cal, 10_000) == pytest.approx(2e9)
    assert calibration_busbw(cal, 10) == 1e9 and calibration_busbw(cal, 1e9) == 3e9


def test_find_calibration_in_a_results_folder(tmp_path: Path) -> None:
    from parlab.contract import Document, Metric, write_result
    from parlab.projects.moe import find_calibration

    assert find_calibration(tmp_path, None, 2, "gloo") is None

    def doc(run_id: str, records: list[dict]) -> Document:
        return Document(
            run_id=run_id, created="2026-01-01T00:00:00Z", project="PAR-COLLECTIVES", task="T1",
            role="baseline", evidence_level="cpu-mechanism", command="parlab collectives",
            environment=ENV, workload={"kind": "collectives-sweep", "measurements": records},
            layout={"world_size": 2}, metrics={"busbw_peak": Metric(value=1.0, unit="B/s")},
        )  # fmt: skip

    rec = {"op": "all_to_all", "size": 4096, "busbw": 2e9, "group_size": 2}
    write_result(doc("sweep-a", [rec]), tmp_path)
    cal = find_calibration(tmp_path, None, 2, "gloo")
    assert cal is not None and cal["run_id"] == "sweep-a" and cal["points"] == [(4096.0, 2e9)]
    assert find_calibration(tmp_path, None, 2, "nccl") is None  # evidence levels never mix
    other = write_result(doc("sweep-b", [{**rec, "op": "all_reduce"}]), tmp_path)
    with pytest.raises(ValueError, match="no all_to_all"):
        find_calibration(tmp_path, other, 2, "gloo")


def test_hot_expert_placement() -> None:
    from parlab.projects.moe import hot_order

    assert hot_order(8, 2, "contiguous") == list(range(8))
    # Zipf ranks 0, 1, 2, 3 ... go to rank 0, rank 1, rank 0, rank 1 ...
    assert hot_order(8, 2, "spread") == [0, 4, 1, 5, 2, 6, 3, 7]
    assert sorted(hot_order(12, 4, "spread")) == list(range(12))
    with pytest.raises(ValueError, match="--hot"):
        MoERunConfig(ep=2, experts=4, topk=2, hot="middle")


def test_plan_prints_and_launches_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["project", "moe", "--ep", "2", "--experts", "4", "--tokens", "32", "--hidden", "16"]
    assert run_cli([*args, "--plan", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "dispatch plan, uniform" in out and "dispatch plan, zipf:1.2" in out
    assert "r1e3" in out and "computed" in out
    assert not any(tmp_path.iterdir())
