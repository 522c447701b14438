"""The planner at production scale: the built-in compute model, the layouts production runs use,
cost, honest precision, and ``--layout``."""

from __future__ import annotations

from pathlib import Path

import pytest

from parlab.errors import UsageError
from parlab.hardware.catalog import require
from parlab.models import get_spec
from parlab.plan.admission import evaluate
from parlab.plan.compute import BuiltinCompute, StepShape, efficiency_for, efficiency_table
from parlab.plan.cost import Budget, cost_of
from parlab.plan.precision import Band, overlaps
from parlab.plan.pricing import stage_profiles
from parlab.plan.request import PlanRequest
from parlab.plan.space import Candidate, make_cluster, schedules_for
from tests.test_plan import run_cli

RESULTS = Path(__file__).resolve().parents[1] / "results"


def shape(tokens: int, tp: int = 1, gpu: str = "H100-SXM", model: str = "llama3.1-8b") -> StepShape:
    return StepShape(model=model, micro_batch=1, seq=tokens, tp=tp, gpu=gpu)


def test_gemm_efficiency_follows_the_shape() -> None:
    fig = efficiency_for(require("H100-SXM"))
    # more output tiles and a longer inner loop run closer to the ceiling, never above it
    assert fig.gemm(1024, 768, 768) < fig.gemm(8192, 4096, 4096) <= fig.gemm_ceiling
    assert fig.gemm(8192, 16384, 53248) == pytest.approx(fig.gemm_ceiling)
    # a dimension that is not a multiple of 8 (GPT-2's vocabulary) runs far slower
    assert fig.gemm(8192, 768, 50257) < 0.3 * fig.gemm(8192, 768, 50304)
    spec = get_spec("llama3.1-8b")
    model = BuiltinCompute(spec=spec, gpu=require("H100-SXM"))
    wide, narrow = model.roofline(shape(8192)), model.roofline(shape(8192, tp=8))
    assert narrow.gemm < wide.gemm  # tensor parallelism narrows every matmul
    assert model.roofline(shape(1024)).attention < wide.attention  # short sequences: small kernels
    assert "rest on" in model.describe(shape(8192))


def test_every_gpu_says_what_its_figures_rest_on() -> None:
    table = efficiency_table()
    assert {"H200", "H100-SXM", "A100-80GB"} <= set(table)
    assert "probes" in table["H200"].rests_on and "public figures" in table["A100-80GB"].rests_on
    with pytest.raises(UsageError, match="no GEMM and attention efficiency figures"):
        BuiltinCompute(spec=get_spec("1.3b"), gpu=require("B200"))


@pytest.mark.skipif(not (RESULTS / "PAR-TRAINING-STATE").is_dir(), reason="no GPU results")
def test_shipped_figures_are_the_fit_of_the_committed_probes() -> None:
    from parlab.plan.fit.efficiency_fit import fit_all, shipped

    assert fit_all(RESULTS) == shipped()


def test_interleaving_is_searched_to_one_layer_per_chunk_with_remainders() -> None:
    opts = schedules_for(16, 126)
    vs = {v for s, v in opts if s == "interleaved"}
    assert {2, 3, 4, 5, 6, 7} <= vs and max(vs) <= 126 // 16
    # the first and last stage of an uneven split hold a layer fewer; the last holds the head
    cand = Candidate(dp=1, tp=1, pp=16, cp=1, ep=1, strategy="zero1", micro_batch=1,
                     microbatches=16, recompute="none", schedule="1f1b")  # fmt: skip
    prof = {(s, n, head, c) for s, n, head, c in stage_profiles(get_spec("llama3.1-405b"), cand)}
    assert prof == {(0, 7, False, 1), (1, 8, False, 14), (15, 7, True, 1)}


def llama405(layout_vpp: int = 7, strategy: str = "zero2") -> tuple[PlanRequest, Candidate]:
    spec = get_spec("llama3.1-405b")
    cluster = make_cluster(gpus="16384xH100", gpus_per_node=8)
    req = PlanRequest(spec=spec, cluster=cluster, global_batch=2048, seq=8192,
                      compute=BuiltinCompute(spec=spec, gpu=cluster.gpu))  # fmt: skip
    cand = Candidate(dp=128, tp=8, pp=16, cp=1, ep=1, strategy=strategy, micro_batch=1,
                     microbatches=16, recompute="none", schedule="interleaved", vpp=layout_vpp)  # fmt: skip
    return req, cand


def test_the_layout_llama_3_405b_trained_with_is_admitted() -> None:
    req, cand = llama405()
    v = evaluate(req, cand)
    assert v.admitted, v.reason
    e = v.estimate
    assert e is not None and e.bubble_s > 0
    # interleaving divides the bubble: 1F1B's is about v times larger
    one = evaluate(req, Candidate(**{**cand.__dict__, "schedule": "1f1b", "vpp": 1}))
    assert one.estimate is not None and one.estimate.bubble_s > 3 * e.bubble_s
    assert 0.3 < (v.mfu or 0) < 0.7


def test_cost_of_a_token_budget() -> None:
    gpu = require("H100-SXM")
    c = cost_of(1000.0, 1000, gpu, Budget(tokens=3.6e12, gpu_hour_price=2.0))
    assert c is not None
    assert c.seconds == pytest.approx(3.6e12 / 1e6)  # 1e6 tokens/s in all
    assert c.gpu_hours == pytest.approx(1e6)
    assert c.money == pytest.approx(2e6)
    assert c.energy_kwh == pytest.approx(700 * 1000 * 3.6e6 / 3.6e6)  # 700 W x 1000 GPUs x 1 h
    assert cost_of(1000.0, 1000, gpu, Budget()) is None
    for bad in (dict(tokens=0.0), dict(gpu_hour_price=-1.0)):
        with pytest.raises(UsageError):
            Budget(**bad)


def test_digits_follow_the_band_and_ties_overlap() -> None:
    b = Band(kind="built-in", rel=0.12, measured_on="t")
    assert b.digits() == 2 and b.fmt(4.5237) == "4.5" and b.fmt(22612.0) == "23,000"
    assert Band(kind="x", rel=0.01, measured_on="t").fmt(4.5237) == "4.52"
    assert overlaps(100.0, 95.0, 0.05) and not overlaps(100.0, 80.0, 0.05)


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--layout", "pp=16,tp=8,dp=64"], "not the 16384 GPUs"),
        (["--layout", "pp=16,xp=8"], "axes from"),
        (["--tokens", "0"], "--tokens"),
        (["--gpu-hour-price", "-2"], "--gpu-hour-price"),
        (["--gpus", "64xB200"], "B200 has no GEMM and attention efficiency figures"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    extra: list[str], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["plan", "--model", "llama3.1-405b", "--gpus", "16384xH100", "--global-batch",
            "2048", "--seq", "8192", "--results", str(tmp_path), *extra]  # fmt: skip
    assert run_cli(args) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1, err
    assert not any(tmp_path.iterdir())  # nothing half-written
