"""The GEMM-shape factor: the probe's per-shape timings and FLOP-weighted efficiency on the CPU,
the loader's choice of the newest GPU calibration, and the factor replacing the width law only
for the runs a calibration covers (the width law and the "not modelled" note elsewhere)."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from parlab.contract import read_document, write_result
from parlab.errors import UsageError
from parlab.plan import calibrate
from parlab.plan.roofline import Roofline
from parlab.plan.shapes import (
    GemmShapes,
    gemm_shape_calibration,
    load_gemm_shapes,
    shape_factor,
    shaped_roofline,
)

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "gemm_shapes_probe.py"
_spec = importlib.util.spec_from_file_location("gemm_shapes_probe", _PATH)
assert _spec is not None and _spec.loader is not None
probe = importlib.util.module_from_spec(_spec)
sys.modules["gemm_shapes_probe"] = probe
_spec.loader.exec_module(probe)

H200 = "NVIDIA H200"
ENV = {
    "hardware": {"gpus": [], "gpu_count": 0, "cpu": {"count": 2}, "host_count": 1},
    "software": {"python": "3.11", "torch": "2.13", "parlab": "0.1.0"},
}
ROOF = Roofline(gemm=0.7, attention=0.5, ring_attention=0.4, memory=0.8, gemm_width=2048,
                gemm_width_half=500)  # fmt: skip


def _body(**kw: Any) -> dict[str, Any]:
    entries = probe.probe([("gpt2-1.5b", [128]), ("1.3b", [128])], torch.device("cpu"),
                          shrink=16, warmup=0, repeats=2, inner=1)  # fmt: skip
    base = dict(device="cpu", backend="cpu", peak_flops=1e12, shrink=16, warmup=0, repeats=2,
                inner=1)  # fmt: skip
    return probe.calibration(entries, **{**base, **kw})


def test_probe_times_every_layer_and_output_gemm_on_the_cpu(tmp_path: Path) -> None:
    body = _body()
    gpt2, llama = body["models"]
    # GPT-2: wq wk wv wo w1 w2 + output (GeLU, no w3); the 1.3B adds w3; three passes each
    assert len(gpt2["gemms"]) == 7 * 3 and len(llama["gemms"]) == 8 * 3
    assert {g["pass"] for g in gpt2["gemms"]} == {"fwd", "dgrad", "wgrad"}
    out = [g for g in gpt2["gemms"] if g["name"] == "output"]
    assert [(g["m"], g["k"], g["n"], g["count"]) for g in out] == [(8, 100, 3142, 1)] * 3
    w1 = next(g for g in gpt2["gemms"] if g["name"] == "w1" and g["pass"] == "fwd")
    assert (w1["k"], w1["n"], w1["count"], w1["bias"]) == (100, 400, 48, True)
    assert w1["flops"] == 2.0 * 8 * 100 * 400 and w1["time_s"] > 0
    # FLOP-weighted: layers x layer GEMMs + the output, over their seconds, over the peak
    flops = sum(g["count"] * g["flops"] for g in gpt2["gemms"])
    secs = sum(g["count"] * g["time_s"] for g in gpt2["gemms"])
    assert gpt2["flops"] == pytest.approx(flops) and gpt2["time_s"] == pytest.approx(secs)
    assert gpt2["efficiency"] == pytest.approx(flops / secs / 1e12)
    assert _body(peak_flops=None)["models"][0]["efficiency"] is None  # unknown peak: unknown
    # the document: written, read back, no step time; a CPU (shrunk) one is never used
    doc = read_document(write_result(probe.document(body, command="t", environment=ENV), tmp_path))
    assert doc.evidence_level == "cpu-mechanism" and doc.metric("step_time") is None
    assert doc.workload["calibration"]["models"][0]["gemms"][0]["samples_s"]
    with pytest.raises(UsageError, match="shrunk"):
        load_gemm_shapes(doc)
    assert gemm_shape_calibration(tmp_path) is None


def _gpu_doc(eff: dict[str, float], created: str, level: str = "real-training") -> Any:
    body = _body(device=H200, backend="cuda", shrink=1)
    body["models"] = [dict(m, efficiency=eff[m["model"]]) for m in body["models"]]
    doc = probe.document(body, command="t", environment=ENV)
    return dataclasses.replace(doc, created=created, evidence_level=level,
                               run_id=f"gemm-shapes-{created[-3:-1]}")  # fmt: skip


def test_loader_merges_the_gpu_calibrations_of_one_device(tmp_path: Path) -> None:
    """Every GPU probe of the newest one's device, each measurement their mean; CPU probes and
    other devices' left out."""
    for eff, created, level in (
        ({"gpt2-1.5b": 0.4, "1.3b": 0.8}, "2026-11-30T10:00:01Z", "real-training"),
        ({"gpt2-1.5b": 0.5, "1.3b": 0.7}, "2026-11-30T10:00:02Z", "real-training"),
        ({"gpt2-1.5b": 0.1, "1.3b": 0.9}, "2026-11-30T10:00:03Z", "cpu-mechanism"),
    ):
        write_result(_gpu_doc(eff, created, level), tmp_path)
    cal = gemm_shape_calibration(tmp_path)
    assert cal is not None and cal.device == H200
    assert cal.efficiency == {("gpt2-1.5b", 128): pytest.approx(0.45), ("1.3b", 128): 0.75}
    assert cal.factor("gpt2-1.5b", 128, 2048) == (pytest.approx(0.45 / 0.75), "1.3b")
    assert cal.run_id == "gemm-shapes-01 + gemm-shapes-02"
    other = _gpu_doc({"gpt2-1.5b": 0.2, "1.3b": 0.4}, "2026-11-30T10:00:04Z")
    body = other.workload["calibration"]
    other = dataclasses.replace(
        other, workload={**other.workload, "calibration": {**body, "device": "NVIDIA A100"}}
    )
    write_result(other, tmp_path)
    newest = gemm_shape_calibration(tmp_path)
    assert newest is not None and newest.device == "NVIDIA A100"
    assert newest.efficiency == {("gpt2-1.5b", 128): 0.2, ("1.3b", 128): 0.4}
    assert cal.factor("gpt2-1.5b", 256, 2048) is None  # other tokens: not measured
    assert cal.factor("gpt2-1.5b", 128, 4096) is None  # no measured model at the reference width


def _run(model: str, mb: int, seq: int, tp: int = 1, gpu: str = H200) -> Any:
    return SimpleNamespace(
        workload={"preset": model, "model": model, "micro_batch": mb, "seq": seq},
        layout={"mesh": {"dp": 2, "tp": tp}},
        environment={"hardware": {"gpus": [{"name": gpu}]}},
    )


SHAPES = GemmShapes(run_id="gemm-shapes-t", evidence_level="real-training", device=H200,
                    efficiency={("gpt2-1.5b", 8192): 0.45, ("1.3b", 8192): 0.75,
                                ("1.3b", 4096): 0.7},
                    hidden={"gpt2-1.5b": 1600, "1.3b": 2048})  # fmt: skip


def test_factor_replaces_the_width_law_for_a_covered_model_only() -> None:
    got = shaped_roofline(_run("gpt2-1.5b", 8, 1024), ROOF, SHAPES)
    assert got.gemm_at(1600) == pytest.approx(0.7 * 0.45 / 0.75)  # measured, not f(1600)/f(2048)
    assert ROOF.gemm_at(1600) != pytest.approx(got.gemm_at(1600))
    assert got.gemm_width_half == 0.0 and "measured against 1.3b" in got.source
    # the reference's own runs: factor 1, as the width law gives at its width
    ref = shaped_roofline(_run("1.3b", 2, 4096), ROOF, SHAPES)
    assert ref.gemm_at(2048) == pytest.approx(ROOF.gemm_at(2048))
    for other in (
        _run("8b", 1, 4096),  # not measured
        _run("gpt2-1.5b", 4, 1024),  # other tokens per micro-batch
        _run("gpt2-1.5b", 8, 1024, tp=2),  # tensor-sharded shapes
        _run("gpt2-1.5b", 8, 1024, gpu="NVIDIA A100-SXM4-80GB"),  # measured on another GPU
    ):
        assert shaped_roofline(other, ROOF, SHAPES) is ROOF
    assert shaped_roofline(_run("gpt2-1.5b", 8, 1024), ROOF, None) is ROOF


def test_unmodelled_note_goes_only_where_a_calibration_covers_gpt2() -> None:
    run = _run("gpt2-1.5b", 8, 1024)
    run.project, run.layout["strategy"] = "PAR-TRAINING-STATE", "ddp"
    assert "not modelled" in calibrate.unmodelled(run)
    assert "not modelled" in calibrate.unmodelled(run, roofline=ROOF)  # no calibration
    assert "not modelled" in calibrate.unmodelled(run, shapes=SHAPES)  # no reference width
    assert calibrate.unmodelled(run, shapes=SHAPES, roofline=ROOF) == ""
    assert shape_factor(run, ROOF, SHAPES) == (pytest.approx(0.6), "1.3b")


def test_predict_of_a_committed_gpt2_run_uses_the_factor_only_with_a_calibration() -> None:
    root = Path(__file__).resolve().parents[1] / "results" / "PAR-TRAINING-STATE"
    path = root / "train-ddp-gpt2-1.5b-20261130T154621-eedc28.json"
    if not path.exists():
        pytest.skip("the committed GPT-2 run is not in this checkout")
    doc = read_document(path)
    plain = calibrate.predict(doc, ROOF)
    assert plain is not None
    assert calibrate.predict(doc, ROOF, shapes=None).step_s == plain.step_s  # type: ignore[union-attr]
    shaped = calibrate.predict(doc, ROOF, shapes=SHAPES)
    assert shaped is not None
    direct = calibrate.predict(doc, shaped_roofline(doc, ROOF, SHAPES))
    assert direct is not None and shaped.compute_s == pytest.approx(direct.compute_s)
    assert shaped.compute_s > plain.compute_s  # 0.6 is below the law's f(1600)/f(2048) = 0.95


def test_the_shape_factor_skips_models_the_width_law_describes() -> None:
    """Models whose every GEMM dimension divides into 128 (the law's own fitting runs) keep the
    width law; GPT-2's 1,600 / 6,400 / 50,257 get the measured factor."""
    from parlab.plan.shapes import aligned

    assert aligned("1.3b") and aligned("8b") and aligned("llama3.1-8b")
    assert not aligned("gpt2-1.5b") and aligned("no-such-model")
