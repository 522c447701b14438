"""Implementation variants the run documents record and the roofline prices: the runtime's
op-level selective recompute (``op-selective``) and parlab's sequence parallelism before its
linears shared one gathered input (``sp_gather = "per-linear"``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from parlab.errors import UsageError
from parlab.ledger import Implementation
from parlab.models.spec import ModelSpec
from parlab.plan.elementwise import (
    ELEMENTWISE,
    ELEMENTWISE_FORWARD,
    FP32_STREAM_BYTES,
    FP32_STREAM_FORWARD,
    op_selective_bytes_per_token,
    sp_copy_bytes_per_token,
)
from parlab.plan.fit import calibrate, requests, runs
from parlab.plan.roofline import work

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "plan_accuracy.py"
_spec = importlib.util.spec_from_file_location("plan_accuracy", _PATH)
assert _spec is not None and _spec.loader is not None
plan_accuracy = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("plan_accuracy", plan_accuracy)
_spec.loader.exec_module(plan_accuracy)


def tiny(activation: str = "swiglu") -> ModelSpec:
    return ModelSpec(
        name="tiny",
        vocab_size=10,
        hidden=8,
        layers=2,
        heads=2,
        ffn_hidden=16,
        activation=activation,
        norm="rmsnorm",
        position="rope",
        tied_embeddings=False,
        max_seq_len=64,
        source="test",
    )


KW: dict[str, Any] = {"seq": 32, "micro_batch": 2, "microbatches": 3, "dtype": "bf16"}
TOKENS = 32 * 2 * 3


def test_forward_passes_are_part_of_each_ops_bytes() -> None:
    for kernel, ops in ELEMENTWISE_FORWARD.items():
        for op, fwd in ops.items():
            assert 0 < fwd < ELEMENTWISE[kernel][op]
    for op, fwd in FP32_STREAM_FORWARD.items():
        assert 0 < fwd < FP32_STREAM_BYTES[op]


def test_op_selective_recomputes_the_blocks_elementwise_forward_and_no_flop() -> None:
    spec = tiny()
    # per token and layer, fused: two norms (4 B each over hidden 8), the first residual add
    # (6 over 8), RoPE over q and k (20 over 8 + 8), SwiGLU (10 over ffn 16), the attention
    # layout copy (4 over q 8); two layers
    fused = (2 * 4 * 8 + 6 * 8 + 20 * 16 + 10 * 16 + 4 * 8) * 2
    assert fused == 1248
    assert op_selective_bytes_per_token(spec, impl=Implementation()) == fused
    explicit = (2 * 36 * 8 + 6 * 8 + 84 * 16 + 10 * 16 + 4 * 8) * 2
    impl_x = Implementation(norm_kernel="explicit")
    assert op_selective_bytes_per_token(spec, impl=impl_x) == explicit
    none = work(spec, **KW)
    op = work(spec, recompute="op-selective", **KW)
    assert op.gemm_flops == none.gemm_flops
    assert op.attention_flops == none.attention_flops
    assert op.elementwise_bytes - none.elementwise_bytes == pytest.approx(fused * TOKENS)
    assert op.step_bytes == none.step_bytes  # bf16 parameters: no weight casts
    # the planner's selective (Megatron's) recomputes the attention core instead
    sel = work(spec, recompute="selective", **KW)
    assert sel.attention_flops > none.attention_flops
    assert sel.elementwise_bytes == none.elementwise_bytes


def test_op_selective_under_autocast_and_where_it_is_not_modelled() -> None:
    spec = tiny()
    # DDP under autocast: float32 stream through the norms (+4 each) and the add (+4), and the
    # casts before wq, wk, wv, w1, w3 (6 each), over hidden 8, two layers
    extra = (2 * 4 + 4 + 5 * 6) * 8 * 2
    fp32 = op_selective_bytes_per_token(spec, impl=Implementation(), fp32_stream=True)
    assert fp32 - op_selective_bytes_per_token(spec, impl=Implementation()) == extra
    kw = {**KW, "dtype": "bf16-mixed", "strategy": "ddp"}
    blocks = spec.num_params(embedding=False) - spec.output_params()
    recast = work(spec, recompute="op-selective", **kw).step_bytes - work(spec, **kw).step_bytes
    assert recast == pytest.approx(6 * blocks * 3)  # every block weight cast again, 3 micro-batches
    # tensor parallelism splits RoPE, SwiGLU and the layout copy; SP the norms and the add
    tp2 = op_selective_bytes_per_token(spec, impl=Implementation(), tp=2, sp=True)
    assert tp2 == pytest.approx(1248 / 2)
    with pytest.raises(UsageError, match="compiled"):
        op_selective_bytes_per_token(spec, impl=Implementation(norm_kernel="compiled"))
    with pytest.raises(UsageError, match="flash"):
        work(spec, recompute="op-selective", impl=Implementation(attention_kernel="math"), **KW)


def test_per_linear_sp_copies_the_gathered_sequence_three_more_times_a_block() -> None:
    spec = tiny()
    old = Implementation(sp_gather="per-linear")
    # wq, wk, wv, w1, w3 each copy the strided gathered input where the shared form copies
    # once per gather (two a block): 3 more copies, bf16 read and write, hidden 8, two layers
    assert sp_copy_bytes_per_token(spec, impl=old, tp=2, micro_batch=2) == 3 * 4 * 8 * 2
    assert sp_copy_bytes_per_token(tiny("gelu"), impl=old, tp=2, micro_batch=2) == 2 * 4 * 8 * 2
    assert sp_copy_bytes_per_token(spec, impl=old, tp=2, micro_batch=1) == 0.0  # contiguous view
    assert sp_copy_bytes_per_token(spec, impl=Implementation(), tp=2, micro_batch=2) == 0.0
    kw = {**KW, "tp": 2}
    new_w = work(spec, sp=True, **kw)
    old_w = work(spec, sp=True, impl=old, **kw)
    assert old_w.elementwise_bytes - new_w.elementwise_bytes == pytest.approx(
        3 * 4 * 8 * 2 * TOKENS
    )
    assert (
        work(spec, sp=False, impl=old, **kw).elementwise_bytes == work(spec, **kw).elementwise_bytes
    )
    with pytest.raises(UsageError, match="sp_gather"):
        Implementation(sp_gather="sometimes")


def doc(run_id: str, project: str = "PAR-MODEL-INTERNAL", step: float = 0.1, **lay: Any) -> Any:
    stamp = run_id.rsplit("-", 2)[1]
    created = f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]}T{stamp[9:11]}:{stamp[11:13]}:{stamp[13:]}Z"
    return SimpleNamespace(
        run_id=run_id,
        project=project,
        created=created,
        layout={"world_size": 2, "mesh": {"tp": 2}, **lay},
        workload={"preset": "1.3b", "model": "1.3b", "seq": 4096, "losses": [step]},
        metric=lambda name: step if name == "step_time" else None,
    )


def test_documents_map_to_their_variant() -> None:
    sp = {"sequence_parallel": True, "implementation": "parlab", "norm_kernel": "fused"}
    before = doc("mi-tp2-sp-20261130T164154-28fab3", **sp)
    after = doc("mi-tp2-sp-20261130T170221-e24fab", **sp, sp_saved_input="gathered")
    dtensor = doc("mi-tp2-dtensor-20261130T164154-da538b", sequence_parallel=True,
                  implementation="torch")  # fmt: skip
    plain = doc("mi-tp2-20261130T164154-a29547", implementation="parlab", norm_kernel="fused")
    assert runs.implementation_of(before).sp_gather == "per-linear"
    assert runs.implementation_of(after).sp_gather == "shared"
    assert runs.implementation_of(dtensor).sp_gather == "shared"
    assert runs.implementation_of(plain).sp_gather == "shared"
    assert runs.group_of(before) == "mi-tp2-sp/fused/none/sp-per-linear"
    assert runs.group_of(after) == "mi-tp2-sp/fused/none"
    # parlab train's --recompute selective is the runtime's op-level policy
    train = doc("train-fsdp-1.3b-20261130T142552-bed1be", project="PAR-TRAINING-STATE",
                knobs={"recompute": "selective"})  # fmt: skip
    assert runs.recompute_of(train) == "op-selective"
    assert "op-level SAC" in calibrate.unmodelled(train)
    assert runs.recompute_of(doc("mi-x-20261130T142552-aaaaaa", recompute="selective")) == (
        "selective"
    )
    assert runs.recompute_of(plain) == "none"


def test_a_miss_names_the_repeat_the_model_meets_and_what_differs() -> None:
    sp = {"sequence_parallel": True, "implementation": "parlab", "norm_kernel": "fused"}
    slow = doc("mi-tp2-sp-20261130T155526-f9c0a7", step=0.15, **sp)
    fast = doc("mi-tp2-sp-20261130T164154-28fab3", step=0.12, **sp)
    newer = doc("mi-tp2-sp-20261130T170221-e24fab", step=0.15, **sp, sp_saved_input="gathered")
    other = doc("mi-tp2-20261130T164154-a29547", step=0.12, **sp)
    docs = [slow, fast, newer, other]
    pred = {d.run_id: 0.12 for d in docs}
    note = plan_accuracy.repeat_note(slow, docs, pred)
    assert note.startswith(f"same knobs as {fast.run_id}")
    assert "not distinguishable from the document" in note
    note = plan_accuracy.repeat_note(newer, docs, pred)
    assert note.startswith(f"as {fast.run_id} but sp_saved_input=gathered (there unset)")
    assert plan_accuracy.repeat_note(slow, [slow, newer, other], pred) == ""  # no repeat meets it


RESULTS = Path(__file__).resolve().parents[1] / "results"


@pytest.mark.skipif(not (RESULTS / "PAR-TRAINING-STATE").is_dir(), reason="no GPU results")
def test_the_selective_recompute_run_is_planned_with_the_runtimes_policy() -> None:
    docs = {d.run_id: d for d in calibrate.training_runs(RESULTS)}
    d = docs.get("train-fsdp-1.3b-20261130T142552-bed1be")
    if d is None:
        pytest.skip("the selective-recompute run is not under results/")
    made = requests.run_request(d)
    assert made is not None and made[1].recompute == "op-selective"


def test_each_miss_gets_the_first_cause_that_fits() -> None:
    gpu = plan_accuracy.Side(True, "phases", "t")

    def row(d: Any, pred: float, note: str = "") -> Any:
        return plan_accuracy.Row(d, gpu, pred, note)

    cause = plan_accuracy.miss_cause
    a = doc("mi-tp2-sp-20261201T000934-45b70c", step=0.10)
    b = doc("mi-tp2-sp-20261201T001008-accd8a", step=0.13)  # the same configuration, 30 % off
    alone = doc("mi-tp2-20261201T001008-aaaaaa", step=0.10)
    groups = {
        runs.group_of(a): [row(a, 0.10), row(b, 0.10)],
        runs.group_of(alone): [row(alone, 0.2)],
    }
    deepspeed = row(b, 0.10, "DeepSpeed's engine: its own buckets (x)")
    assert cause(deepspeed, groups) == "not modelled: DeepSpeed's engine"
    assert cause(row(b, 0.10, "cal: gemm"), groups).startswith("repeats spread over 20 %")
    assert cause(row(b, 0.10), groups).startswith("repeats spread over 20 %")
    assert cause(row(alone, 0.2), groups) == "other"
    # a spread the prediction meets on none of the repeats is no excuse
    groups[runs.group_of(a)] = [row(a, 0.2), row(b, 0.2)]
    assert cause(row(b, 0.2), groups) == "other"


@pytest.mark.parametrize(
    "stage, dtype", [("zero1", "bf16-params"), ("zero2", "bf16-params"), ("zero3", "bf16-params")]
)
def test_deepspeed_runs_are_priced_as_their_zero_stage_and_bf16_recipe(
    stage: str, dtype: str
) -> None:
    """DeepSpeed's ZeRO-N shards as parlab's zeroN; its bf16 keeps bf16 parameters and
    gradients with float32 master partitions: the bf16-params recipe
    (``parlab.dtypes.document_dtype``)."""
    from parlab.contract import read_document

    root = Path(__file__).resolve().parents[1] / "results" / "PAR-TRAINING-STATE"
    paths = sorted(root.glob(f"train-deepspeed-{stage}-1.3b-*.json"))
    if not paths:
        pytest.skip("the committed DeepSpeed runs are not in this checkout")
    made = requests.run_request(read_document(paths[0]))
    assert made is not None
    req, cand, _ = made
    assert cand.strategy == stage and req.dtype == dtype
