"""``benchmarks/param_work_probe.py``: the per-parameter work's bandwidth, on the CPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from parlab.contract import read_document, write_result

_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(_DIR))
_spec = importlib.util.spec_from_file_location("param_work_probe", _DIR / "param_work_probe.py")
assert _spec is not None and _spec.loader is not None
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)

ENV = {
    "hardware": {"gpus": [], "gpu_count": 0, "cpu": {"count": 2}, "host_count": 1},
    "software": {"python": "3.11", "torch": "2.13", "parlab": "0.1.0"},
}


def test_probe_times_each_kind_over_whole_tensors(tmp_path: Path) -> None:
    # 3 tensors of 64 x 64: 12,288 parameters (13,000 asked, rounded down to whole tensors)
    m = probe.probe(13_000, (64, 64), torch.device("cpu"), warmup=1, repeats=2)
    assert (m["tensors"], m["params"]) == (3, 12_288)
    for kind, per in probe.BYTES_PER_PARAM.items():
        assert m["kinds"][kind]["bytes"] == per * 12_288 and m["kinds"][kind]["seconds"] > 0
    body = probe.calibration(m, device="cpu", backend="cpu", hbm_bw=None, shape=[64, 64])
    assert all(k["of_hbm"] is None for k in body["kinds"].values())  # no catalog bandwidth
    adamw = body["kinds"]["adamw"]
    assert adamw["bytes_per_s"] == pytest.approx(adamw["bytes"] / adamw["seconds"])
    on_gpu = probe.calibration(m, device="H200", backend="cuda", hbm_bw=4.8e12, shape=[64, 64])
    assert on_gpu["kinds"]["cast"]["of_hbm"] == pytest.approx(
        on_gpu["kinds"]["cast"]["bytes_per_s"] / 4.8e12
    )
    doc = read_document(write_result(probe.document(body, command="t", environment=ENV), tmp_path))
    assert doc.evidence_level == "cpu-mechanism" and doc.metric("step_time") is None
    assert doc.workload["kind"] == "param-work-calibration"
    assert doc.metric("bytes_per_s:adamw") == pytest.approx(adamw["bytes_per_s"])
