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


def test_loader_reads_gpu_probes_of_the_newest_device(tmp_path: Path) -> None:
    """Each bandwidth the mean over the GPU probes of the newest one's device; the casts' 12 B
    over a weight's cast and a gradient's, 6 B each; CPU probes left out."""
    import dataclasses

    from parlab.plan.fit.paramwork import load_param_work, param_work_calibration

    m = probe.probe(4096, (64, 64), torch.device("cpu"), warmup=0, repeats=1)
    assert param_work_calibration(tmp_path) is None
    for i, (adamw, cast, grad) in enumerate(((2e12, 3e12, 2e12), (4e12, 3e12, 2e12))):
        body = probe.calibration(m, device="NVIDIA H200", backend="cuda", hbm_bw=4.8e12,
                                 shape=[64, 64])  # fmt: skip
        for kind, bw in (("adamw", adamw), ("cast", cast), ("grad_cast", grad)):
            body["kinds"][kind]["bytes_per_s"] = bw
        doc = probe.document(body, command="t", environment=ENV)
        doc = dataclasses.replace(doc, created=f"2026-12-01T05:00:0{i}Z", run_id=f"param-work-{i}")
        write_result(doc, tmp_path)
        assert load_param_work(doc).cast_bw == pytest.approx(12 / (6 / 3e12 + 6 / 2e12))
    cpu = probe.document(probe.calibration(m, device="cpu", backend="cpu", hbm_bw=None,
                                           shape=[64, 64]), command="t", environment=ENV)  # fmt: skip
    write_result(cpu, tmp_path)
    got = param_work_calibration(tmp_path)
    assert got is not None and got.run_ids == ("param-work-0", "param-work-1")
    assert got.optimizer_bw == pytest.approx(3e12)


def test_bucket_bandwidth_only_from_probes_that_timed_the_bucket_passes(tmp_path: Path) -> None:
    """DDP's bucket passes (4 B zeroed, 12 B accumulated, 8 B scaled) as one bandwidth, 24 B over
    their seconds; a probe made before those kinds existed carries none and is left out of
    that mean (its other bandwidths still count)."""
    import dataclasses

    from parlab.plan.fit.paramwork import load_param_work, param_work_calibration

    m = probe.probe(4096, (64, 64), torch.device("cpu"), warmup=0, repeats=1)
    for i, bws in enumerate(({"zero_grad": 4e12, "accumulate": 3e12, "scale": 2e12}, {})):
        body = probe.calibration(m, device="NVIDIA H200", backend="cuda", hbm_bw=4.8e12,
                                 shape=[64, 64])  # fmt: skip
        for kind, bw in bws.items():
            body["kinds"][kind]["bytes_per_s"] = bw
        if not bws:  # an older probe: no accumulate or scale
            del body["kinds"]["accumulate"], body["kinds"]["scale"]
        doc = probe.document(body, command="t", environment=ENV)
        doc = dataclasses.replace(doc, created=f"2026-12-01T05:00:0{i}Z", run_id=f"param-work-{i}")
        write_result(doc, tmp_path)
    want = 24 / (4 / 4e12 + 12 / 3e12 + 8 / 2e12)
    got = param_work_calibration(tmp_path)
    assert got is not None and got.bucket_bw == pytest.approx(want)
    assert len(got.run_ids) == 2
    by_id = {d.run_id: d for d in map(read_document, tmp_path.rglob("*.json"))}
    assert load_param_work(by_id["param-work-1"]).bucket_bw == 0.0
    assert load_param_work(by_id["param-work-0"]).bucket_bw == pytest.approx(want)


def test_earlier_documents_with_host_seconds_and_a_copy_in_still_load(tmp_path: Path) -> None:
    """The probe's earlier documents carry each kind's host seconds and a ``chunk_cat`` kind:
    the loader reads their bandwidths as any other's and skips the rest; the probe no longer
    times either."""
    from parlab.plan.fit.paramwork import load_param_work

    m = probe.probe(4096, (64, 64), torch.device("cpu"), warmup=0, repeats=1)
    assert "chunk_cat" not in m["kinds"] and not any("host" in k for k in m["kinds"]["adamw"])
    body = probe.calibration(m, device="NVIDIA H200", backend="cuda", hbm_bw=4.8e12,
                             shape=[64, 64])  # fmt: skip
    plain = load_param_work(probe.document(body, command="t", environment=ENV))
    for k in body["kinds"].values():  # as the probe wrote them on 2026-12-01
        k["host_seconds"], k["host_s_per_param"] = 1e-3, 2e-12
    body["kinds"]["chunk_cat"] = {"seconds": 1e-3, "bytes": 8.0, "bytes_per_s": 8e3,
                                  "of_hbm": None, "host_seconds": 1e-3}  # fmt: skip
    body["chunk_cat_unit"] = 16
    old = load_param_work(probe.document(body, command="t", environment=ENV))
    assert (old.optimizer_bw, old.cast_bw, old.bucket_bw) == (
        plain.optimizer_bw,
        plain.cast_bw,
        plain.bucket_bw,
    )
