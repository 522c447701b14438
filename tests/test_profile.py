"""parlab profile, pure logic: the streaming reader, classification, overlap arithmetic and
bad input, on hand-built traces whose answers are known (no process group)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest

from parlab.profile import intervals as iv
from parlab.profile.analyze import analyze_folder, analyze_trace
from parlab.profile.classify import (
    collective_name,
    compute_kind,
    kernel_kind,
    payload_from_meta,
    payload_from_shapes,
)
from parlab.profile.summary import summarize
from parlab.profile.synthetic import (
    Span,
    cpu_events,
    gpu_events,
    trace_doc,
    write_big_trace,
    write_trace,
)
from parlab.profile.trace_reader import TraceFormatError, TraceScanner, read_header

US = 1e-6


def C(start: float, dur: float, **kw: object) -> Span:
    return Span(kind="compute", start=start, dur=dur, **kw)  # type: ignore[arg-type]


def N(start: float, dur: float, **kw: object) -> Span:
    return Span(kind="comm", start=start, dur=dur, **kw)  # type: ignore[arg-type]


def one_step(tmp_path: Path, spans: list[Span], *, gpu: bool = True) -> object:
    # one step whose CPU window is as long as its kernels (CPU traces: a 1000 us step)
    span_end = max(sp.start + sp.dur for sp in spans)
    events = gpu_events([spans], step_us=span_end) if gpu else cpu_events([spans])
    p = write_trace(
        tmp_path / "rank0.trace.json.gz", trace_doc(events, rank=0, world_size=1, gpu=gpu)
    )
    r = analyze_trace(p)
    assert len(r.steps) == 1
    return r.steps[0]


# ---------------------------------------------------------------- intervals


def test_union_and_covered_against_brute_force() -> None:
    rng = np.random.default_rng(0)
    s = rng.uniform(0, 100, 40)
    e = s + rng.uniform(0, 10, 40)
    u = iv.union(s, e)
    grid = np.arange(0, 120, 0.01) + 0.005
    inside = ((grid[:, None] >= s) & (grid[:, None] < e)).any(1)
    assert iv.measure(u) == pytest.approx(inside.sum() * 0.01, abs=0.05)
    assert np.all(u[0][1:] > u[1][:-1])  # disjoint and sorted
    a = (np.array([5.0, 50.0]), np.array([20.0, 70.0]))
    got = iv.covered(a[0], a[1], u)
    for (lo, hi), g in zip(zip(*a, strict=True), got, strict=True):
        m = (grid >= lo) & (grid < hi)
        assert g == pytest.approx((inside & m).sum() * 0.01, abs=0.05)


# ---------------------------------------------------------------- classification


def test_kernel_kinds_follow_hta() -> None:
    assert kernel_kind("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)") == "comm"
    assert (
        kernel_kind("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "comm"
    )
    assert kernel_kind("Memcpy DtoH (Device -> Pinned)") == "memory"
    assert kernel_kind("Memset (Device)") == "memory"
    assert kernel_kind("cudaStreamSync_kernel") == "other"
    assert kernel_kind("void at::native::vectorized_elementwise_kernel<4>") == "compute"


@pytest.mark.parametrize(
    ("name", "kind"),
    [  # kernel names as an H200 run of parlab train (FSDP2, bf16) recorded them
        ("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN", "gemm"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128", "attention"),
        ("void cudnn::fusion::compute_dot_do_o_specialized<true, 128>(void const*)", "attention"),
        ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<c10::BFloat16>", "norm"),
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16>", "norm"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata<4>>", "optimizer"),
        ("void at::native::detail::chunk_cat_cuda_kernel<float, c10::BFloat16>(c10::BFloat16**)", "copy"),
        ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda>", "copy"),
        ("void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, float>", "reduction"),
        ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>>", "elementwise"),
        ("aten::mm", "gemm"),
        ("some_new_kernel", "other"),
    ],
)  # fmt: skip
def test_compute_kind_of_real_kernel_names(name: str, kind: str) -> None:
    assert compute_kind(name) == kind


def test_compute_by_kind_sums_kernel_time_per_step(tmp_path: Path) -> None:
    gemm, flash = "nvjet_sm90_tst_128x256", "flash_fwd_kernel"
    add = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>"
    steps = [[C(0, 300, name=gemm), C(300, 100, name=flash), C(400, 50, name=add), N(0, 200)]] * 2
    p = write_trace(
        tmp_path / "rank0.trace.json.gz",
        trace_doc(gpu_events(steps, step_us=1000), rank=0, world_size=1),
    )
    r = analyze_trace(p)
    assert r.compute_by_kind == pytest.approx(
        {"gemm": 300 * US, "attention": 100 * US, "elementwise": 50 * US}
    )
    assert list(r.compute_by_kind) == ["gemm", "attention", "elementwise"]  # largest first


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", "all_reduce"),
        ("ncclKernel_AllGather_RING_LL_Sum_int8_t(x)", "all_gather"),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter"),
        ("ncclDevKernel_SendRecv(x)", "send_recv"),
        ("c10d::_reduce_scatter_base_", "reduce_scatter"),
        ("c10d::_allgather_base_", "all_gather"),
        ("c10d::alltoall_base_", "all_to_all"),
        ("gloo:all_reduce", "all_reduce"),
        ("allgather_into_tensor_coalesced", "all_gather"),
        ("_reduce_scatter_base", "reduce_scatter"),
        ("broadcast", "broadcast"),
    ],
)
def test_collective_names(raw: str, name: str) -> None:
    assert collective_name(raw) == name


def test_payloads() -> None:
    meta = {
        "Collective name": "allgather",
        "In msg nelems": 10,
        "Out msg nelems": 20,
        "dtype": "BFloat16",
    }
    assert payload_from_meta(meta) == 40  # the gathered buffer, nccl-tests' convention
    assert payload_from_meta({"In msg nelems": 10}) is None
    args = {"Input Dims": [[[262400]], [], []], "Input type": ["TensorList", "", ""]}
    assert payload_from_shapes(args) is None  # TensorList: element type unknown
    args = {"Input Dims": [[263168]], "Input type": ["float"]}
    assert payload_from_shapes(args) == 263168 * 4


# ---------------------------------------------------------------- known answers (GPU)


def test_fully_overlapped_comm(tmp_path: Path) -> None:
    s = one_step(tmp_path, [C(0, 100), N(20, 40, stream=20)])
    assert s.comm_s == pytest.approx(40 * US)
    assert s.overlap_s == pytest.approx(40 * US)
    assert s.exposed_s == pytest.approx(0.0, abs=1e-12)
    assert s.idle_s == pytest.approx(0.0, abs=1e-12)


def test_no_overlap_and_idle(tmp_path: Path) -> None:
    s = one_step(tmp_path, [C(0, 50), N(60, 40, stream=20)])
    assert s.overlap_s == pytest.approx(0.0, abs=1e-12)
    assert s.exposed_s == pytest.approx(40 * US)
    assert s.window_s == pytest.approx(100 * US)
    assert s.idle_s == pytest.approx(10 * US)


def test_partial_overlap_and_concurrent_comm(tmp_path: Path) -> None:
    s = one_step(tmp_path, [C(0, 50), C(70, 30), N(40, 40, stream=20)])
    assert s.overlap_s / s.comm_s == pytest.approx(0.5)
    s = one_step(tmp_path, [C(0, 70), N(40, 40, stream=20), N(60, 30, stream=21)])
    assert s.comm_s == pytest.approx(50 * US)  # union [40, 90]
    assert s.overlap_s == pytest.approx(30 * US)  # [40, 70]
    assert s.comm_count == 2


def test_memory_copies_are_not_compute(tmp_path: Path) -> None:
    s = one_step(tmp_path, [Span(kind="memory", start=0, dur=50), N(0, 50, stream=20)])
    assert s.compute_s == 0.0
    assert s.overlap_s == 0.0
    assert s.exposed_s == pytest.approx(50 * US)


def test_metadata_wins_over_kernel_name(tmp_path: Path) -> None:
    meta = {
        "Collective name": "_reduce_scatter_base",
        "In msg nelems": 1000,
        "Out msg nelems": 500,
        "dtype": "Float",
    }
    events = gpu_events([[C(0, 10), N(10, 10, name="ncclDevKernel_Generic_4(x)", args=meta)]])
    p = write_trace(tmp_path / "r.json", trace_doc(events, rank=0, world_size=1))
    r = analyze_trace(p)
    (coll,) = r.collectives
    assert coll.name == "reduce_scatter"
    assert coll.bytes == 4000
    assert coll.bytes_known


def test_gpu_lag_keeps_kernels_in_their_launch_step(tmp_path: Path) -> None:
    # the GPU runs 900 us behind the CPU: step 1's kernels run in step 2's CPU window
    steps = [[C(0, 500), N(500, 200, stream=20)], [C(0, 100), N(100, 100, stream=20)]]
    p = write_trace(
        tmp_path / "r.json", trace_doc(gpu_events(steps, lag_us=900.0), rank=0, world_size=1)
    )
    r = analyze_trace(p)
    assert [s.comm_s for s in r.steps] == pytest.approx([200 * US, 100 * US])
    assert [s.compute_s for s in r.steps] == pytest.approx([500 * US, 100 * US])
    # step 1's window runs from its first kernel to step 2's first kernel: 1000 us
    assert r.steps[0].window_s == pytest.approx(1000 * US)
    assert r.steps[0].idle_s == pytest.approx(300 * US)


def test_exposed_shares_add_up_and_hotspots_rank(tmp_path: Path) -> None:
    ag = {
        "Collective name": "allgather",
        "In msg nelems": 10,
        "Out msg nelems": 20,
        "dtype": "Float",
    }
    steps = [
        [
            C(0, 100),
            N(50, 100, stream=20),  # all_reduce: 50 exposed
            N(200, 10, stream=21, name="ncclDevKernel_AllGather_RING_LL", args=ag),  # 10 exposed
        ]
    ] * 2
    p = write_trace(tmp_path / "rank0.json", trace_doc(gpu_events(steps), rank=0, world_size=1))
    r = analyze_trace(p)
    assert sum(c.exposed_s for c in r.collectives) == pytest.approx(
        sum(s.exposed_s for s in r.steps)
    )
    assert [c.name for c in r.collectives] == ["all_reduce", "all_gather"]
    run = analyze_folder(tmp_path)
    hs = summarize(run).hotspots
    assert hs[0].name == "all_reduce"
    assert hs[0].exposed_per_step_s == pytest.approx(50 * US)
    assert hs[1].bytes_per_step == 80
    assert "prefetch" in hs[1].advice or "all-gather" in hs[1].advice


def test_stragglers(tmp_path: Path) -> None:
    for rank, late in ((0, 0.0), (1, 30.0), (2, 10.0)):
        steps = [[C(0, 100), N(100 + late, 50, stream=20)]] * 3
        write_trace(
            tmp_path / f"rank{rank}.trace.json.gz",
            trace_doc(gpu_events(steps), rank=rank, world_size=3),
        )
    s = summarize(analyze_folder(tmp_path))
    assert s.straggler_rank == 1
    assert s.straggler_lateness_s == pytest.approx(30 * US)
    assert len(s.straggler_by_step) == 3


def test_cpu_trace_known_answer(tmp_path: Path) -> None:
    args = {"Input Dims": [[1000]], "Input type": ["float"]}
    s = one_step(tmp_path, [C(0, 600), N(400, 400, args=args)], gpu=False)
    assert s.window_s == pytest.approx(1000 * US)
    assert s.overlap_s == pytest.approx(200 * US)
    assert s.exposed_s == pytest.approx(200 * US)
    assert s.idle_s == pytest.approx(200 * US)
    assert s.comm_bytes == 4000


# ---------------------------------------------------------------- the reader


def test_scanner_matches_json_load_at_any_chunk_size(tmp_path: Path) -> None:
    doc = trace_doc(
        gpu_events([[C(0, 10), N(5, 10, args={"s": 'x\\u00e9"]}'})]] * 3), rank=0, world_size=1
    )
    p = write_trace(tmp_path / "t.json", doc)
    for chunk in (1, 7, 64, 1 << 20):
        sc = TraceScanner(p, chunk_chars=chunk)
        assert list(sc.events()) == doc["traceEvents"]
        assert sc.meta == {k: v for k, v in doc.items() if k != "traceEvents"}
    assert read_header(p)["distributedInfo"]["rank"] == 0


def test_big_trace_streams_with_known_overlap(tmp_path: Path) -> None:
    p = tmp_path / "rank0.trace.json"
    with open(p, "w") as f:
        info = write_big_trace(f, target_bytes=600_000, rank=0, world_size=1)
    r = analyze_trace(p)
    assert len(r.steps) == info["steps"]
    for s in r.steps:
        assert s.comm_count == 20
        assert s.overlap_s / s.comm_s == pytest.approx(0.45)  # 18 of each 40 us covered


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "not a Chrome trace"),
        ("hello", "not a Chrome trace"),
        ('{"a": 1}', "no traceEvents"),
        ('{"traceEvents": [{"ph": "X"}, ]}', "corrupt JSON"),
    ],
)
def test_non_trace_json(tmp_path: Path, text: str, needle: str) -> None:
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(TraceFormatError, match=needle) as exc:
        list(TraceScanner(p).events())
    assert str(p) in str(exc.value)


def test_truncated_trace_names_the_file(tmp_path: Path) -> None:
    doc = trace_doc(gpu_events([[C(0, 10)]] * 20), rank=0, world_size=1)
    text = json.dumps(doc, indent=2)
    for cut in (len(text) // 2, len(text) - 5):
        p = tmp_path / f"cut{cut}.json"
        p.write_text(text[:cut])
        with pytest.raises(TraceFormatError, match="truncated") as exc:
            list(TraceScanner(p, chunk_chars=100).events())
        assert str(p) in str(exc.value)
    gz = tmp_path / "cut.json.gz"
    gz.write_bytes(gzip.compress(text.encode())[:-40])
    with pytest.raises(TraceFormatError, match="truncated"):
        list(TraceScanner(gz).events())


# ---------------------------------------------------------------- a folder with bad files


def _rank_file(folder: Path, rank: int, world: int, run_id: str = "run-a") -> Path:
    steps = [[C(0, 100), N(50, 100, stream=20)]] * 2
    return write_trace(
        folder / f"rank{rank}.trace.json.gz",
        trace_doc(gpu_events(steps), rank=rank, world_size=world, run_id=run_id),
    )


def test_folder_with_bad_foreign_and_missing_ranks(tmp_path: Path) -> None:
    for r in (0, 1, 3):
        _rank_file(tmp_path, r, 4)
    # rank 3 truncated, rank 2 missing, a trace of another run, a non-trace JSON file
    p3 = tmp_path / "rank3.trace.json.gz"
    p3.write_bytes(gzip.compress(gzip.decompress(p3.read_bytes())[:-200]))
    other = _rank_file(tmp_path / "x", 0, 2, run_id="run-b")
    os.replace(other, tmp_path / "other-run.json.gz")
    (tmp_path / "notes.json").write_text('{"hello": "world"}')
    run = analyze_folder(tmp_path)
    assert [r.rank for r in run.ranks] == [0, 1]
    msgs = " | ".join(p.message for p in run.problems)
    assert "rank3.trace.json.gz" in msgs and "truncated" in msgs
    assert "other-run.json.gz" in msgs and "different run" in msgs
    assert "notes.json" in msgs and "not a Chrome trace" in msgs
    assert "rank(s) [2, 3]" not in msgs  # rank 3 has a (bad) file, named above
    assert "no trace for rank(s) [2]" in msgs
    assert run.world_size == 4


def test_folder_with_nothing_usable(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("[")
    with pytest.raises(ValueError, match=r"no usable trace .*a\.json"):
        analyze_folder(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        analyze_folder(tmp_path / "nope")
    _rank_file(tmp_path / "empty" / "ddp-bucket25mb", 0, 1)
    with pytest.raises(ValueError, match="subfolders ddp-bucket25mb hold traces"):
        analyze_folder(tmp_path / "empty")


def test_hta_agreement(tmp_path: Path) -> None:
    """Overlap agrees with Holistic Trace Analysis within 2 points (where ``hta`` is installed)."""
    hta = pytest.importorskip("hta.trace_analysis")
    rng = np.random.default_rng(1)
    for rank in range(2):
        steps = []
        for _ in range(3):
            spans = [C(float(t), float(rng.uniform(5, 30))) for t in range(0, 900, 40)]
            # "ncclKernel_": every HTA version calls it communication (older ones miss ncclDevKernel)
            nccl = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"
            spans += [
                N(float(t), float(rng.uniform(10, 60)), stream=20, name=nccl)
                for t in range(20, 900, 150)
            ]
            steps.append(spans)
        # HTA leaves the last ProfilerStep out (as possibly incomplete): end with an empty
        # step so both analyse the same three steps of kernels.
        steps.append([])
        write_trace(
            tmp_path / f"rank{rank}.trace.json",
            trace_doc(gpu_events(steps), rank=rank, world_size=2),
        )
    analyzer = hta.TraceAnalysis(trace_dir=str(tmp_path))
    ref = analyzer.get_comm_comp_overlap(visualize=False)
    ours = summarize(analyze_folder(tmp_path))
    for rank in range(2):
        want = float(ref[ref["rank"] == rank]["comp_comm_overlap_pctg"].mean())
        assert ours.overlap_pct[rank] == pytest.approx(want, abs=2.0)


def test_skipping_cpu_ops_of_gpu_traces_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import re

    import parlab.profile.collect as collect_mod

    p = tmp_path / "rank0.trace.json"
    with open(p, "w") as f:
        write_big_trace(f, target_bytes=300_000, rank=0, world_size=1)
    fast = analyze_trace(p)
    sc = TraceScanner(p)
    for _ in sc.events():
        sc.skip = collect_mod.KINETO_CPU_OP_NOT_COMM
    assert sc.events_skipped > 100
    monkeypatch.setattr(collect_mod, "KINETO_CPU_OP_NOT_COMM", re.compile("(?!)"))
    slow = analyze_trace(p)
    assert fast.steps == slow.steps
    assert fast.collectives == slow.collectives
    assert fast.events == slow.events


def test_gpu_document_and_merged_trace(tmp_path: Path) -> None:
    from parlab.contract import read_document
    from parlab.profile.report import profile_folder

    traces = tmp_path / "traces"
    for rank in (0, 1):
        steps = [[C(0, 100), N(50, 100, stream=20), Span(kind="memory", start=160, dur=5)]] * 3
        write_trace(
            traces / f"rank{rank}.trace.json.gz",
            trace_doc(gpu_events(steps), rank=rank, world_size=2),
        )
    o = profile_folder(traces, results=tmp_path / "res", command="parlab profile analyze t")
    doc = read_document(o.path)
    assert doc.evidence_level == "real-training" and doc.task == "T5"
    assert doc.metrics["overlap_fraction"].value == pytest.approx(50.0)
    assert doc.metrics["exposed_comm_time"].value == pytest.approx(50 * US)
    assert doc.metrics["idle_time"].value == pytest.approx(1000 * US - 155 * US)  # every step
    merged = json.loads(
        gzip.decompress((o.path.parent / doc.artifacts["merged_trace"]).read_bytes())
    )
    threads = {
        (e["pid"], e["args"]["name"]) for e in merged["traceEvents"] if e["name"] == "thread_name"
    }
    assert {(0, "stream 7"), (0, "stream 20"), (1, "stream 7"), (1, "stream 20")} <= threads
    kernels = [e for e in merged["traceEvents"] if e.get("cat") == "kernel"]
    assert len(kernels) == 2 * 3 * 2
    assert {e["args"]["collective"] for e in kernels if "args" in e} == {"all_reduce"}
    assert "all_reduce" in o.text


def test_trace_without_step_marks_is_one_step(tmp_path: Path) -> None:
    for gpu in (True, False):
        events = (
            gpu_events([[C(0, 100), N(50, 100, stream=20)]])
            if gpu
            else cpu_events([[C(0, 100), N(50, 100)]])
        )
        events = [e for e in events if not e["name"].startswith("ProfilerStep")]
        p = write_trace(tmp_path / f"r{gpu}.json", trace_doc(events, rank=0, world_size=1, gpu=gpu))
        (s,) = analyze_trace(p).steps
        assert s.step == -1
        assert s.comm_s == pytest.approx(100 * US)
        assert s.overlap_s == pytest.approx(50 * US)


def test_cpu_comm_past_the_step_mark_is_cut(tmp_path: Path) -> None:
    s = one_step(tmp_path, [C(0, 600), N(900, 300)], gpu=False)  # the step ends at 1000 us
    assert s.comm_s == pytest.approx(100 * US)
    assert s.exposed_s == pytest.approx(100 * US)


def _hta_style_overlap(path: Path) -> float:
    """Holistic Trace Analysis's algorithm, restated naively over the whole trace (json.load):
    merge comm and compute kernels separately, sweep +1/-1 (comm) and +2/-2 (compute) edges,
    sum the time the running status is 3, divide by the merged comm time."""
    doc = json.loads(
        gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text()
    )
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]

    def merged(kind: str) -> list[tuple[float, float]]:
        spans = sorted(
            (e["ts"], e["ts"] + e["dur"]) for e in kernels if kernel_kind(e["name"]) == kind
        )
        out: list[list[float]] = []
        for s, e in spans:
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        return [(a, b) for a, b in out]

    comm, comp = merged("comm"), merged("compute")
    edges = sorted(
        [(s, 1) for s, _ in comm]
        + [(e, -1) for _, e in comm]
        + [(s, 2) for s, _ in comp]
        + [(e, -2) for _, e in comp]
    )
    running, total = 0, 0.0
    for (t, d), nxt in zip(edges, [*edges[1:], (edges[-1][0], 0)], strict=True):
        running += d
        if running == 3:
            total += nxt[0] - t
    return 100.0 * total / sum(b - a for a, b in comm)


def test_overlap_matches_a_naive_hta_restatement(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    for rank in range(3):
        steps = []
        for _ in range(4):
            spans = [C(float(t), float(rng.uniform(2, 45))) for t in range(0, 950, 37)]
            spans += [
                N(float(t), float(rng.uniform(5, 80)), stream=int(rng.choice([20, 21])))
                for t in range(10, 950, 90)
            ]
            steps.append(spans)
        write_trace(
            tmp_path / f"rank{rank}.trace.json.gz",
            trace_doc(gpu_events(steps), rank=rank, world_size=3),
        )
    ours = summarize(analyze_folder(tmp_path))
    for rank in range(3):
        want = _hta_style_overlap(tmp_path / f"rank{rank}.trace.json.gz")
        assert ours.overlap_pct[rank] == pytest.approx(want, abs=0.01)
