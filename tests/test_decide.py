"""``parlab decide``: comparability, the choice, the rejections and their reasons, the document.

The documents here are built by hand in the shapes the project runners write
(metrics ``tokens_per_s_per_gpu``, ``step_time``, ``peak_memory`` per rank,
``predictions`` beside them); ``make_project`` is reused by the report tests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from parlab import contract
from parlab.contract import Document, Failure, Metric, Prediction
from parlab.plan.decide import decide

ENV_GPU: dict[str, Any] = {
    "hardware": {
        "gpus": [
            {"name": "NVIDIA H200", "memory_bytes": 150_000_000_000},
            {"name": "NVIDIA H200", "memory_bytes": 150_000_000_000},
        ],
        "gpu_count": 2,
        "host_count": 1,
        "cpu": {"count": 16},
    },
    "software": {
        "python": "3.12",
        "torch": "2.11",
        "cuda": "13.0",
        "nccl": "2.27",
        "parlab": "0.1.0",
    },
}
WORKLOAD: dict[str, Any] = {"model": {"name": "1.3b"}, "global_batch": 8, "seq": 4096, "steps": 20}


def training_doc(
    *,
    role: str,
    strategy: str,
    tps: float | None,
    step: float | None,
    mem: list[float] | None,
    predicted_step: float | None = None,
    predicted_mem: float | None = None,
    failure: Failure | None = None,
    workload: dict[str, Any] | None = None,
    env: dict[str, Any] | None = None,
    level: str = "real-training",
    project: str = "PAR-TRAINING-STATE",
    created: str = "2026-01-01T00:00:00Z",
) -> Document:
    metrics: dict[str, Metric] = {}
    if tps is not None:
        metrics["tokens_per_s_per_gpu"] = Metric(value=tps, unit="tokens/s")
    if step is not None:
        metrics["step_time"] = Metric(value=step, unit="s")
    if mem is not None:
        metrics["peak_memory"] = Metric(value=max(mem), unit="B", per_rank=mem)
    metrics["comm_bytes_per_step.all_reduce"] = Metric(value=2.7e9, unit="B")
    predictions = {}
    if predicted_step is not None:
        predictions["step_time"] = Prediction(value=predicted_step, unit="s", model="plan")
    if predicted_mem is not None:
        predictions["peak_memory"] = Prediction(value=predicted_mem, unit="B", model="ledger")
    return Document(
        run_id=contract.new_run_id(f"train-{strategy}"),
        created=created,
        project=project,
        task="T2",
        role=role,
        evidence_level=level,
        command=f"parlab train --strategy {strategy}",
        environment=env if env is not None else ENV_GPU,
        workload=dict(workload if workload is not None else WORKLOAD),
        layout={"world_size": 2, "mesh": {"dp": 2}, "strategy": strategy},
        metrics=metrics if failure is None else {},
        status="ok" if failure is None else "failed",
        failure=failure,
        predictions=predictions,
        notes=["made by hand for a test"],
    )


def make_project(root: Path) -> dict[str, Document]:
    """A baseline (DDP), a faster candidate (FSDP), a slower one (ZeRO-1), an OOM failure."""
    docs = {
        "ddp": training_doc(
            role="baseline",
            strategy="ddp",
            tps=40_000,
            step=0.82,
            mem=[60e9, 61e9],
            predicted_step=0.80,
            predicted_mem=59e9,
            created="2026-01-01T00:00:01Z",
        ),
        "fsdp": training_doc(
            role="candidate",
            strategy="fsdp",
            tps=46_000,
            step=0.71,
            mem=[38e9, 39e9],
            predicted_step=0.75,
            predicted_mem=37e9,
            created="2026-01-01T00:00:02Z",
        ),
        "zero1": training_doc(
            role="candidate",
            strategy="zero1",
            tps=41_000,
            step=0.80,
            mem=[50e9, 50e9],
            created="2026-01-01T00:00:03Z",
        ),
        "oom": training_doc(
            role="failure",
            strategy="ddp-mb8",
            tps=None,
            step=None,
            mem=None,
            failure=Failure(kind="oom", message="CUDA out of memory on rank 1", rank=1),
            created="2026-01-01T00:00:04Z",
        ),
    }
    for d in docs.values():
        contract.write_result(d, root)
    return docs


def test_decide_picks_the_faster_ok_candidate_and_rejects_the_rest_with_reasons(
    tmp_path: Path,
) -> None:
    docs = make_project(tmp_path)
    out = decide(tmp_path, project="PAR-TRAINING-STATE", command="parlab decide x")
    d = out.doc
    assert d.role == "decision" and d.task == "T6" and d.decision is not None
    assert d.decision.chosen == docs["fsdp"].run_id
    reasons = {r["candidate"]: r for r in d.decision.rejected}
    assert reasons[docs["oom"].run_id]["kind"] == "oom"
    assert "failed: oom" in reasons[docs["oom"].run_id]["reason"]
    assert reasons[docs["zero1"].run_id]["kind"] == "slower"
    assert "41,000" in reasons[docs["zero1"].run_id]["reason"]
    assert reasons[docs["ddp"].run_id]["kind"] == "slower"
    assert sorted(d.decision.rests_on) == sorted(x.run_id for x in docs.values())
    # the decision carries the level of the measured documents it compares
    assert d.evidence_level == "real-training"
    # prediction errors of each measured candidate: (0.75 - 0.71) / 0.71
    err = d.metrics[f"prediction_error.{docs['fsdp'].run_id}.step_time"]
    assert err.unit == "%" and err.value == pytest.approx(100 * 0.04 / 0.71)
    err = d.metrics[f"prediction_error.{docs['ddp'].run_id}.peak_memory"]
    assert err.value == pytest.approx(100 * (59e9 - 61e9) / 61e9)
    assert d.metrics["chosen.tokens_per_s_per_gpu"].value == 46_000
    # written, schema-valid, read back the same
    data = json.loads(out.path.read_text())
    jsonschema.validate(data, contract.schema())
    assert contract.read_document(out.path).decision == d.decision


def test_decide_rejects_a_candidate_over_the_memory_budget(tmp_path: Path) -> None:
    docs = make_project(tmp_path)
    out = decide(tmp_path, project="PAR-TRAINING-STATE", memory_budget=45e9, command="x")
    dec = out.doc.decision
    assert dec is not None
    # FSDP is the only one under 45 GB; then with 40 GB nothing fits
    assert dec.chosen == docs["fsdp"].run_id
    reasons = {r["candidate"]: r for r in dec.rejected}
    assert reasons[docs["zero1"].run_id]["kind"] == "over-memory"
    assert "by 5.00 GB" in reasons[docs["zero1"].run_id]["reason"]
    out = decide(tmp_path, project="PAR-TRAINING-STATE", memory_budget=30e9, command="x")
    assert out.doc.decision is not None and out.doc.decision.chosen is None
    assert "no candidate qualifies" in out.doc.decision.reason


def test_incomparable_documents_are_named_with_what_differs(tmp_path: Path) -> None:
    docs = make_project(tmp_path)
    other = training_doc(
        role="candidate",
        strategy="fsdp",
        tps=90_000,
        step=0.3,
        mem=[10e9, 10e9],
        workload={**WORKLOAD, "seq": 2048},
        created="2026-01-01T00:00:05Z",
    )
    cpu = training_doc(
        role="candidate",
        strategy="fsdp",
        tps=95_000,
        step=0.3,
        mem=[10e9, 10e9],
        level="cpu-mechanism",
        created="2026-01-01T00:00:06Z",
    )
    contract.write_result(other, tmp_path)
    contract.write_result(cpu, tmp_path)
    out = decide(tmp_path, project="PAR-TRAINING-STATE", command="x")
    dec = out.doc.decision
    assert dec is not None and dec.chosen == docs["fsdp"].run_id
    reasons = {r["candidate"]: r for r in dec.rejected}
    assert reasons[other.run_id]["kind"] == "incomparable"
    assert "workload.seq: 4096 vs 2048" in reasons[other.run_id]["reason"]
    assert "evidence level: real-training vs cpu-mechanism" in reasons[cpu.run_id]["reason"]
    assert other.run_id not in dec.rests_on
    # asked for explicitly, incomparable documents are bad input
    with pytest.raises(
        ValueError, match=r"incomparable.*workload\.seq: (4096 vs 2048|2048 vs 4096)"
    ):
        decide(
            tmp_path,
            project="PAR-TRAINING-STATE",
            run_ids=[docs["ddp"].run_id, other.run_id],
            command="x",
        )


def test_probe_documents_are_left_out_as_not_runs(tmp_path: Path) -> None:
    """A probe's calibration and a profile of a run sit beside the runs under the project; they
    are not runs to choose from (not even incomparable ones), and the decision says so."""
    docs = make_project(tmp_path)
    calibration = training_doc(role="baseline", strategy="probe", tps=None, step=None, mem=None,
                               workload={"kind": "gemm-shape-calibration", "calibration": {}},
                               created="2026-01-01T00:00:07Z")  # fmt: skip
    profile = training_doc(role="baseline", strategy="fsdp", tps=None, step=None, mem=None,
                           workload={**WORKLOAD, "profiled_run_id": docs["fsdp"].run_id},
                           created="2026-01-01T00:00:08Z")  # fmt: skip
    for d in (calibration, profile):
        contract.write_result(d, tmp_path)
    out = decide(tmp_path, project="PAR-TRAINING-STATE", command="x")
    dec = out.doc.decision
    assert dec is not None and dec.chosen == docs["fsdp"].run_id
    rejected = {r["candidate"] for r in dec.rejected}
    assert calibration.run_id not in rejected and profile.run_id not in rejected
    assert any(
        n.startswith("not runs, left out: 2 probe document(s)") and calibration.run_id in n
        for n in out.doc.notes
    )


def test_step_times_do_not_split_runs_and_a_close_call_is_noted(tmp_path: Path) -> None:
    """Runs keep every step (workload.step_times): those differ from run to run without
    changing the job, so they never make runs incomparable; when the chosen run leads by less
    than its steps' own spread, the decision says so -- and not when the lead is clear."""
    steady = [0.70, 0.71, 0.71, 0.72, 0.71]
    noisy = [0.60, 0.80, 0.70, 0.90, 0.72]  # quartiles 0.65, 0.85 (0.20 s) over median 0.72 s
    a = training_doc(
        role="baseline", strategy="ddp", tps=45_000, step=0.72, mem=[60e9, 60e9],
        workload={**WORKLOAD, "step_times": noisy, "phase_times": {"host": {"data": [0.1]}}},
        created="2026-01-01T00:00:01Z",
    )  # fmt: skip
    b = training_doc(
        role="candidate", strategy="fsdp", tps=46_000, step=0.71, mem=[40e9, 40e9],
        workload={**WORKLOAD, "step_times": steady, "phase_times": {"host": {"data": [0.2]}}},
        created="2026-01-01T00:00:02Z",
    )  # fmt: skip
    for d in (a, b):
        contract.write_result(d, tmp_path)
    out = decide(tmp_path, project="PAR-TRAINING-STATE", command="x", write=False)
    assert out.doc.decision is not None and out.doc.decision.chosen == b.run_id
    assert not out.incomparable and set(out.compared) == {a.run_id, b.run_id}
    close = [n for n in out.doc.notes if n.startswith("close call")]
    assert len(close) == 1 and "2.2 %" in close[0] and "27.8 %" in close[0]
    assert "step_times" not in out.doc.workload and "phase_times" not in out.doc.workload
    # a clear lead (30 %) over the same spread: no note
    c = training_doc(
        role="candidate", strategy="zero1", tps=60_000, step=0.55, mem=[50e9, 50e9],
        workload={**WORKLOAD, "step_times": steady}, created="2026-01-01T00:00:03Z",
    )  # fmt: skip
    contract.write_result(c, tmp_path)
    out = decide(tmp_path, project="PAR-TRAINING-STATE", command="x", write=False)
    assert out.doc.decision is not None and out.doc.decision.chosen == c.run_id
    assert not [n for n in out.doc.notes if n.startswith("close call")]


def test_environment_differences_are_stated(tmp_path: Path) -> None:
    make_project(tmp_path)
    env = json.loads(json.dumps(ENV_GPU))
    env["software"]["torch"] = "2.10"
    odd = training_doc(
        role="candidate",
        strategy="fsdp2",
        tps=1,
        step=9,
        mem=[1e9, 1e9],
        env=env,
        created="2026-01-01T00:00:07Z",
    )
    contract.write_result(odd, tmp_path)
    out = decide(tmp_path, project="PAR-TRAINING-STATE", command="x")
    assert any("environment.software.torch: 2.11 vs 2.10" in n for n in out.doc.notes)


def test_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        decide(tmp_path / "nope", command="x")
    make_project(tmp_path)
    with pytest.raises(ValueError, match="unknown project"):
        decide(tmp_path, project="PAR-NOPE", command="x")
    with pytest.raises(ValueError, match="no baseline, candidate or failure"):
        decide(tmp_path, project="PAR-MOE-EXPERT", command="x")
    with pytest.raises(ValueError, match="not found"):
        decide(tmp_path, project="PAR-TRAINING-STATE", run_ids=["nope"], command="x")


def run_cli(args: list[str]) -> int:
    from parlab.cli import main

    with pytest.raises(SystemExit) as info:
        main(args)
    return int(info.value.code or 0)


def test_cli_decide_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = make_project(tmp_path)
    assert run_cli(["decide", str(tmp_path), "--project", "PAR-TRAINING-STATE"]) == 0
    out = capsys.readouterr().out
    assert f"chosen: {docs['fsdp'].run_id}" in out and "oom" in out
    [path] = (tmp_path / "PAR-TRAINING-STATE").glob("decide-*.json")
    assert contract.read_document(path).role == "decision"
    assert run_cli(["decide", str(tmp_path), "--json", "--memory-budget", "45GB"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["decision"]["chosen"] == docs["fsdp"].run_id
    assert run_cli(["report", str(tmp_path), "--out", str(tmp_path / "rep")]) == 0
    assert "HTML:" in capsys.readouterr().out
    assert (tmp_path / "rep" / "report.html").is_file()


def test_cli_decide_bad_input_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = make_project(tmp_path)
    other = training_doc(
        role="candidate",
        strategy="fsdp",
        tps=1.0,
        step=1.0,
        mem=[1e9, 1e9],
        workload={**WORKLOAD, "seq": 2048},
    )
    contract.write_result(other, tmp_path)
    before = sorted(tmp_path.rglob("*.json"))
    for args, fragment in (
        (
            [
                "--project",
                "PAR-TRAINING-STATE",
                "--run-id",
                docs["ddp"].run_id,
                "--run-id",
                other.run_id,
            ],
            "workload.seq: ",
        ),
        (["--project", "PAR-NOPE"], "unknown project"),
        (["--memory-budget", "lots"], "cannot parse size"),
    ):
        assert run_cli(["decide", str(tmp_path), *args]) == 2
        err = capsys.readouterr().err.strip()
        assert fragment in err and len(err.splitlines()) == 1, err
    assert run_cli(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert sorted(tmp_path.rglob("*.json")) == before
