"""The T1 table: rows from the ledger's wire table, times from a calibration or the catalog link."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema_rs
import pytest

from parlab import contract
from parlab.cli import main
from parlab.comm import model
from parlab.comm import ops as O
from parlab.comm.calibration import calibration_document, load_calibration
from parlab.comm.explain import OP_OF, explain_document, parse_layout
from parlab.comm.sweep import SweepSpec, build_document
from parlab.ledger.traffic import traffic
from parlab.models.catalog import get_spec

ALPHA, BW = 8e-6, 300e9
H200_ENV = {
    "hardware": {
        "gpus": [{"name": "NVIDIA H200", "memory_bytes": 150_000_000_000}] * 2,
        "gpu_count": 2,
        "interconnect": {"per_direction_bw": [[None, 478e9], [478e9, None]], "source": "test"},
        "cpu": {"count": 16},
        "host_count": 1,
    },
    "software": {"python": "3.12", "torch": "2.11", "parlab": "0.1.0", "cuda": "13.0"},
}


def synthetic_sweep(tmp_path: Path) -> Path:
    """A sweep document whose times follow the ring model exactly (alpha 8 us, 300 GB/s)."""
    link = model.Link(alpha_s=ALPHA, beta_s_per_byte=1 / BW)
    spec = SweepSpec(ops=tuple(O.OPS), minbytes=8, maxbytes=1 << 30, nproc=2, backend="nccl")
    records = []
    for op, req, size in spec.plan():
        t = model.collective_time(op, size, 2, link)
        algbw = size / t if size else 0.0
        records.append(
            {
                "op": op, "requested_bytes": req, "size": size, "count": 0, "type": "float",
                "redop": "sum", "root": -1, "inplace": False, "graph": False, "method": "test",
                "time_s": t, "time_median_s": t, "time_min_s": t, "time_max_s": t, "samples": 1,
                "time_per_rank_s": [t, t], "algbw": algbw,
                "busbw": algbw * O.busbw_factor(op, 2), "wrong": 0, "group_size": 2,
            }
        )  # fmt: skip
    doc = build_document(
        spec, records, backend="nccl", environment=H200_ENV, devices=["H200"] * 2, command="t"
    )
    assert doc.evidence_level == "real-nccl"
    assert doc.metric("all_reduce.busbw_pct_of_link") == pytest.approx(100 * BW / 478e9, rel=1e-2)
    return contract.write_result(doc, tmp_path)


def test_rows_are_the_ledger_wire_table(tmp_path: Path) -> None:
    doc = explain_document(
        model_name="1.3b", layout="dp=4,tp=2", strategy="fsdp", micro_batch=2, seq=2048,
        calibration=None, command="t", gpu="H200",
    )  # fmt: skip
    want = traffic(get_spec("1.3b"), parse_layout("dp=4,tp=2"), "fsdp", micro_batch=2, seq_len=2048)
    rows = doc.workload["wire_table"]
    assert len(rows) == len(want) > 0
    h200 = model.Link.from_bandwidth(450e9, None, "catalog")
    for row, it in zip(rows, want, strict=True):
        assert (row["collective"], row["axis"], row["group_size"]) == (
            it.collective,
            it.axis,
            it.group_size,
        )
        assert (row["payload_bytes"], row["count_per_step"]) == (
            it.payload_bytes,
            it.count_per_step,
        )
        assert row["predicted_by"] == "catalog-link"
        want_t = model.collective_time(OP_OF[it.collective], it.payload_bytes, it.group_size, h200)
        assert row["time_per_call_s"] == pytest.approx(want_t)
    assert {r["source"] for r in rows} == {"fsdp", "tp"}
    assert doc.metric("bytes_per_step") == sum(it.total_bytes for it in want)
    assert "bandwidth only" in doc.predictions["comm_time_per_step"].model
    contract.write_result(doc, tmp_path)  # valid against the schema


def test_calibration_predicts_at_other_group_sizes(tmp_path: Path) -> None:
    sweep = contract.read_document(synthetic_sweep(tmp_path / "sweep"))
    cal_doc = calibration_document(sweep, command="t")
    path = contract.write_result(cal_doc, tmp_path / "cal")
    jsonschema_rs.validate(contract.schema(), json.loads(path.read_text()))
    cal = load_calibration(tmp_path / "cal")
    assert cal.link_bw == 478e9 and cal.evidence_level == "real-nccl"
    ar = cal.ops["all_reduce"]
    # the fit recovers the alpha and beta the synthetic times were made from
    assert ar.alpha_s == pytest.approx(ALPHA, rel=1e-6)
    assert ar.beta_s_per_byte == pytest.approx(1 / BW, rel=1e-6)
    assert ar.beta_s_per_byte != pytest.approx(1 / 478e9, rel=1e-2)  # not the link peak
    doc = explain_document(
        model_name="1.3b", layout="dp=8,tp=2", strategy="zero3", micro_batch=1, seq=1024,
        calibration=tmp_path / "cal", command="t",
    )  # fmt: skip
    link = model.Link(alpha_s=ALPHA, beta_s_per_byte=1 / BW)
    for row in doc.workload["wire_table"]:
        assert row["predicted_by"] == "calibration"
        want = model.collective_time(row["op"], row["payload_bytes"], row["group_size"], link)
        assert row["time_per_call_s"] == pytest.approx(want, rel=1e-6)
    assert cal.run_id in doc.predictions["comm_time_per_step"].model


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(args)
    return int(info.value.code or 0)


def test_cli_table_and_bad_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["collectives", "--explain", "tiny", "--layout", "dp=2,tp=2", "--gpus", "H100"]
    assert run_cli([*args, "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "all-reduce" in out and "catalog-link" in out
    bad = tmp_path / "bad"
    assert (
        run_cli(
            ["collectives", "--explain", "tiny", "--layout", "dp=2;tp=2", "--results", str(bad)]
        )
        == 2
    )
    assert "cannot parse --layout" in capsys.readouterr().err
    assert run_cli(["collectives", "--explain", "tiny", "--results", str(bad)]) == 2
    assert "--explain needs --layout" in capsys.readouterr().err
    assert not bad.exists()
