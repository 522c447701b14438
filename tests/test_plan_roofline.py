"""The planner's roofline compute model, its overlap windows and its calibration."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from parlab.errors import UsageError
from parlab.ledger import Implementation
from parlab.models import flops, get_spec
from parlab.models.spec import ModelSpec
from parlab.plan.admission import evaluate
from parlab.plan.elementwise import (
    ELEMENTWISE,
    LOSS_BYTES_PER_LOGIT,
    causal_attention_flops_per_token,
    elementwise_bytes_per_token,
)
from parlab.plan.estimate import StageWork, estimate, exposed_time, overlap_window
from parlab.plan.fit import calibrate, runs
from parlab.plan.fit.efficiencies import FitRow, fit_roofline
from parlab.plan.fit.lab import LabCompute
from parlab.plan.planner import plan
from parlab.plan.request import PlanRequest
from parlab.plan.roofline import ComputeParts, Roofline, work
from parlab.plan.space import Candidate, make_cluster
from parlab.plan.throughput import Throughput

PEAK, BW = 1e15, 4e12
UNIT = Roofline(gemm=1.0, attention=1.0, ring_attention=1.0, memory=1.0)


def tiny() -> ModelSpec:
    return ModelSpec(
        name="tiny",
        vocab_size=10,
        hidden=8,
        layers=1,
        heads=2,
        ffn_hidden=16,
        activation="swiglu",
        norm="rmsnorm",
        position="rope",
        tied_embeddings=False,
        max_seq_len=64,
        source="test",
    )


def test_causal_flash_attention_counts_half_of_palms_attention_flops() -> None:
    spec = get_spec("1.3b")
    for seq in (1024, 4096, 32768):
        palm = flops.training_flops_per_token(spec, seq) - 6 * spec.num_active_params(
            embedding=False
        )
        assert causal_attention_flops_per_token(spec, seq) == pytest.approx(palm / 2)


def test_elementwise_term_is_bytes_over_bandwidth_on_a_hand_counted_model() -> None:
    spec = tiny()
    t = ELEMENTWISE["fused"]
    # per token and layer: two norms and two residual adds over hidden 8, RoPE over q and k
    # (8 + 8), SwiGLU over ffn 16, the attention layout copy over q (8); then the loss over
    # vocab 10
    per_token = 2 * (t["norm"] + t["residual"]) * 8 + t["rope"] * 16 + t["swiglu"] * 16
    per_token += t["layout"] * 8
    assert elementwise_bytes_per_token(spec, impl=Implementation()) == per_token
    w = work(spec, seq=32, micro_batch=2, microbatches=3, dtype="bf16")
    tokens = 32 * 2 * 3
    assert w.elementwise_bytes == pytest.approx((per_token + LOSS_BYTES_PER_LOGIT * 10) * tokens)
    roof = replace(UNIT, memory=0.5)
    parts = w.parts(roof, PEAK, BW)
    assert parts.elementwise_s == pytest.approx(w.elementwise_bytes / (0.5 * BW))
    # bf16 parameters: no casts; fused AdamW reads grad, both states, the param and writes
    # the param and both states: 2 + 4 x 2 + 2 x 2 = 14 bytes per parameter
    assert w.step_bytes == pytest.approx(14 * spec.num_params())
    assert parts.step_s == pytest.approx(w.step_bytes / (0.5 * BW))


def test_implementations_order_the_elementwise_bytes() -> None:
    spec = get_spec("1.3b")
    by = {
        k: elementwise_bytes_per_token(spec, impl=Implementation(norm_kernel=k))
        for k in ELEMENTWISE
    }
    assert by["explicit"] > by["fused"] > by["compiled"]
    # the CPU's composite decomposition reads as explicit
    composite = elementwise_bytes_per_token(spec, impl=Implementation(norm_kernel="composite"))
    assert composite == by["explicit"]
    # tensor parallelism splits RoPE/SwiGLU; only sequence parallelism splits norms and adds
    one = elementwise_bytes_per_token(spec, impl=Implementation())
    tp2 = elementwise_bytes_per_token(spec, impl=Implementation(), tp=2)
    sp2 = elementwise_bytes_per_token(spec, impl=Implementation(), tp=2, sp=True)
    assert sp2 == pytest.approx(one / 2)
    assert one / 2 < tp2 < one
    # autocast over float32 parameters keeps a float32 residual stream: more bytes
    assert elementwise_bytes_per_token(spec, impl=Implementation(), fp32_stream=True) > one
    with pytest.raises(UsageError, match="norm kernel"):
        Implementation(norm_kernel="magic")


def test_flash_work_is_causal_and_math_work_is_the_whole_square() -> None:
    spec = get_spec("1.3b")
    flash = work(spec, seq=4096, micro_batch=1, microbatches=1)
    math = work(
        spec, seq=4096, micro_batch=1, microbatches=1, impl=Implementation(attention_kernel="math")
    )
    core = causal_attention_flops_per_token(spec, 4096) * 4096
    assert flash.attention_flops == pytest.approx(core)
    assert math.attention_flops == 0.0
    assert math.gemm_flops - flash.gemm_flops == pytest.approx(2 * core)
    assert math.elementwise_bytes > flash.elementwise_bytes  # every score through the softmax
    # selective recompute replays the attention core's forward (one third of it)
    sel = work(spec, seq=4096, micro_batch=1, microbatches=1, recompute="selective")
    assert sel.attention_flops == pytest.approx(core * 4 / 3)
    assert sel.gemm_flops == flash.gemm_flops
    # full recompute replays the blocks' forward, not the output layer's (8N for the blocks,
    # 6N for the output layer)
    full = work(spec, seq=4096, micro_batch=1, microbatches=1, recompute="full")
    out = spec.output_params()
    assert full.gemm_flops == pytest.approx(flash.gemm_flops * 8 / 6 - 2 * out * 4096)
    with pytest.raises(UsageError, match="recompute"):
        work(spec, seq=4096, micro_batch=1, microbatches=1, recompute="sometimes")
    # context parallelism: half the tokens per rank, the ring's efficiency
    cp = work(spec, seq=4096, micro_batch=1, microbatches=1, cp=2)
    assert cp.ring and cp.attention_flops == pytest.approx(core / 2)
    assert cp.parts(replace(UNIT, ring_attention=0.25), PEAK, BW).attention_s == pytest.approx(
        core / 2 / (0.25 * PEAK)
    )


def test_sharded_optimizers_step_on_a_shard_and_float32_parameters_cast() -> None:
    spec = get_spec("1.3b")
    kw = {"seq": 4096, "micro_batch": 1, "microbatches": 4, "dp": 2, "dtype": "bf16-compute"}
    ddp = work(spec, strategy="ddp", **kw)
    z3 = work(spec, strategy="zero3", **kw)
    n = spec.num_params()
    casts = 12 * n * 4  # weights to bf16 and gradients back, every micro-batch
    # torch DDP: each micro-batch's gradient added into its bucket view, the bucket divided and
    # zeroed once a step
    buckets = (12 * 4 + 12) * n
    assert ddp.bucket_bytes == pytest.approx(buckets)
    assert ddp.step_bytes == pytest.approx(casts + 28 * n + buckets)
    assert z3.step_bytes == pytest.approx(casts + 28 * n / 2)
    assert z3.bucket_bytes == 0.0
    # DDP's autocast over float32 parameters keeps a float32 residual stream; ZeRO-3 gathers bf16
    assert ddp.elementwise_bytes > z3.elementwise_bytes


def test_per_parameter_passes_follow_the_runtime() -> None:
    """The per-parameter passes each runtime makes: torch DDP's buckets only where DDP wraps the
    model (more than one data-parallel rank, or ``parlab train``'s one-rank DDP), autocast's
    weight casts again in a full recompute (not under FSDP, whose gathers are bf16 already),
    and FSDP's second gather's copy-in before backward; each part at its measured bandwidth."""
    spec = get_spec("1.3b")
    kw = {"seq": 1024, "micro_batch": 1, "microbatches": 1, "dtype": "bf16-compute"}
    n = spec.num_params()
    blocks = spec.num_active_params(embedding=False) - spec.output_params()
    one = work(spec, strategy="ddp", **kw)
    wrapped = work(spec, strategy="ddp", impl=Implementation(ddp_one_rank=True), **kw)
    assert one.bucket_bytes == 0.0
    assert wrapped.bucket_bytes == pytest.approx(24 * n)
    assert wrapped.step_bytes - one.step_bytes == pytest.approx(24 * n)
    full = work(spec, strategy="ddp", recompute="full", **kw)
    assert full.step_bytes - one.step_bytes == pytest.approx(6 * blocks)
    fsdp = work(spec, strategy="fsdp", dp=2, **kw)
    fsdp_full = work(spec, strategy="fsdp", dp=2, recompute="full", **kw)
    assert fsdp_full.step_bytes == pytest.approx(fsdp.step_bytes)  # no autocast cast to redo
    assert fsdp.step_bytes - fsdp.optimizer_bytes == pytest.approx(12 * n + 6 * blocks / 2)
    # each part at its own bandwidth: 28 B at 1, the casts at 2, the buckets at 4 (B/s)
    roof = replace(UNIT, optimizer_bw=1.0, cast_bw=2.0, bucket_bw=4.0)
    assert wrapped.step_seconds(roof, BW) == pytest.approx(28 * n / 1 + 12 * n / 2 + 24 * n / 4)


def test_gemm_width_law() -> None:
    roof = replace(UNIT, gemm=0.5, gemm_width=2048, gemm_width_half=1000)
    assert roof.gemm_at(2048) == pytest.approx(0.5)
    assert roof.gemm_at(1024) < 0.5 < roof.gemm_at(4096) <= 1.0
    assert replace(UNIT, gemm=0.9, gemm_width=64, gemm_width_half=1000).gemm_at(1e6) == 1.0
    assert replace(roof, gemm_width_half=0).gemm_at(10) == 0.5
    with pytest.raises(UsageError, match="gemm"):
        Roofline(gemm=1.5, attention=0.5, ring_attention=0.5, memory=0.5)
    with pytest.raises(UsageError, match="contention"):
        replace(UNIT, contention=2.0)


def test_overlap_never_exposes_negative_or_more_than_the_collective() -> None:
    rng = random.Random(0)
    for _ in range(2000):
        total = rng.uniform(0, 1)
        one = rng.uniform(-0.1, 1.5) * total
        window = rng.uniform(-0.5, 2)
        exposed, hidden = exposed_time(total, one, window)
        assert 0.0 <= exposed <= total + 1e-12
        assert 0.0 <= hidden <= max(0.0, window) + 1e-12
        assert exposed + hidden == pytest.approx(total)
        assert exposed >= min(total, max(0.0, one)) - 1e-12  # one call is never hidden


def test_overlap_windows_follow_the_mechanisms() -> None:
    def item(
        source: str, collective: str, phase: str = "backward", blocking: bool = True
    ) -> object:
        return SimpleNamespace(source=source, collective=collective, phase=phase, blocking=blocking)

    assert overlap_window(item("ddp", "all-reduce", blocking=False)) == "last-backward"
    assert overlap_window(item("fsdp", "all-gather", "forward")) == "forward"
    assert overlap_window(item("zero3", "all-gather", "backward")) == "backward"
    assert overlap_window(item("zero1", "reduce-scatter", "after-backward")) == "last-backward"
    assert overlap_window(item("zero2", "all-gather", "optimizer-step")) == "forward"
    assert overlap_window(item("cp", "send-recv", "forward")) == "attention"
    assert overlap_window(item("tp", "all-reduce", "forward")) is None
    assert overlap_window(item("pp", "send-recv", "forward")) is None


def _ddp_request(roof: Roofline | None) -> tuple[PlanRequest, Candidate]:
    cluster = make_cluster(gpus="2xH200", gpus_per_node=2)
    peak = cluster.gpu.peak("bf16") or 0.0
    req = PlanRequest(
        spec=get_spec("1.3b"),
        cluster=cluster,
        global_batch=4,
        seq=4096,
        compute=(
            Throughput(mfu=0.4, peak_flops=peak, source="test", assumed=True)
            if roof is None
            else LabCompute(roofline_fit=roof)
        ),
        dtype="bf16-compute",
        optimizer="adamw",
        implementation=Implementation(),
    )
    cand = Candidate(dp=2, tp=1, pp=1, cp=1, ep=1, strategy="ddp", micro_batch=2, microbatches=1,
                     recompute="none", schedule="-")  # fmt: skip
    return req, cand


def test_estimate_with_parts_bounds_exposure_and_adds_contention() -> None:
    roof = Roofline(gemm=0.5, attention=0.5, ring_attention=0.2, memory=1.0)
    req, cand = _ddp_request(roof)
    base = evaluate(req, cand).estimate
    assert base is not None
    total = base.comm_overlappable_s + base.comm_blocking_s
    assert base.comm_blocking_s <= base.comm_exposed_s <= total
    assert base.comm_hidden_s == pytest.approx(total - base.comm_exposed_s)
    slowed = evaluate(
        replace(req, compute=LabCompute(roofline_fit=replace(roof, contention=0.5))), cand
    ).estimate
    assert slowed is not None
    assert slowed.compute_s - base.compute_s == pytest.approx(0.5 * base.comm_hidden_s)
    assert slowed.step_s == pytest.approx(base.step_s + 0.5 * base.comm_hidden_s)
    # no overlap at all: everything exposed, nothing hidden, no contention
    none = evaluate(
        replace(req, overlap=0.0, compute=LabCompute(roofline_fit=replace(roof, contention=0.5))),
        cand,
    ).estimate
    assert none is not None
    assert none.comm_hidden_s == 0.0 and none.comm_exposed_s == pytest.approx(total)


def test_estimate_without_parts_is_the_mfu_model() -> None:
    req, cand = _ddp_request(None)
    v = evaluate(req, cand)
    assert v.estimate is not None
    from parlab.plan.throughput import flops_per_token

    fpt, _ = flops_per_token(req.spec, req.seq)
    assert isinstance(req.compute, Throughput)
    assert v.estimate.compute_s == pytest.approx(fpt * 4 * 4096 / 2 / req.compute.achieved)
    parts = ComputeParts(gemm_s=1.0, attention_s=0.0, elementwise_s=0.0, step_s=0.0,
                         forward_fraction=1 / 3)  # fmt: skip
    e = estimate(cand, stages=[StageWork(stage=0, count=1, parts=parts, wire=[])],
                 cluster=req.cluster, overlap=1.0)  # fmt: skip
    assert e.step_s == 1.0 and e.comm_hidden_s == 0.0


def _rows(truth: Roofline, bw: float = BW, dtype: str = "bf16") -> list[FitRow]:
    """Runs whose times ``truth`` made (elementwise work at ``bw``), 10 ms outside compute."""
    spec = get_spec("1.3b")
    rows = []
    for seq, mb, m, nk in ((4096, 2, 1, "fused"), (4096, 1, 8, "explicit"), (32768, 1, 1, "fused"),
                           (8192, 1, 2, "explicit"), (16384, 1, 1, "compiled")):  # fmt: skip
        w = work(spec, seq=seq, micro_batch=mb, microbatches=m, dtype=dtype,
                 impl=Implementation(norm_kernel=nk))  # fmt: skip
        rows.append(
            FitRow(work=w, measured_s=w.parts(truth, PEAK, bw).total_s + 0.01, other_s=0.01)
        )
    return rows


def test_fit_recovers_the_efficiencies_that_made_the_times() -> None:
    truth = Roofline(gemm=0.6, attention=0.45, ring_attention=1.0, memory=0.8)
    got = fit_roofline(
        _rows(truth), peak_flops=PEAK, hbm_bw=BW, free=("gemm", "attention", "memory")
    )
    assert (got.gemm, got.attention, got.memory) == pytest.approx((0.6, 0.45, 0.8), rel=1e-6)
    # a memory efficiency over 1 is held at the catalog's bandwidth and the rest refitted
    fast = _rows(replace(truth, memory=1.0), bw=1.25 * BW)  # bytes moved faster than the catalog
    held = fit_roofline(fast, peak_flops=PEAK, hbm_bw=BW, free=("gemm", "attention", "memory"))
    assert held.memory == 1.0 and 0 < held.gemm <= 1 and 0 < held.attention <= 1
    with pytest.raises(UsageError, match="cannot fit"):
        fit_roofline(
            _rows(truth)[:2], peak_flops=PEAK, hbm_bw=BW, free=("gemm", "attention", "memory")
        )


def test_measured_per_parameter_bandwidths_are_fixed_through_the_fit() -> None:
    """With the optimizer's and the casts' bandwidths measured (``Roofline.optimizer_bw``,
    ``cast_bw``), the per-parameter work is a fixed time: the fit recovers the efficiencies that
    made the times, and ``memory`` no longer prices it."""
    truth = Roofline(gemm=0.6, attention=0.45, ring_attention=1.0, memory=0.8,
                     optimizer_bw=0.3 * BW, cast_bw=0.5 * BW)  # fmt: skip
    rows = _rows(truth, dtype="bf16-compute")  # float32 parameters: casts every micro-batch
    w = rows[0].work
    assert 0 < w.optimizer_bytes < w.step_bytes
    cast = w.step_bytes - w.optimizer_bytes
    assert w.parts(truth, PEAK, BW).step_s == pytest.approx(
        w.optimizer_bytes / (0.3 * BW) + cast / (0.5 * BW)
    )
    bws = replace(Roofline(gemm=1.0, attention=1.0, ring_attention=1.0, memory=1.0),
                  optimizer_bw=0.3 * BW, cast_bw=0.5 * BW)  # fmt: skip
    got = fit_roofline(rows, peak_flops=PEAK, hbm_bw=BW, fixed=bws,
                       free=("gemm", "attention", "memory"))  # fmt: skip
    assert (got.gemm, got.attention, got.memory) == pytest.approx((0.6, 0.45, 0.8), rel=1e-6)
    assert (got.optimizer_bw, got.cast_bw) == (0.3 * BW, 0.5 * BW)
    # without them the fit puts the slow optimizer into the elementwise efficiency
    blind = fit_roofline(rows, peak_flops=PEAK, hbm_bw=BW, free=("gemm", "attention", "memory"))
    assert blind.memory != pytest.approx(0.8, rel=1e-3)


def test_fit_finds_the_width_law_and_the_contention() -> None:
    truth = Roofline(gemm=0.55, attention=0.5, ring_attention=1.0, memory=1.0, contention=0.4,
                     gemm_width=2048, gemm_width_half=1000)  # fmt: skip
    rows = []
    for name in ("1.3b", "llama3.1-8b"):
        w = work(get_spec(name), seq=4096, micro_batch=1, microbatches=1, dtype="bf16")
        for hidden_s in (0.0, 0.05):
            t = w.parts(truth, PEAK, BW).total_s + 0.4 * hidden_s
            rows.append(FitRow(work=w, measured_s=t, other_s=0.0, hidden_s=hidden_s))
    got = fit_roofline(rows, peak_flops=PEAK, hbm_bw=BW, fixed=replace(truth, contention=0.0,
                       gemm_width_half=0.0), free=("contention", "gemm_width_half"))  # fmt: skip
    assert got.contention == pytest.approx(0.4, abs=1e-6)
    assert got.gemm_width_half == 1000.0


def test_planner_keeps_its_admission_and_pure_data_parallel_top_under_the_roofline() -> None:
    cluster = make_cluster(gpus="8xH100")
    peak = cluster.gpu.peak("bf16") or 0.0
    req = PlanRequest(spec=get_spec("1.3b"), cluster=cluster, global_batch=64, seq=4096,
                      compute=Throughput(mfu=0.4, peak_flops=peak, source="t", assumed=True),
                      strategies=("ddp", "fsdp"), recompute=("none",), dtype="bf16-compute",
                      optimizer="adamw", implementation=Implementation())  # fmt: skip
    roof = Roofline(gemm=0.54, attention=0.53, ring_attention=0.22, memory=1.0, contention=0.5,
                    gemm_width=2048, gemm_width_half=1325)  # fmt: skip
    a, b = plan(req), plan(replace(req, compute=LabCompute(roofline_fit=roof)))
    # admission is memory and layout: the same candidates either way
    assert {v.cand.name for v in a.ranked} == {v.cand.name for v in b.ranked}
    assert [v.kind for v in a.rejected] == [v.kind for v in b.rejected]
    # a 1.3B model on 8 GPUs: pure data parallelism stays on top, model parallelism below
    for res in (a, b):
        top = res.top
        assert top is not None
        assert (top.cand.dp, top.cand.tp, top.cand.pp, top.cand.cp) == (8, 1, 1, 1)

    # the roofline sees FSDP's bf16 stream and sharded step (as the 2-GPU runs measured):
    # FSDP's best beats DDP's; the MFU model, one FLOP rate for both, cannot tell them apart
    def best(res: object, strategy: str) -> float:
        return min(v.estimate.step_s for v in res.ranked  # type: ignore[attr-defined]
                   if v.cand.strategy == strategy and v.estimate is not None)  # fmt: skip

    assert best(b, "fsdp") < best(b, "ddp")
    assert best(a, "ddp") == pytest.approx(best(a, "fsdp"), rel=0.01)  # MFU: no telling apart


def doc(run_id: str, **layout: object) -> SimpleNamespace:
    return SimpleNamespace(
        run_id=run_id,
        project=layout.pop("project", "PAR-MODEL-INTERNAL"),
        layout={"world_size": 2, "mesh": {"tp": 2}, **layout},
        workload={"preset": "1.3b", "model": "1.3b"},
    )


def test_documents_say_their_implementation_and_what_is_not_modelled() -> None:
    old = doc("mi-tp2-20261130T143151-b36795", implementation="parlab")
    new = doc("mi-tp2-20261130T164154-a29547", implementation="parlab", norm_kernel="fused")
    compiled = doc("train-fsdp-1.3b-20261130T154713-3dcdd8", project="PAR-TRAINING-STATE",
                   knobs={"compile": True, "norm_kernel": "fused"})  # fmt: skip
    assert runs.implementation_of(old).norm_kernel == "explicit"
    assert runs.implementation_of(new).norm_kernel == "fused"
    assert runs.implementation_of(compiled).norm_kernel == "compiled"
    assert runs.group_of(old) == "mi-tp2/explicit/none"
    assert runs.group_of(new) == "mi-tp2/fused/none"
    assert calibrate.unmodelled(new) == ""
    dtensor = doc("mi-tp2-dtensor-20261130T164154-da538b", implementation="torch")
    assert "host-bound" in calibrate.unmodelled(dtensor)


RESULTS = Path(__file__).resolve().parents[1] / "results"


@pytest.mark.skipif(not (RESULTS / "PAR-MODEL-INTERNAL").is_dir(), reason="no GPU results")
def test_lab_calibration_fits_physical_efficiencies_and_predicts_its_runs() -> None:
    docs = calibrate.training_runs(RESULTS)
    assert not any(runs.knobs(d).get("profiled") for d in docs)
    cal = calibrate.collectives_calibration(RESULTS)
    roof, used = calibrate.fit_steps(docs, calibration=cal)
    for k in ("gemm", "attention", "ring_attention", "memory"):
        assert 0.0 < getattr(roof, k) <= 1.0
    assert 0.0 <= roof.contention <= 1.0
    assert [s.free for s, _ in used] == [s.free for s in calibrate.LAB_STEPS]
    single = [d for d in docs if d.run_id in used[0][1]]
    assert single
    for d in single:  # the one-GPU runs have no communication: compute alone
        e = calibrate.predict(d, roof, calibration=cal)
        assert e is not None and e.comm_exposed_s == 0.0
        assert e.step_s == pytest.approx(d.metric("step_time"), rel=0.10)


@pytest.mark.skipif(not (RESULTS / "PAR-MODEL-INTERNAL").is_dir(), reason="no GPU results")
def test_cli_roofline_option_fits_on_the_results_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from tests.test_plan import run_cli

    args = ["plan", "--model", "1.3b", "--gpus", "2xH200", "--gpus-per-node", "2",
            "--global-batch", "4", "--seq", "4096", "--dtype", "bf16-compute", "--optimizer",
            "adamw", "--results", str(tmp_path)]  # fmt: skip
    assert run_cli([*args, "--roofline", str(RESULTS), "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert any("fitted on the lab's runs" in n for n in js["notes"])
    # the measured 2xH200 runs: FSDP and ZeRO-3 were the fastest non-compiled layouts
    assert js["decision"]["chosen"].split()[0] in ("fsdp", "zero3")
    [path] = (tmp_path / "PAR-TRAINING-STATE").glob("plan-*.json")
    data = json.loads(path.read_text())
    assert any(r.startswith("mi-single-") for r in data["decision"]["rests_on"])
    assert run_cli([*args, "--roofline", str(tmp_path / "nothing")]) == 2
    assert "not a results folder" in capsys.readouterr().err


def test_repeats_group_by_what_changes_the_work_or_where_it_runs() -> None:
    """Runs of one command are one configuration; bf16 master weights, a NUMA binding and
    garbage collection by hand each make another (the repeats table and leave-one-out)."""

    def train(stamp: str, **knobs: object) -> SimpleNamespace:
        return doc(f"train-zero1-1.3b-{stamp}", project="PAR-TRAINING-STATE",
                   knobs={"norm_kernel": "fused", "dtype": "bf16", **knobs})  # fmt: skip

    a, b = train("20261130T154426-e9029c"), train("20261130T160149-c0a3ae")
    assert runs.group_of(a) == runs.group_of(b) == "train-zero1-1.3b/fused/none"
    assert runs.group_of(train("20261130T171244-8586d1", dtype="bf16-master")) == (
        "train-zero1-1.3b/fused/none/bf16-master"
    )
    bound = train("20261201T002357-e66993", numa_binding="node", manual_gc=50)
    assert runs.group_of(bound) == "train-zero1-1.3b/fused/none/numa-node/gc-50"
    # one run name, other ranks or another batch shape: another configuration
    shaped = train("20261201T031652-5b88bf")
    shaped.workload = {**shaped.workload, "micro_batch": 2, "seq": 4096}
    assert runs.group_of(shaped) == "train-zero1-1.3b/n2-mb2x4096/fused/none"
    shaped.layout = {**shaped.layout, "world_size": 1}
    assert runs.group_of(shaped) == "train-zero1-1.3b/n1-mb2x4096/fused/none"


def test_full_recompute_replays_what_the_runtime_checkpoints() -> None:
    """The extra GEMM FLOPs of full recompute are 2 x the parameters under ``apply_recompute``'s
    checkpoints (the blocks: ``model.layers``) per token, on the model the runtime builds."""
    import torch

    from parlab.models.reference import build_model

    spec = get_spec("tiny")
    model = build_model(spec, device=torch.device("cpu"), dtype=torch.float32, seed=0)
    checkpointed = sum(p.numel() for p in model.layers.parameters() if p.dim() == 2)
    kw = {"seq": 64, "micro_batch": 2, "microbatches": 3}
    extra = work(spec, recompute="full", **kw).gemm_flops - work(spec, **kw).gemm_flops
    assert extra == pytest.approx(2 * checkpointed * 64 * 2 * 3, rel=0.01)


def test_the_replayed_gemms_run_at_recompute_gemm_the_rest_at_gemm() -> None:
    spec = get_spec("1.3b")
    kw = {"seq": 4096, "micro_batch": 2, "microbatches": 1}
    none, full = work(spec, **kw), work(spec, recompute="full", **kw)
    assert none.recompute_gemm_flops == 0.0
    assert full.recompute_gemm_flops == pytest.approx(full.gemm_flops - none.gemm_flops)
    roof = Roofline(gemm=0.5, attention=0.5, ring_attention=0.5, memory=1.0)
    fast = replace(roof, recompute_gemm=0.8)
    assert full.parts(fast, PEAK, BW).gemm_s == pytest.approx(
        none.gemm_flops / (0.5 * PEAK) + full.recompute_gemm_flops / (0.8 * PEAK)
    )
    assert full.parts(roof, PEAK, BW).gemm_s == pytest.approx(full.gemm_flops / (0.5 * PEAK))
    assert none.parts(fast, PEAK, BW).gemm_s == none.parts(roof, PEAK, BW).gemm_s
    with pytest.raises(UsageError, match="recompute_gemm"):
        replace(roof, recompute_gemm=1.5)
