"""The planner's host term for torch's DTensor TP: the probe's counts and time, max(roofline,
host) and which term set it, and "not modelled" where no calibration describes a run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from parlab.contract import read_document, write_result
from parlab.plan.fit import calibrate
from parlab.plan.fit.host import (
    HostDispatch,
    bound,
    combine,
    host_dispatch_calibration,
    load_host_dispatch,
)
from parlab.runtime.testing import run_ranks

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "host_dispatch_probe.py"
_spec = importlib.util.spec_from_file_location("host_dispatch_probe", _PATH)
assert _spec is not None and _spec.loader is not None
probe = importlib.util.module_from_spec(_spec)
sys.modules["host_dispatch_probe"] = probe
_spec.loader.exec_module(probe)

H200 = "NVIDIA H200"
ENV = {
    "hardware": {"gpus": [], "gpu_count": 0, "cpu": {"count": 2}, "host_count": 1},
    "software": {"python": "3.11", "torch": "2.13", "parlab": "0.1.0"},
}


def _probe(ctx: Any) -> dict[str, Any]:
    return probe.probe_rank(ctx, model="1.3b", hidden="64", layers=3, vocab=256, seq=16,
                            steps=2, warmup=1)  # fmt: skip


def test_probe_counts_ops_per_layer_and_times_them_on_gloo(tmp_path: Path) -> None:
    per_rank = run_ranks(_probe, 2, timeout=60)
    r0 = per_rank[0]
    assert per_rank[1]["counts"] == r0["counts"]  # every rank dispatches the same ops
    assert set(r0["counts"]) == {"1", "2", "3"}
    one, two = r0["counts"]["1"]["microbatch"], r0["counts"]["2"]["microbatch"]
    # a layer's 7 sharded linears: one mm on DTensors forward, two backward
    assert two["dtensor_ops"] - one["dtensor_ops"] >= 21
    assert r0["law"]["microbatch"]["per_layer"] == two["ops"] - one["ops"] > 21
    assert r0["losses_finite"]
    body = probe.calibration(per_rank, micro_batch=2, seq=16)
    assert body["ops_law_matches_full_count"]  # ops = fixed + per_layer x layers, checked at 3
    assert body["ops_per_step"] == sum(r0["counts"]["3"][w]["ops"] for w in probe.WINDOWS)
    assert 0 < body["dtensor_ops_per_step"] < body["ops_per_step"]
    assert body["step_s"] == max(r["timed"][0]["step_s"] for r in per_rank)
    assert body["host_s_per_op"] == pytest.approx(body["step_s"] / body["ops_per_step"])
    assert 1e-7 < body["host_s_per_op"] < 1e-2
    # the document: written, read back, its law gives the counted ops; a CPU run is not used
    path = write_result(probe.document(body, command="test", environment=ENV), tmp_path)
    doc = read_document(path)
    assert doc.evidence_level == "cpu-mechanism" and doc.metric("step_time") is None
    cal = load_host_dispatch(doc)
    assert cal.ops_per_step(3) == body["ops_per_step"]
    assert cal.host_s(3) == pytest.approx(body["step_s"])
    assert host_dispatch_calibration(tmp_path) is None


def host(**kw: Any) -> HostDispatch:
    base = dict(run_id="host-dispatch-test", evidence_level="real-training", device=H200,
                model="1.3b", block=_block("1.3b"), microbatch_fixed=50.0,
                microbatch_per_layer=200.0, optimizer_fixed=10.0, optimizer_per_layer=2.0,
                microbatches=1, norm_kernel="fused", host_s_per_op=1e-4)  # fmt: skip
    return HostDispatch(**{**base, **kw})  # type: ignore[arg-type]


def _block(model: str) -> str:
    from parlab.models import get_spec
    from parlab.plan.fit.host import block

    return block(get_spec(model))


def run(impl: str = "torch", norm: str | None = "fused", gpu: str = H200, mb: int = 1) -> Any:
    layout: dict[str, Any] = {"world_size": 2, "mesh": {"tp": 2}, "implementation": impl}
    if norm:
        layout["norm_kernel"] = norm
    return SimpleNamespace(
        run_id="mi-tp2-dtensor-test",
        project="PAR-MODEL-INTERNAL",
        layout=layout,
        workload={"model": "1.3b", "microbatches": mb},
        environment={"hardware": {"gpus": [{"name": gpu}]}},
    )


def test_prediction_is_the_max_of_roofline_and_host_and_names_the_term() -> None:
    h = host()
    ops = 50 + 200 * 24 + 10 + 2 * 24  # the 1.3b's 24 layers, one micro-batch
    assert h.ops_per_step(24) == ops and h.ops_per_step(24, 2) == ops + 50 + 200 * 24
    host_s = ops * 1e-4
    assert calibrate.host_term(run(), h) == (pytest.approx(host_s), "")
    assert calibrate.unmodelled(run(), host=h) == ""
    assert calibrate.host_bound(run(), 0.1, h) == (
        pytest.approx(host_s),
        "host",
        pytest.approx(host_s),
    )
    assert calibrate.host_bound(run(), 1.0, h) == (1.0, "gpu", pytest.approx(host_s))
    assert bound(0.2, 0.3) == (0.3, "host") and bound(0.3, 0.2) == (0.3, "gpu")
    # parlab's own TP is not host-bound: no host term, whatever the calibration
    assert calibrate.host_bound(run(impl="parlab"), 0.1, h) is None
    assert calibrate.host_bound(run(), None, h) is None


def test_a_probe_whose_step_grows_with_its_width_serializes_host_and_gpu() -> None:
    """The probe times one op count at two widths: a step that grows by more than 5 % means the
    GPU's time added to the host's, and the prediction is their sum; a flat one keeps the max."""
    flat = host(step_s_by_hidden=((128, 0.200), (256, 0.205)))
    grew = host(step_s_by_hidden=((128, 0.200), (256, 0.224)))
    assert not host().serialized and not flat.serialized and grew.serialized
    host_s = grew.host_s(24)
    assert calibrate.host_bound(run(), 0.1, flat) == (pytest.approx(host_s), "host",
                                                      pytest.approx(host_s))  # fmt: skip
    assert calibrate.host_bound(run(), 0.1, grew) == (
        pytest.approx(host_s + 0.1),
        "host+gpu",
        pytest.approx(host_s),
    )
    assert combine(0.1, 0.3, True) == (pytest.approx(0.4), "host+gpu")
    assert combine(0.1, 0.3, False) == bound(0.1, 0.3)


def test_no_or_foreign_calibration_keeps_dtensor_runs_not_modelled(tmp_path: Path) -> None:
    assert "(not modelled)" in calibrate.unmodelled(run())
    assert calibrate.host_bound(run(), 0.1, None) is None
    for r, h in (
        (run(gpu="NVIDIA A100-SXM4-80GB"), host()),  # seconds per op of another host and GPU
        (run(norm=None), host()),  # the explicit implementation dispatches other ops
        (run(mb=4), host()),  # the law was counted at one micro-batch
        (run(), host(block="layernorm/gelu/learned/mha/dense/bias/tied")),  # another structure
    ):
        why = calibrate.unmodelled(r, host=h)
        assert why.startswith("DTensor TP") and "not modelled:" in why
        assert calibrate.host_bound(r, 0.1, h) is None
    # finding one under a results folder: none, then the GPU document (never a CPU one)
    assert host_dispatch_calibration(tmp_path) is None
    rank = {"spec": {"model": "1.3b", "layers": 2}, "device": H200, "backend": "nccl",
            "norm_kernel": "fused", "timed": [{"hidden": 128, "step_s": 0.5}],
            "counts": {"2": {"microbatch": {"ops": 300, "dtensor_ops": 100},
                             "optimizer": {"ops": 20, "dtensor_ops": 0}}},
            "law": {"microbatch": {"fixed": 100, "per_layer": 100},
                    "optimizer": {"fixed": 10, "per_layer": 5}}}  # fmt: skip
    body = probe.calibration([rank, rank], micro_batch=2, seq=256)
    assert body["ops_law_matches_full_count"] and body["host_s_per_op"] == 0.5 / 320
    write_result(probe.document(body, command="test", environment=ENV), tmp_path)
    cal = host_dispatch_calibration(tmp_path)
    assert cal is not None and cal.device == H200 and cal.host_s(2) == pytest.approx(0.5)
    assert calibrate.training_runs(tmp_path) == []  # no step_time: never a training run
