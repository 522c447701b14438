"""Kernels queued before the profiler's active window (their launch is not in the trace) run
in the first profiled step's window; counted, they made a 2xH200 DDP step 88.9 ms instead of
70.4 ms and 60 collectives instead of 34. They are dropped, as Holistic Trace Analysis drops
them, and the analysis says how many."""

from __future__ import annotations

from pathlib import Path

import pytest

from parlab.profile.analyze import analyze_folder, analyze_trace
from parlab.profile.synthetic import Span, gpu_events, trace_doc, write_trace

US = 1e-6
AR = {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
      "dtype": "Float"}  # fmt: skip


def _trace(tmp_path: Path, *, queued: bool) -> Path:
    step = [
        Span(kind="compute", start=0, dur=400),
        Span(kind="comm", start=400, dur=100, stream=20, args=AR),
    ]
    # the GPU runs 300 us behind the CPU
    events = gpu_events([step, step], step_us=1000.0, lag_us=300.0)
    if queued:  # launched before the active window: the kernels are there, their launches not
        t0 = 1.0e6
        for i, (cat, name, start, dur) in enumerate(
            [
                ("kernel", "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", 20.0, 150.0),
                ("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 170.0, 120.0),
            ]
        ):
            events.append(
                {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7 + 13 * i,
                 "ts": t0 + start, "dur": dur, "args": {"correlation": 90_000 + i}}
            )  # fmt: skip
    path = tmp_path / ("queued" if queued else "clean") / "rank0.trace.json"
    path.parent.mkdir()
    return write_trace(path, trace_doc(events, rank=0, world_size=1))


def test_kernels_without_a_launch_are_left_out_and_counted(tmp_path: Path) -> None:
    clean = analyze_trace(_trace(tmp_path, queued=False))
    queued = analyze_trace(_trace(tmp_path, queued=True))
    assert queued.unlaunched_kernels == 2 and clean.unlaunched_kernels == 0
    # the steps, collective counts and payloads are the clean trace's
    assert [s.window_s for s in queued.steps] == pytest.approx([s.window_s for s in clean.steps])
    assert [s.comm_count for s in queued.steps] == [1, 1]
    assert [s.compute_s for s in queued.steps] == pytest.approx([400 * US, 400 * US])
    (coll,) = queued.collectives
    assert coll.name == "all_reduce" and coll.count == 2 and coll.bytes_known
    assert queued.compute_by_kind == pytest.approx(clean.compute_by_kind)


def test_the_folder_analysis_says_how_many_were_dropped(tmp_path: Path) -> None:
    run = analyze_folder(_trace(tmp_path, queued=True).parent)
    [problem] = run.problems
    assert "rank 0: 2 GPU kernel(s) with no launch" in problem.message
    assert "Holistic Trace Analysis" in problem.message
