"""The shape factors: the probe's per-shape timings (GEMMs, bias gradients, the attention core)
and FLOP-weighted efficiency on the CPU, the loader's choice and merge of the GPU calibrations
(v1 and v2), the GEMM factor replacing the width law only for the runs a calibration covers,
and the attention factor scaling the attention term only where the run's batch was measured
(the width law and the "not modelled" note elsewhere)."""

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
from parlab.models import get_spec
from parlab.plan.elementwise import causal_attention_flops_per_token
from parlab.plan.fit import calibrate
from parlab.plan.fit.shape_probe import (
    GemmShapes,
    forward_efficiency,
    gemm_shape_calibration,
    load_gemm_shapes,
    merge,
)
from parlab.plan.fit.shapes import (
    attention_factor,
    doc_batch,
    rc_efficiency,
    shape_factor,
    shaped_roofline,
)
from parlab.plan.roofline import Roofline

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
    # gpt2-1.5b at 128 tokens (attention 1 x 128); the 1.3B at 2 x 64 and 1 x 128: one GEMM
    # entry (equal tokens), two attention entries
    measured = probe.probe([("gpt2-1.5b", [128]), ("1.3b", [(2, 64), 128])], torch.device("cpu"),
                           shrink=16, warmup=0, repeats=2, inner=1)  # fmt: skip
    base = dict(device="cpu", backend="cpu", peak_flops=1e12, shrink=16, warmup=0, repeats=2,
                inner=1)  # fmt: skip
    return probe.calibration(measured, **{**base, **kw})


def test_probe_times_every_layer_and_output_gemm_on_the_cpu(tmp_path: Path) -> None:
    body = _body()
    assert body["format"] == "parlab-gemm-shapes/v3"
    gpt2, llama = body["models"]
    # GPT-2: wq wk wv wo w1 w2 + output (GeLU, no w3), three passes each, and a bias gradient
    # for each of its six biased linears (the output has none); the 1.3B: w3, no bias
    assert len(gpt2["gemms"]) == 7 * 3 + 6 and len(llama["gemms"]) == 8 * 3
    assert {g["pass"] for g in gpt2["gemms"]} == {"fwd", "dgrad", "wgrad", "bgrad"}
    assert {g["pass"] for g in llama["gemms"]} == {"fwd", "dgrad", "wgrad"}
    out = [g for g in gpt2["gemms"] if g["name"] == "output"]
    assert [(g["m"], g["k"], g["n"], g["count"]) for g in out] == [(8, 100, 3142, 1)] * 3
    w1 = next(g for g in gpt2["gemms"] if g["name"] == "w1" and g["pass"] == "fwd")
    assert (w1["k"], w1["n"], w1["count"], w1["bias"]) == (100, 400, 48, True)
    assert w1["flops"] == 2.0 * 8 * 100 * 400 and w1["time_s"] > 0
    bgrad = [g for g in gpt2["gemms"] if g["pass"] == "bgrad"]
    assert [g["name"] for g in bgrad] == ["wq", "wk", "wv", "wo", "w1", "w2"]
    assert all(g["flops"] == 0.0 and g["time_s"] > 0 and g["bias"] for g in bgrad)
    assert gpt2["bgrad_time_s"] == pytest.approx(sum(48 * g["time_s"] for g in bgrad))
    assert llama["bgrad_time_s"] == 0.0
    # FLOP-weighted: layers x layer GEMMs + the output, over their seconds (bias gradients'
    # included), over the peak
    flops = sum(g["count"] * g["flops"] for g in gpt2["gemms"])
    secs = sum(g["count"] * g["time_s"] for g in gpt2["gemms"])
    assert secs > sum(g["count"] * g["time_s"] for g in gpt2["gemms"] if g["pass"] != "bgrad")
    assert gpt2["flops"] == pytest.approx(flops) and gpt2["time_s"] == pytest.approx(secs)
    assert gpt2["efficiency"] == pytest.approx(flops / secs / 1e12)
    assert _body(peak_flops=None)["models"][0]["efficiency"] is None  # unknown peak: unknown
    # the attention core: one entry per (model, micro-batch, sequence), heads, head dim and
    # sequence shrunk, the micro-batch kept; FLOPs 6 H D S x B S
    att = {(a["model"], a["micro_batch"], a["seq"]): a for a in body["attention"]}
    assert set(att) == {("gpt2-1.5b", 1, 128), ("1.3b", 2, 64), ("1.3b", 1, 128)}
    a = att[("1.3b", 2, 64)]
    assert a["timed"] == {
        "batch": 2,
        "heads": 1,
        "kv_heads": 1,
        "seq": 4,
        "head_dim": 8,
        "flops": 6.0 * 1 * 8 * 4 * 2 * 4,
    }
    assert a["time_s"] > 0 and a["efficiency"] == pytest.approx(a["flops"] / a["time_s"] / 1e12)
    assert att[("gpt2-1.5b", 1, 128)]["timed"]["head_dim"] == 4  # 64 / 16
    # the document: written, read back, no step time; a CPU (shrunk) one is never used
    doc = read_document(write_result(probe.document(body, command="t", environment=ENV), tmp_path))
    assert doc.evidence_level == "cpu-mechanism" and doc.metric("step_time") is None
    assert doc.workload["calibration"]["models"][0]["gemms"][0]["samples_s"]
    assert doc.metric("attention_efficiency:1.3b@2x64") is not None
    with pytest.raises(UsageError, match="shrunk"):
        load_gemm_shapes(doc)
    assert gemm_shape_calibration(tmp_path) is None


def test_attention_flops_are_the_rooflines_causal_flops_of_one_layer() -> None:
    """Unshrunk, the probe's attention FLOPs are ``causal_attention_flops_per_token / layers`` x
    the micro-batch's tokens, and a GQA model's k and v are repeated to every query head."""
    for name, mb, seq in (("gpt2-1.5b", 8, 1024), ("8b", 2, 4096), ("qwen2.5-7b", 1, 1024)):
        spec = get_spec(name)
        a = probe.attention_shape(spec, (mb, seq))
        want = causal_attention_flops_per_token(spec, seq) / spec.layers * mb * seq
        assert a["flops"] == pytest.approx(want)
        assert (a["heads"], a["kv_heads"], a["head_dim"]) == (
            spec.heads,
            spec.n_kv_heads,
            spec.d_head,
        )
    shrunk = probe.attention_shape(get_spec("8b"), (2, 4096), shrink=16)
    assert (shrunk["heads"], shrunk["kv_heads"], shrunk["seq"]) == (4, 1, 256)  # 32/8 GQA kept


def test_each_pass_runs_what_autograd_runs() -> None:
    """fwd, dgrad, wgrad: the linear and its two gradient GEMMs; bgrad: the bias gradient, the
    output gradient summed over the tokens; the attention core: forward and backward, k and v
    of a GQA model repeated to the query heads (their gradients in their own KV heads)."""
    cpu = torch.device("cpu")
    x = torch.randn(6, 4, requires_grad=True)
    w = torch.randn(5, 4, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    y = torch.nn.functional.linear(x, w, b)
    dy = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))  # the probe's operand
    y.backward(dy)
    rows = {p: {"pass": p, "m": 6, "k": 4, "n": 5, "bias": True} for p in probe.PASSES}
    got = {p: probe._operands(g, cpu, torch.float32)() for p, g in rows.items()}
    assert x.grad is not None and w.grad is not None
    assert {p: tuple(t.shape) for p, t in got.items()} == {
        "fwd": tuple(y.shape),
        "dgrad": tuple(x.grad.shape),
        "wgrad": tuple(w.grad.shape),
        "bgrad": (1, 5),
    }
    assert b.grad is not None and torch.allclose(got["bgrad"][0], b.grad)  # autograd's own
    a = probe.attention_shape(get_spec("8b"), (2, 64), shrink=4)  # 8 heads, 2 KV heads
    dq, dk, dv = probe._attention_op(a, cpu, torch.float32)()
    assert tuple(dq.shape) == (2, 16, 8, 32) and tuple(dk.shape) == tuple(dv.shape) == (
        2,
        16,
        2,
        32,
    )


def test_model_items_are_tokens_or_micro_batch_x_sequence() -> None:
    assert probe.parse_models(["1.3b:2x4096,8192", "gpt2-1.5b"], 512) == [
        ("1.3b", [(2, 4096), (1, 8192)]),
        ("gpt2-1.5b", [(1, 512)]),
    ]
    for bad in ("1.3b:2x", "1.3b:0x4096", "1.3b:many"):
        with pytest.raises(ValueError, match=r"give|at least"):
            probe.parse_models([bad], 512)


def test_cpu_dry_run_writes_a_v2_document(tmp_path: Path, monkeypatch: Any) -> None:
    """The probe's command line on the CPU (shapes shrunk 16x, as scripts/gpu/gemm_shapes.sh
    runs it without a GPU): a v2 document with GPT-2's bias gradients and attention entries."""
    argv = [
        "gemm_shapes_probe.py",
        str(tmp_path),
        "--model",
        "gpt2-1.5b:8x1024",
        "--model",
        "1.3b:8x1024",
        "--shrink",
        "16",
        "--warmup",
        "0",
        "--repeats",
        "1",
        "--inner",
        "1",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    assert probe.main() == 0
    (path,) = (tmp_path / "PAR-TRAINING-STATE").glob("gemm-shapes-*.json")
    body = read_document(path).workload["calibration"]
    assert body["format"] == "parlab-gemm-shapes/v3" and body["shrink"] == 16
    gpt2 = next(m for m in body["models"] if m["model"] == "gpt2-1.5b")
    assert gpt2["tokens"] == 8192 and sum(g["pass"] == "bgrad" for g in gpt2["gemms"]) == 6
    assert {(a["model"], a["micro_batch"], a["seq"]) for a in body["attention"]} == {
        ("gpt2-1.5b", 8, 1024),
        ("1.3b", 8, 1024),
    }


def _gpu_doc(
    eff: dict[str, float],
    created: str,
    level: str = "real-training",
    *,
    attn: dict[str, float] | None = None,
    v1: bool = False,
    version: int = 2,
) -> Any:
    """A GPU probe document from the CPU body: ``eff`` each model's GEMM efficiency, ``attn``
    each model's attention efficiency; ``v1``: as the v1 probe wrote it (no bias gradients, no
    attention); else in format ``version`` (2: launches timed as the host issued them, 3:
    queued)."""
    body = _body(device=H200, backend="cuda", shrink=1)
    body["format"] = f"parlab-gemm-shapes/v{version}"
    body["models"] = [dict(m, efficiency=eff[m["model"]]) for m in body["models"]]
    body["attention"] = [
        dict(a, efficiency=(attn or {}).get(a["model"])) for a in body["attention"]
    ]
    if v1:
        body["format"] = "parlab-gemm-shapes/v1"
        body["models"] = [
            dict(m, gemms=[g for g in m["gemms"] if g["pass"] != "bgrad"]) for m in body["models"]
        ]
        del body["attention"], body["passes"]
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


def test_loader_reads_v1_and_v2() -> None:
    """A v1 document: GEMM efficiencies only; a v2 one: its attention entries too, keyed by
    (model, micro-batch, sequence). GPT-2 is biased in both (v1 knew its forward's bias)."""
    v1 = load_gemm_shapes(
        _gpu_doc({"gpt2-1.5b": 0.4, "1.3b": 0.8}, "2026-11-30T10:00:01Z", v1=True)
    )
    assert (v1.version, v1.attention, v1.biased) == (1, {}, frozenset({"gpt2-1.5b"}))
    assert v1.efficiency == {("gpt2-1.5b", 128): 0.4, ("1.3b", 128): 0.8}
    v2 = load_gemm_shapes(
        _gpu_doc(
            {"gpt2-1.5b": 0.5, "1.3b": 0.7},
            "2026-11-30T10:00:02Z",
            attn={"gpt2-1.5b": 0.2, "1.3b": 0.4},
        )
    )
    assert (v2.version, v2.biased) == (2, frozenset({"gpt2-1.5b"}))
    assert v2.attention == {("gpt2-1.5b", 1, 128): 0.2, ("1.3b", 2, 64): 0.4, ("1.3b", 1, 128): 0.4}
    assert v2.attention_factor("gpt2-1.5b", 1, 128, 2048) == (pytest.approx(0.5), "1.3b")
    assert v2.attention_factor("gpt2-1.5b", 2, 64, 2048) is None  # GPT-2 not measured there


def test_merge_keeps_a_biased_models_newest_format_and_averages_the_rest(tmp_path: Path) -> None:
    """v1 timed no bias gradient: GPT-2's v1 efficiency is not averaged with its v2 ones; the
    1.3B (no bias) measures the same GEMMs in both, so every probe counts; attention: v2 only."""
    for eff, attn, created, v1 in (
        ({"gpt2-1.5b": 0.6, "1.3b": 0.9}, None, "2026-11-30T10:00:01Z", True),
        (
            {"gpt2-1.5b": 0.5, "1.3b": 0.8},
            {"gpt2-1.5b": 0.2, "1.3b": 0.4},
            "2026-11-30T10:00:02Z",
            False,
        ),
        (
            {"gpt2-1.5b": 0.4, "1.3b": 0.7},
            {"gpt2-1.5b": 0.3, "1.3b": 0.5},
            "2026-11-30T10:00:03Z",
            False,
        ),
    ):
        write_result(_gpu_doc(eff, created, attn=attn, v1=v1), tmp_path)
    cal = gemm_shape_calibration(tmp_path)
    assert cal is not None and cal.version == 2
    assert cal.efficiency == {
        ("gpt2-1.5b", 128): pytest.approx(0.45),  # v2's alone
        ("1.3b", 128): pytest.approx(0.8),
    }
    assert cal.attention[("gpt2-1.5b", 1, 128)] == pytest.approx(0.25)
    assert cal.attention[("1.3b", 2, 64)] == pytest.approx(0.45)
    # v1 probes alone: as before v2 existed (every probe averaged)
    only_v1 = merge(
        [
            load_gemm_shapes(
                _gpu_doc({"gpt2-1.5b": g, "1.3b": r}, f"2026-11-30T10:00:0{i}Z", v1=True)
            )
            for i, (g, r) in enumerate(((0.6, 0.9), (0.4, 0.7)), 1)
        ]
    )
    assert only_v1.efficiency == {
        ("gpt2-1.5b", 128): pytest.approx(0.5),
        ("1.3b", 128): pytest.approx(0.8),
    }
    assert only_v1.attention == {} and only_v1.version == 1


def test_a_queued_probe_supersedes_the_earlier_timings_of_what_it_measured(tmp_path: Path) -> None:
    """v3 times the kernels back to back (launches queued behind a GPU sleep): where a v3 probe
    measured a GEMM or an attention shape, v3 alone counts, for biased and unbiased models alike;
    what only older probes measured keeps their mean."""
    write_result(_gpu_doc({"gpt2-1.5b": 0.6, "1.3b": 0.9}, "2026-11-30T10:00:01Z", v1=True),
                 tmp_path)  # fmt: skip
    write_result(_gpu_doc({"gpt2-1.5b": 0.5, "1.3b": 0.8}, "2026-11-30T10:00:02Z",
                          attn={"gpt2-1.5b": 0.2, "1.3b": 0.4}), tmp_path)  # fmt: skip
    write_result(_gpu_doc({"gpt2-1.5b": 0.55, "1.3b": 0.85}, "2026-11-30T10:00:03Z",
                          attn={"gpt2-1.5b": 0.3, "1.3b": 0.5}, version=3), tmp_path)  # fmt: skip
    cal = gemm_shape_calibration(tmp_path)
    assert cal is not None and cal.version == 3
    assert cal.efficiency == {
        ("gpt2-1.5b", 128): pytest.approx(0.55),
        ("1.3b", 128): pytest.approx(0.85),  # not the v1/v2 mean with it
    }
    assert cal.attention[("gpt2-1.5b", 1, 128)] == pytest.approx(0.3)


def _run(model: str, mb: int, seq: int, tp: int = 1, gpu: str = H200, cp: int = 1) -> Any:
    return SimpleNamespace(
        workload={"preset": model, "model": model, "micro_batch": mb, "seq": seq},
        layout={"mesh": {"dp": 2, "tp": tp, "cp": cp}},
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
    from parlab.plan.fit.shapes import aligned

    assert aligned("1.3b") and aligned("8b") and aligned("llama3.1-8b")
    assert not aligned("gpt2-1.5b") and aligned("no-such-model")


SHAPES2 = dataclasses.replace(
    SHAPES,
    version=2,
    hidden={"gpt2-1.5b": 1600, "1.3b": 2048, "8b": 4096, "0-narrow": 1024},
    efficiency={**SHAPES.efficiency, ("8b", 8192): 0.6},
    attention={
        ("0-narrow", 8, 1024): 0.9,  # sorts first: the reference is found by width
        ("gpt2-1.5b", 8, 1024): 0.2,
        ("1.3b", 8, 1024): 0.5,
        ("1.3b", 2, 4096): 0.55,
        ("8b", 2, 4096): 0.5,
        ("1.3b", 2, 8192): 0.6,
        ("8b", 2, 8192): 0.3,
    },
)


def test_attention_factor_scales_the_attention_term_where_the_batch_was_measured() -> None:
    gpt2 = shaped_roofline(_run("gpt2-1.5b", 8, 1024), ROOF, SHAPES2)
    assert gpt2.attention == pytest.approx(0.5 * 0.2 / 0.5)
    assert gpt2.gemm == pytest.approx(0.7 * 0.45 / 0.75)  # the GEMM factor as before
    assert "GEMM x 0.600 measured against 1.3b" in gpt2.source
    assert "attention x 0.400 measured against 1.3b" in gpt2.source
    assert gpt2.ring_attention == ROOF.ring_attention
    # an aligned model: no GEMM factor (the width law stays), the attention factor applies
    big = shaped_roofline(_run("8b", 2, 4096), ROOF, SHAPES2)
    assert (big.gemm, big.gemm_width_half) == (ROOF.gemm, ROOF.gemm_width_half)
    assert big.attention == pytest.approx(0.5 * 0.5 / 0.55)
    assert "attention x 0.909" in big.source and "GEMM x" not in big.source
    # the reference: factor 1
    ref = shaped_roofline(_run("1.3b", 2, 4096), ROOF, SHAPES2)
    assert ref.attention == ROOF.attention
    # GEMMs measured at the run's tokens (8,192), its attention not at 1 x 8192: GEMM only
    gemm_only = shaped_roofline(_run("gpt2-1.5b", 1, 8192), ROOF, SHAPES2)
    assert gemm_only.attention == ROOF.attention and "attention x" not in gemm_only.source
    assert gemm_only.gemm == pytest.approx(gpt2.gemm)


def test_attention_factor_needs_the_runs_batch_one_rank_and_no_ring() -> None:
    for other in (
        _run("8b", 1, 8192),  # same tokens as 2 x 4096, another batch: not measured
        _run("8b", 4, 4096),  # another micro-batch
        _run("8b", 2, 4096, tp=2),  # the heads split
        _run("8b", 2, 8192, cp=2),  # the ring (measured at 2 x 8192 and per rank 2 x 4096)
        _run("8b", 2, 4096, gpu="NVIDIA A100-SXM4-80GB"),  # another GPU
    ):
        assert attention_factor(other, ROOF, SHAPES2) is None
        assert shaped_roofline(other, ROOF, SHAPES2) is ROOF
    assert attention_factor(_run("8b", 2, 8192), ROOF, SHAPES2) == (pytest.approx(0.5), "1.3b")
    # no reference width, or a v1 calibration (no attention): nothing
    assert (
        attention_factor(_run("8b", 2, 4096), dataclasses.replace(ROOF, gemm_width=0), SHAPES2)
        is None
    )
    assert attention_factor(_run("gpt2-1.5b", 8, 1024), ROOF, SHAPES) is None


def test_a_full_recompute_replays_its_gemms_at_the_kernels_measured_efficiency() -> None:
    """Where the run recomputes fully and the probe measured its model at its tokens, the
    replayed GEMMs run at that efficiency (aligned models too); other GEMMs keep ``gemm``."""
    shapes = dataclasses.replace(SHAPES, forward={("1.3b", 8192): 0.78, ("1.3b", 4096): 0.74})
    full = _run("1.3b", 2, 4096)
    full.project, full.layout["knobs"] = "PAR-TRAINING-STATE", {"recompute": "full"}
    assert rc_efficiency(doc_batch(full), shapes) == pytest.approx(0.78)  # the layers' forward
    got = shaped_roofline(full, ROOF, shapes)
    assert got.recompute_gemm == pytest.approx(0.78) and "recompute's GEMMs at 0.780" in got.source
    assert (got.gemm, got.gemm_width_half) == (ROOF.gemm, ROOF.gemm_width_half)  # the law stays
    for other, knob in (
        (_run("1.3b", 2, 4096), {}),  # no recompute
        (_run("1.3b", 2, 4096), {"recompute": "selective"}),  # op-level: no GEMM replayed
        (_run("1.3b", 1, 2048), {"recompute": "full"}),  # tokens not measured
        (_run("1.3b", 2, 4096, tp=2), {"recompute": "full"}),  # sharded shapes
        (_run("1.3b", 2, 4096, gpu="NVIDIA A100-SXM4-80GB"), {"recompute": "full"}),
    ):
        other.project, other.layout["knobs"] = "PAR-TRAINING-STATE", knob
        assert rc_efficiency(doc_batch(other), shapes) is None
        assert shaped_roofline(other, ROOF, shapes) is ROOF
    assert rc_efficiency(doc_batch(full), None) is None
    assert rc_efficiency(doc_batch(full), SHAPES) is None  # measured, but no forward entry


def test_forward_efficiency_is_the_layers_forward_gemms_alone() -> None:
    gemms = [
        {"name": "wq", "pass": "fwd", "count": 2, "flops": 10.0, "time_s": 1.0},
        {"name": "w1", "pass": "fwd", "count": 2, "flops": 30.0, "time_s": 1.0},
        {"name": "wq", "pass": "dgrad", "count": 2, "flops": 10.0, "time_s": 9.0},
        {"name": "wq", "pass": "bgrad", "count": 2, "flops": 0.0, "time_s": 9.0},
        {"name": "output", "pass": "fwd", "count": 1, "flops": 40.0, "time_s": 99.0},
    ]
    assert forward_efficiency(gemms, peak_flops=100.0) == pytest.approx(80 / 4 / 100)
    assert forward_efficiency(gemms, peak_flops=0.0) is None
    assert forward_efficiency(gemms[2:], peak_flops=100.0) is None


def test_the_committed_probe_gives_each_model_its_forward_efficiency() -> None:
    """GPT-2 124M's output layer (vocabulary 50257) runs unaligned kernels: its layers'
    forward GEMMs run far nearer the peak than all its GEMMs together."""
    root = Path(__file__).resolve().parents[1] / "results"
    cal = gemm_shape_calibration(root)
    if cal is None or ("gpt2-124m", 32768) not in cal.forward:
        pytest.skip("the committed GEMM-shape probes are not in this checkout")
    assert cal.forward[("gpt2-124m", 32768)] > 2 * cal.efficiency[("gpt2-124m", 32768)]
    assert cal.forward[("1.3b", 8192)] == pytest.approx(cal.efficiency[("1.3b", 8192)], rel=0.05)


def _request(shapes: Any, **kw: Any) -> Any:
    from parlab.plan.fit.lab import LabCompute
    from parlab.plan.request import PlanRequest
    from parlab.plan.space import make_cluster

    return PlanRequest(
        spec=get_spec("gpt2-1.5b"),
        cluster=make_cluster(gpus="2xH200", gpus_per_node=2),
        global_batch=16,
        seq=1024,
        compute=LabCompute(roofline_fit=ROOF, shapes=shapes),
        **kw,
    )


def test_the_planner_applies_the_measured_factors_to_the_candidates_they_cover() -> None:
    """``parlab plan --roofline`` times a candidate the probe measured (model, micro-batch x
    sequence, tp 1, the cluster's GPU: ``H200`` resolves to the probe's ``NVIDIA H200``) as
    ``benchmarks/plan_accuracy.py`` times a run of it; other candidates as fitted."""
    from parlab.plan.admission import evaluate
    from parlab.plan.pricing import step_shape
    from parlab.plan.space import Candidate

    def roofline(req: Any, cand: Any) -> Any:
        return req.compute.roofline(step_shape(req, cand))

    def note(req: Any, cand: Any) -> str:
        return req.compute.describe(step_shape(req, cand))

    shapes = dataclasses.replace(SHAPES2, forward={("gpt2-1.5b", 8192): 0.7})
    fsdp = Candidate(dp=2, tp=1, pp=1, cp=1, ep=1, strategy="fsdp", micro_batch=8,
                     microbatches=1, recompute="none", schedule="-")  # fmt: skip
    with_shapes, without = _request(shapes), _request(None)
    got = roofline(with_shapes, fsdp)
    run = _run("gpt2-1.5b", 8, 1024)
    assert got == shaped_roofline(run, ROOF, shapes)  # what the accuracy table uses
    assert got.gemm == pytest.approx(0.7 * 0.45 / 0.75) and got.gemm_width_half == 0.0
    a, b = evaluate(with_shapes, fsdp).estimate, evaluate(without, fsdp).estimate
    assert a is not None and b is not None and a.compute_s > b.compute_s  # 0.6 < the law's
    assert "GEMMs x 0.600 against 1.3b's" in note(with_shapes, fsdp)
    assert "attention core x 0.400" in note(with_shapes, fsdp)
    full = dataclasses.replace(fsdp, recompute="full")
    assert roofline(with_shapes, full).recompute_gemm == pytest.approx(0.7)
    assert "full recompute's GEMMs at 0.700" in note(with_shapes, full)
    # not measured there: 4 x 1024 tokens, or split over tp 2 (its heads do not split: no tp)
    other = dataclasses.replace(fsdp, micro_batch=4, microbatches=2)
    assert roofline(with_shapes, other) is ROOF and "shapes:" not in note(with_shapes, other)
    assert roofline(without, fsdp) is ROOF and "shapes:" not in note(without, fsdp)


def test_model_names_are_the_catalogs() -> None:
    from parlab.plan.fit.shape_probe import canonical
    from parlab.plan.fit.shapes import same_gpu

    assert canonical("8b") == canonical("llama3.1-8b") == "llama3.1-8b"
    assert canonical("gpt2-xl") == "gpt2-1.5b" and canonical("0-narrow") == "0-narrow"
    assert same_gpu("H200", "NVIDIA H200") and not same_gpu("H100", "NVIDIA H200")
    assert same_gpu("cpu", "cpu") and not same_gpu("cpu", "NVIDIA H200")


def test_factor_between_two_measured_token_counts_is_interpolated_never_extrapolated() -> None:
    """GPT-2 124M measured at 8,192 and 32,768 tokens: at 16,384 the factor lies halfway in
    log(tokens) between the two; below the first and above the last, nothing (the width law)."""
    shapes = GemmShapes(run_id="gemm-shapes-t", evidence_level="real-training", device=H200,
                        efficiency={("gpt2-124m", 8192): 0.2, ("1.3b", 8192): 0.6,
                                    ("gpt2-124m", 32768): 0.3, ("1.3b", 32768): 0.6},
                        hidden={"gpt2-124m": 768, "1.3b": 2048})  # fmt: skip
    assert shapes.factor("gpt2-124m", 8192, 2048) == (pytest.approx(1 / 3), "1.3b")
    got = shapes.factor("gpt2-124m", 16384, 2048)
    assert got is not None and got[0] == pytest.approx((1 / 3 + 1 / 2) / 2)
    assert got[1] == "1.3b, between 8,192 and 32,768 tokens"
    between = shapes.factor("gpt2-124m", 12000, 2048)
    assert between is not None and 1 / 3 < between[0] < got[0]
    assert shapes.factor("gpt2-124m", 4096, 2048) is None
    assert shapes.factor("gpt2-124m", 65536, 2048) is None
    assert shapes.factor("gpt2-124m", 16384, 1600) is None  # no reference of that width
