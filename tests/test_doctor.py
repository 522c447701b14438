"""The case collection: each detector on small hand-built documents (case and healthy
twin), the doctor over the committed 2xH200 documents, and bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from parlab.cli import main
from parlab.contract import Document, Failure, Metric, Prediction, write_result
from parlab.doctor import BY_ID, CASES, diagnose
from parlab.doctor.cases import Doc
from parlab.doctor.cases.idle import bubble_formula
from parlab.glossary import lookup

ROOT = Path(__file__).resolve().parents[1]
N = 0
ENV: dict[str, Any] = {}


def _env() -> dict[str, Any]:
    if not ENV:
        from parlab.hardware.env import snapshot

        ENV.update(snapshot(probe_links=False))
    return ENV


def _doc(project: str = "PAR-TRAINING-STATE", *, metrics: dict[str, Any] | None = None,
         layout: dict[str, Any] | None = None, workload: dict[str, Any] | None = None,
         environment: dict[str, Any] | None = None, failure: Failure | None = None,
         predictions: dict[str, Prediction] | None = None,
         level: str = "real-training") -> Doc:  # fmt: skip
    global N
    N += 1
    ms = {}
    for k, v in (metrics or {}).items():
        ms[k] = v if isinstance(v, Metric) else Metric(value=v[0], unit=v[1])
    doc = Document(
        run_id=f"t-{N}", created="2026-01-01T00:00:00Z", project=project, task="T5",
        role="failure" if failure else "candidate", evidence_level=level, command="parlab x",
        environment=environment or _env(), workload=workload or {},
        layout={"world_size": 2, **(layout or {})}, metrics=ms,
        status="failed" if failure else "ok", failure=failure, predictions=predictions or {},
    )  # fmt: skip
    return Doc(path=f"{project}/t-{N}.json", doc=doc)


def _cases(docs: list[Doc], case: str) -> list[str]:
    return [f.document for f in BY_ID[case].detector(docs)]


def test_every_case_is_complete_data() -> None:
    assert len(CASES) >= 11
    for c in CASES:
        assert c.symptom and c.evidence and c.explanation and c.try_, c.id
        assert c.reproduce in ("cpu", "gpu", "none")
        for t in c.terms:
            lookup(t)  # every term a case cites is in the glossary


def test_slow_link() -> None:
    link = 478e9

    def sweep(bw: float, env: dict[str, str]) -> Doc:
        return _doc("PAR-COLLECTIVES", workload={"kind": "collectives-sweep", "link_bw": link},
                    metrics={"all_reduce.busbw_peak": (bw, "B/s"),
                             "all_reduce.busbw_peak_size": (2**30, "B")},
                    environment={"variables": env}, level="real-nccl")  # fmt: skip

    slow, fast = sweep(20e9, {"NCCL_P2P_DISABLE": "1"}), sweep(350e9, {})
    found = BY_ID["slow-link"].detector([slow, fast])
    assert [f.document for f in found] == [slow.path]
    assert found[0].strength == "strong" and "NCCL_P2P_DISABLE=1" in found[0].summary
    pcie = _doc(
        environment={"hardware": {"interconnect": {"matrix": [["X", "SYS"], ["SYS", "X"]]}}}
    )
    assert _cases([pcie], "slow-link") == [pcie.path]


def test_exposed_comm_and_straggler() -> None:
    bad = _doc(metrics={"exposed_comm_fraction": (40.0, "%"), "overlap_fraction": (0.0, "%"),
                        "exposed_comm_time": (0.04, "s"), "step_time": (0.1, "s"),
                        "straggler_lateness": (0.02, "s"), "straggler_rank": (1, "rank")})  # fmt: skip
    good = _doc(metrics={"exposed_comm_fraction": (3.0, "%"), "overlap_fraction": (90.0, "%"),
                         "exposed_comm_time": (0.003, "s"), "step_time": (0.1, "s"),
                         "straggler_lateness": (0.001, "s"), "straggler_rank": (0, "rank")})  # fmt: skip
    assert _cases([bad, good], "exposed-comm") == [bad.path]
    assert _cases([bad, good], "straggler") == [bad.path]


def test_gpu_timing_cases_skip_cpu_documents(tmp_path: Path) -> None:
    d = _doc(metrics={"exposed_comm_fraction": (60.0, "%"), "overlap_fraction": (0.0, "%"),
                      "exposed_comm_time": (0.06, "s"), "step_time": (0.1, "s")},
             level="cpu-mechanism")  # fmt: skip
    write_result(d.doc, tmp_path)
    assert "exposed-comm" not in diagnose(tmp_path).cases_found()


def test_ddp_small_buckets_needs_a_slower_twin() -> None:
    def run(cap: float, calls: int, step: float) -> Doc:
        return _doc(layout={"bucket_cap_mb": cap}, workload={"sweep_run_id": "s1"},
                    metrics={"comm_count_per_step": (calls, "count"),
                             "comm_bytes_per_step": (1e6, "B"), "step_time": (step, "s")})  # fmt: skip

    small, big = run(0.01, 40, 0.08), run(25.0, 1, 0.03)
    found = BY_ID["ddp-small-buckets"].detector([small, big])
    assert [(f.document, f.strength) for f in found] == [(small.path, "strong")]
    assert found[0].twins == [big.path]
    fast_small, big2 = run(0.01, 40, 0.03), run(25.0, 1, 0.03)  # many calls, not slower
    fast_small.doc.workload["sweep_run_id"] = big2.doc.workload["sweep_run_id"] = "s2"
    assert _cases([fast_small, big2], "ddp-small-buckets") == []


def test_fsdp_no_prefetch() -> None:
    def run(prefetch: bool, step: float, pct: float) -> Doc:
        return _doc(layout={"strategy": "fsdp", "prefetch": prefetch, "reshard_after_forward": True},
                    workload={"sweep_run_id": "f1"},
                    metrics={"step_time": (step, "s"), "exposed_comm_fraction": (pct, "%")})  # fmt: skip

    off, on = run(False, 0.5, 20.0), run(True, 0.3, 2.0)
    assert _cases([off, on], "fsdp-no-prefetch") == [off.path]
    off2, on2 = run(False, 0.3, 5.0), run(True, 0.4, 4.0)
    off2.doc.workload["sweep_run_id"] = on2.doc.workload["sweep_run_id"] = "f2"
    assert _cases([off2, on2], "fsdp-no-prefetch") == []


def test_pp_bubble() -> None:
    assert bubble_formula(2, 2) == pytest.approx(1 / 3)
    assert bubble_formula(4, 8, 2) == pytest.approx(3 / 19)

    def run(m: int, measured: float | None) -> Doc:
        met = {"pp_bubble": (measured, "fraction")} if measured is not None else {}
        return _doc("PAR-MODEL-INTERNAL", layout={"mesh": {"pp": 2}, "vpp": 1},
                    workload={"microbatches": m}, metrics=met)  # fmt: skip

    few, many, busy_many, unmeasured = run(2, 0.31), run(16, 0.05), run(16, 0.25), run(2, None)
    found = BY_ID["pp-bubble"].detector([few, many, busy_many, unmeasured])
    assert [(f.document, f.strength) for f in found] == [
        (few.path, "strong"), (unmeasured.path, "weak")]  # fmt: skip


def test_moe_skew() -> None:
    def run(excess: float, load: float) -> Doc:
        return _doc("PAR-MOE-EXPERT", workload={"name": "w"},
                    metrics={"slowest_rank_excess": (excess, "%"), "slowest_rank": (0, "rank"),
                             "rank_load_max_over_mean": (load, "ratio")})  # fmt: skip

    skew, even, noisy = run(45.0, 1.6), run(2.0, 1.01), run(25.0, 1.02)
    assert _cases([skew, even, noisy], "moe-skew") == [skew.path]


def test_oom_cases() -> None:
    preds = {"peak_memory": Prediction(value=100.0, unit="B", model="ledger"),
             "state_bytes.params": Prediction(value=10.0, unit="B", model="ledger"),
             "state_bytes.optimizer": Prediction(value=20.0, unit="B", model="ledger")}  # fmt: skip
    act = _doc(failure=Failure(kind="oom", message="OutOfMemoryError: cap"), predictions=preds)
    states = {**preds, "state_bytes.optimizer": Prediction(value=70.0, unit="B", model="ledger")}
    state_oom = _doc(failure=Failure(kind="oom", message="x"), predictions=states)
    assert _cases([act, state_oom], "oom-activations") == [act.path]
    msg = "CUDA out of memory. Process 1464 has 101.85 GiB memory in use. Of the allocated"
    other = _doc(failure=Failure(kind="oom", message=msg, rank=1))
    assert _cases([other, act], "memory-held-elsewhere") == [other.path]


def test_timeout_not_budget() -> None:
    hang = _doc(failure=Failure(kind="timeout", message="rank(s) [1] never reached the "
                                "collective that rank 0 waited in", rank=1))  # fmt: skip
    budget = _doc(failure=Failure(kind="timeout", message="not run: the set's time budget "
                                  "(--budget) was spent"))  # fmt: skip
    found = BY_ID["collective-timeout"].detector([hang, budget])
    assert [(f.document, f.strength) for f in found] == [(hang.path, "strong")]


def test_tp_across_nodes() -> None:
    hw = {"hardware": {"host_count": 2, "gpu_count": 8}}
    wide = _doc(layout={"mesh": {"tp": 16}}, environment=hw)
    inside = _doc(layout={"mesh": {"tp": 8, "dp": 2}}, environment=hw)
    assert _cases([wide, inside], "tp-across-nodes") == [wide.path]


def test_router_imbalance() -> None:
    def run(per: list[float], p99: float, policy: str) -> Doc:
        return _doc("PAR-DISTRIBUTED-INFERENCE", layout={"policy": policy},
                    workload={"dataset": "d", "seed": 0, "request_rate": 2, "num_requests": 48},
                    metrics={"requests_per_replica": Metric(value=24, unit="count", per_rank=per),
                             "p99_ttft_ms": (p99, "ms"), "median_ttft_ms": (300.0, "ms")})  # fmt: skip

    rnd, rr = run([18, 30], 2000.0, "random"), run([24, 24], 600.0, "round_robin")
    found = BY_ID["router-imbalance"].detector([rnd, rr])
    assert [(f.document, f.strength) for f in found] == [(rnd.path, "moderate")]
    assert found[0].twins == [rr.path]


# ----- the committed 2xH200 documents -------------------------------------------------------


def test_committed_gpu_documents() -> None:
    results = ROOT / "results"
    if not any(results.glob("*/*.json")):
        pytest.skip("no committed results")
    diag = diagnose(results)
    by = {(f.case, Path(f.document).name.split("-2026")[0]) for f in diag.findings}
    assert ("moe-skew", "moe-ep2") in by  # Zipf routing: rank 0 the slowest
    assert ("exposed-comm", "profile-tp2-nosp") in by  # TP all-reduces on the critical path
    assert ("memory-held-elsewhere", "profile-fsdp") in by  # another process held 101 GiB
    # the runs of the GPU scripts (reproductions, kept in deeper folders, are left out)
    docs = {Path(f.document).name: f for f in diag.findings if f.document.count("/") == 1}
    # what the GPU runs did NOT show: uniform routing, 8-micro-batch pipelines, fast links,
    # DDP buckets (the 1 MB run was not slower than 250 MB)
    for name, f in docs.items():
        assert "uniform" not in name or f.case != "moe-skew"
        assert f.case not in ("pp-bubble", "slow-link", "ddp-small-buckets"), (name, f.summary)


# ----- bad input ----------------------------------------------------------------------------


def _exit(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return int(exc.value.code or 0)


def test_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit(["doctor", str(tmp_path / "missing")]) == 2
    assert _exit(["doctor", str(tmp_path)]) == 2  # empty
    (tmp_path / "x.json").write_text('{"hello": 1}')
    assert _exit(["doctor", str(tmp_path)]) == 2  # foreign
    assert "no distributed-benchmark/v1 documents" in capsys.readouterr().err
    assert _exit(["doctor", "--reproduce", "no-such-case"]) == 2
    assert _exit(["doctor", "--reproduce", "straggler"]) == 2  # a case without reproduction
    assert _exit(["doctor"]) == 2
    assert _exit(["doctor", "--case", "nope", str(tmp_path)]) == 2
    assert _exit(["explain", "no-such-term"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 5 and all(line.startswith("parlab: error:") for line in
                                         err.splitlines())  # fmt: skip


def test_slow_link_reproduction_refused_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("has GPUs")
    assert _exit(["doctor", "--reproduce", "slow-link", "--out", "/nonexistent/x"]) == 2
    assert "needs 2 CUDA GPUs" in capsys.readouterr().err


def test_nothing_found_said_plainly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _doc(metrics={"step_time": (0.1, "s")})
    write_result(d.doc, tmp_path)
    assert _exit(["doctor", str(tmp_path)]) == 0
    assert "nothing found: none of the" in capsys.readouterr().out
    assert _exit(["doctor", "--list"]) == 0
    assert _exit(["explain", "busbw"]) == 0


def test_half_bandwidth_size_skips_a_sweep_measured_only_above_it() -> None:
    from parlab.doctor.cases.communication import half_bandwidth_size

    def sweep(sizes_bw: list[tuple[int, float]]) -> Doc:
        rows = [{"op": "all_reduce", "size": s, "busbw": b} for s, b in sizes_bw]
        return _doc("PAR-COLLECTIVES", layout={"backend": "nccl"},
                    workload={"kind": "collectives-sweep", "measurements": rows},
                    level="real-nccl")  # fmt: skip

    full = sweep([(1 << 20, 50e9), (16 << 20, 200e9), (1 << 30, 330e9)])
    big_only = sweep([(64 << 20, 260e9), (1 << 30, 330e9)])  # newer, above half-peak only
    assert half_bandwidth_size([full, big_only], "nccl") == (16 << 20, full.path)
    assert half_bandwidth_size([big_only], "nccl") == (None, None)
