"""``parlab decide``: like with like, the median over repeats, ties inside the spread, the
rejections and their reasons, the one-screen output, bad input.

The documents here are built by hand in the shapes the project runners write
(``layout.knobs``, metrics ``tokens_per_s_per_gpu``, ``step_time``, ``peak_memory`` per rank,
``predictions`` beside them); ``make_project`` is reused by the report tests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest

from parlab import contract
from parlab.contract import Document, Failure, Metric, Prediction
from parlab.plan.compare import configuration, knob_value, workload_key
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
    knobs: dict[str, Any] | None = None,
    step_times: list[float] | None = None,
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
    load = dict(workload if workload is not None else WORKLOAD)
    if step_times is not None:
        load["step_times"] = step_times
    layout: dict[str, Any] = {"world_size": 2, "mesh": {"dp": 2}, "strategy": strategy}
    if knobs is not None:
        layout["knobs"] = knobs
    return Document(
        run_id=contract.new_run_id(f"train-{strategy}"),
        created=created,
        project=project,
        task="T2",
        role=role,
        evidence_level=level,
        command=f"parlab train --strategy {strategy}",
        environment=env if env is not None else ENV_GPU,
        workload=load,
        layout=layout,
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


def decide_here(root: Path, **kw: Any) -> Any:
    """``decide`` on the training project without writing a document."""
    return decide(root, project="PAR-TRAINING-STATE", command="parlab decide x", write=False, **kw)


def write(root: Path, *docs: Document) -> None:
    for d in docs:
        contract.write_result(d, root)


def run(strategy: str, tps: float, *, compile: bool = False, role: str = "candidate",
        steps: list[float] | None = None, **kw: Any) -> Document:  # fmt: skip
    """A real-training run of WORKLOAD with the knobs the training runner records."""
    knobs = {"recompute": "none", "compile": compile, "dtype": "bf16", **kw.pop("knobs", {})}
    return training_doc(role=role, strategy=strategy, tps=tps, step=8 * 4096 / tps / 2,
                        mem=[40e9, 40e9], knobs=knobs, step_times=steps, **kw)  # fmt: skip


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
    assert "failed: oom on rank 1" in reasons[docs["oom"].run_id]["reason"]
    assert reasons[docs["zero1"].run_id]["kind"] == "slower"
    assert "41,000" in reasons[docs["zero1"].run_id]["reason"]
    assert reasons[docs["ddp"].run_id]["kind"] == "slower"
    assert sorted(d.decision.rests_on) == sorted(x.run_id for x in docs.values())
    # one repeat each, no step times: the order is stated as unconfirmed, not hidden
    assert "spread is unknown" in d.decision.reason and "+12.2 %" in d.decision.reason
    assert d.evidence_level == "real-training"
    # prediction errors of each measured candidate: (0.75 - 0.71) / 0.71
    err = d.metrics[f"prediction_error.{docs['fsdp'].run_id}.step_time"]
    assert err.unit == "%" and err.value == pytest.approx(100 * 0.04 / 0.71)
    err = d.metrics[f"prediction_error.{docs['ddp'].run_id}.peak_memory"]
    assert err.value == pytest.approx(100 * (59e9 - 61e9) / 61e9)
    assert d.metrics["chosen.tokens_per_s_per_gpu"].value == 46_000
    assert d.metrics["chosen.repeats"].value == 1
    # written, schema-valid, read back the same
    data = json.loads(out.path.read_text())
    jsonschema_rs.validate(contract.schema(), data)
    assert contract.read_document(out.path).decision == d.decision


def test_decide_rejects_a_configuration_over_the_memory_budget(tmp_path: Path) -> None:
    docs = make_project(tmp_path)
    out = decide_here(tmp_path, memory_budget=45e9)
    dec = out.doc.decision
    assert dec is not None and dec.chosen == docs["fsdp"].run_id  # FSDP alone under 45 GB
    reasons = {r["candidate"]: r for r in dec.rejected}
    assert reasons[docs["zero1"].run_id]["kind"] == "over-memory"
    assert "by 5.00 GB" in reasons[docs["zero1"].run_id]["reason"]
    out = decide_here(tmp_path, memory_budget=30e9)
    assert out.doc.decision is not None and out.doc.decision.chosen is None
    assert out.doc.decision.reason.startswith("no configuration qualifies")


def test_other_workloads_are_named_with_what_differs(tmp_path: Path) -> None:
    docs = make_project(tmp_path)
    other = training_doc(role="candidate", strategy="fsdp", tps=90_000, step=0.3,
                         mem=[10e9, 10e9], workload={**WORKLOAD, "seq": 2048})  # fmt: skip
    cpu = training_doc(role="candidate", strategy="fsdp", tps=95_000, step=0.3,
                       mem=[10e9, 10e9], level="cpu-mechanism")  # fmt: skip
    write(tmp_path, other, cpu)
    out = decide_here(tmp_path)
    dec = out.doc.decision
    assert dec is not None and dec.chosen == docs["fsdp"].run_id
    reasons = {r["candidate"]: r for r in dec.rejected}
    assert reasons[other.run_id]["kind"] == "incomparable"
    assert "another workload" in reasons[other.run_id]["reason"]
    assert "workload.seq: 4096 vs 2048" in reasons[other.run_id]["reason"]
    assert "evidence level: real-training vs cpu-mechanism" in reasons[cpu.run_id]["reason"]
    assert other.run_id not in dec.rests_on and dict(out.incomparable)[other.run_id]
    assert len(out.doc.layout["comparison"]["other_workloads"]) == 2
    # asked for explicitly, runs of two workloads are bad input
    with pytest.raises(
        ValueError, match=r"incomparable.*workload\.seq: (4096 vs 2048|2048 vs 4096)"
    ):
        decide_here(tmp_path, run_ids=[docs["ddp"].run_id, other.run_id])


def test_probe_documents_are_left_out_as_not_runs(tmp_path: Path) -> None:
    """A probe's calibration and a profile of a run sit beside the runs under the project; they
    are not runs to choose from (not even incomparable ones), and the decision says so."""
    docs = make_project(tmp_path)
    calibration = training_doc(role="baseline", strategy="probe", tps=None, step=None, mem=None,
                               workload={"kind": "gemm-shape-calibration", "calibration": {}})  # fmt: skip
    profile = training_doc(role="baseline", strategy="fsdp", tps=None, step=None, mem=None,
                           workload={**WORKLOAD, "profiled_run_id": docs["fsdp"].run_id})  # fmt: skip
    write(tmp_path, calibration, profile)
    out = decide_here(tmp_path)
    dec = out.doc.decision
    assert dec is not None and dec.chosen == docs["fsdp"].run_id
    rejected = {r["candidate"] for r in dec.rejected}
    assert calibration.run_id not in rejected and profile.run_id not in rejected
    assert any(n.startswith("not runs, left out: 2 probe document(s)") and calibration.run_id in n
               for n in out.doc.notes)  # fmt: skip


def test_configuration_and_workload_of_a_document() -> None:
    """Knobs come from the layout (``knobs`` flattened) and the workload's knob keys; the
    workload key drops what a run records of itself and those knobs; a knob recorded only
    later reads as its old meaning."""
    a = run("fsdp", 40_000, knobs={"manual_gc": 50}, steps=[0.1] * 5)
    b = run("fsdp", 41_000, workload={**WORKLOAD, "micro_batch": 4, "losses": [9.0], "seed": 3})
    conf = configuration(b)
    assert conf["strategy"] == "fsdp" and conf["mesh"] == {"dp": 2} and conf["micro_batch"] == 4
    assert "world_size" not in conf and "knobs" not in conf
    assert configuration(a)["manual_gc"] == 50 and "manual_gc" not in conf
    assert workload_key(a) == workload_key(
        b
    )  # step times, losses, seeds, micro-batch: not workload
    assert workload_key(a) != workload_key(run("fsdp", 1.0, workload={**WORKLOAD, "seq": 2048}))
    assert knob_value({}, "compile") is False and knob_value({}, "norm_kernel") == "absent"
    # model-internal runs name themselves (``strategy``): the name is no knob
    mi = Document(**{**a.__dict__, "project": "PAR-MODEL-INTERNAL"})
    assert "strategy" not in configuration(mi)


def test_the_compiled_run_is_not_ranked_against_eager_ones(tmp_path: Path) -> None:
    """The case a user met: a ``--compile``d FSDP run ranked over an eager DDP run as "+24.7 %
    over DDP". Comparing strategies, the compiled run differs in compile too: it is named, not
    ranked; ``--across compile`` ranks it and says so; ``--compare compile`` ranks compile."""
    ddp = run("ddp", 41_000, role="baseline", steps=[0.40, 0.40, 0.41, 0.40, 0.40])
    fsdp = run("fsdp", 45_000, steps=[0.36, 0.36, 0.37, 0.36, 0.36])
    compiled = run("fsdp", 51_000, compile=True, steps=[0.32, 0.32, 0.33, 0.32, 0.32])
    write(tmp_path, ddp, fsdp, compiled)
    out = decide_here(tmp_path)
    dec = out.doc.decision
    assert dec is not None and dec.chosen == fsdp.run_id
    assert "leads ddp by +9.8 %, outside their spread" in dec.reason
    reasons = {r["candidate"]: r for r in dec.rejected}
    assert reasons[compiled.run_id]["kind"] == "incomparable"
    assert "compile (on vs off)" in reasons[compiled.run_id]["reason"]
    assert "--across compile" in reasons[compiled.run_id]["reason"]
    assert compiled.run_id not in dec.rests_on
    across = decide_here(tmp_path, across=["compile"])
    assert across.doc.decision is not None and across.doc.decision.chosen == compiled.run_id
    assert any(n.startswith("ranked across compile") for n in across.doc.notes)
    labels = [c["label"] for c in across.doc.layout["comparison"]["configurations"]]
    assert labels == ["fsdp compile=on", "fsdp compile=off", "ddp compile=off"]
    by_compile = decide_here(tmp_path, compare="compile")
    assert by_compile.doc.decision is not None
    assert by_compile.doc.decision.chosen == compiled.run_id  # fsdp on vs fsdp off
    assert ddp.run_id not in by_compile.doc.decision.rests_on
    # asked for by run id, the pair is bad input that names the fix
    with pytest.raises(ValueError, match=r"differ in compile \((on vs off|off vs on)\) besides strategy: "
                       r"add --across compile"):  # fmt: skip
        decide_here(tmp_path, run_ids=[ddp.run_id, compiled.run_id])


def test_each_configuration_is_the_median_of_its_repeats(tmp_path: Path) -> None:
    """Noisy repeats of one configuration are one candidate: its median, its spread (min-max
    under 4 repeats, IQR from 4), its repeat count; the run chosen is the repeat nearest the
    median, never the luckiest one."""
    fsdp = [run("fsdp", v) for v in (25_000, 46_000, 52_000, 47_000, 44_000)]
    ddp = [run("ddp", v, role="baseline") for v in (30_000, 31_000, 32_000)]
    write(tmp_path, *fsdp, *ddp)
    out = decide_here(tmp_path)
    dec = out.doc.decision
    assert dec is not None and dec.chosen == fsdp[1].run_id  # 46,000: the median
    rows = out.doc.layout["comparison"]["configurations"]
    assert [(r["label"], r["median"], r["repeats"]) for r in rows] == [
        ("fsdp", 46_000, 5), ("ddp", 31_000, 3)
    ]  # fmt: skip
    assert rows[0]["spread"] == {"lo": 34_500.0, "hi": 49_500.0, "kind": "IQR of 5 repeats"}
    assert rows[1]["spread"] == {"lo": 30_000, "hi": 32_000, "kind": "min-max of 3 repeats"}
    assert (
        rows[1]["lead_of_best_pct"] == pytest.approx(100 * 15 / 31) and not rows[1]["inside_spread"]
    )
    assert out.doc.metrics["chosen.tokens_per_s_per_gpu"].value == 46_000
    assert "outside their spread" in dec.reason and "+48.4 %" in dec.reason
    # the other repeats of the chosen configuration are not rejected: the decision rests on them
    assert not {d.run_id for d in fsdp} & {r["candidate"] for r in dec.rejected}
    assert {d.run_id for d in fsdp} <= set(dec.rests_on)


def test_a_lead_inside_the_spread_is_a_tie_not_a_decision(tmp_path: Path) -> None:
    fsdp = [run("fsdp", v) for v in (44_000, 46_000, 48_000)]
    zero3 = [run("zero3", v) for v in (43_000, 44_500, 47_000)]
    write(tmp_path, *fsdp, *zero3)
    out = decide_here(tmp_path)
    dec = out.doc.decision
    assert dec is not None and dec.chosen is None
    assert dec.reason.startswith("tie: the lead of fsdp over zero3, +3.4 %, is inside their spread")
    assert "not a decision" in dec.reason
    kinds = {r["candidate"]: r["kind"] for r in dec.rejected}
    assert {kinds[d.run_id] for d in fsdp + zero3} == {"tie"}
    assert out.doc.layout["comparison"]["verdict"] == "tie"
    assert "chosen.tokens_per_s_per_gpu" not in out.doc.metrics


def test_one_repeat_takes_its_spread_from_its_steps(tmp_path: Path) -> None:
    """A single run keeps every step (workload.step_times): their interquartile range is its
    spread, so a lead smaller than the step-to-step noise is a tie, a clear one a choice."""
    noisy = [0.60, 0.80, 0.70, 0.90, 0.72]  # quartiles 0.65 and 0.85 around the median 0.72
    steady = [0.70, 0.71, 0.71, 0.72, 0.71]
    a = run("ddp", 45_000, role="baseline", steps=noisy,
            workload={**WORKLOAD, "phase_times": {"host": {"data": [0.1]}}})  # fmt: skip
    b = run("fsdp", 46_000, steps=steady)
    write(tmp_path, a, b)
    out = decide_here(tmp_path)
    assert not out.incomparable and set(out.compared) == {a.run_id, b.run_id}
    dec = out.doc.decision
    assert dec is not None and dec.chosen is None and "inside their spread" in dec.reason
    rows = out.doc.layout["comparison"]["configurations"]
    assert rows[1]["spread"]["kind"] == "IQR of 5 steps"
    assert rows[1]["spread"]["lo"] == pytest.approx(45_000 * 0.72 / 0.85)
    assert "step_times" not in out.doc.workload and "phase_times" not in out.doc.workload
    c = run("zero1", 60_000, steps=steady)
    write(tmp_path, c)
    out = decide_here(tmp_path)
    assert out.doc.decision is not None and out.doc.decision.chosen == c.run_id
    assert "outside their spread" in out.doc.decision.reason


def test_environment_differences_are_stated(tmp_path: Path) -> None:
    make_project(tmp_path)
    env = json.loads(json.dumps(ENV_GPU))
    env["software"]["torch"] = "2.10"
    odd = training_doc(role="candidate", strategy="fsdp2", tps=1, step=9, mem=[1e9, 1e9], env=env)
    write(tmp_path, odd)
    out = decide_here(tmp_path)
    assert any("environment.software.torch: 2.11 vs 2.10" in n for n in out.doc.notes)


def test_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        decide(tmp_path / "nope", command="x")
    docs = make_project(tmp_path)
    with pytest.raises(ValueError, match="unknown project"):
        decide(tmp_path, project="PAR-NOPE", command="x")
    with pytest.raises(ValueError, match="no baseline, candidate or failure"):
        decide(tmp_path, project="PAR-MOE-EXPERT", command="x")
    with pytest.raises(ValueError, match="--run-id nope not found"):
        decide_here(tmp_path, run_ids=["nope"])
    with pytest.raises(ValueError, match="--baseline nope not found"):
        decide_here(tmp_path, baseline="nope")
    with pytest.raises(ValueError, match=r"unknown --compare knob 'colour'.*use one of .*strategy"):
        decide_here(tmp_path, compare="colour")
    with pytest.raises(ValueError, match=r"unknown --across knob 'shape'"):
        decide_here(tmp_path, across=["mesh", "shape"])
    flat = tmp_path / "PAR-TRAINING-STATE"
    with pytest.raises(ValueError, match=rf"holds no project folder.*\(e\.g\. {tmp_path}\)"):
        decide(flat, command="x")
    # the baseline's project needs no --project
    out = decide(tmp_path, baseline=docs["ddp"].run_id, command="x", write=False)
    assert out.doc.project == "PAR-TRAINING-STATE"


def run_cli(args: list[str]) -> int:
    from parlab.cli import main

    with pytest.raises(SystemExit) as info:
        main(args)
    return int(info.value.code or 0)


def test_cli_decide_fits_one_screen_and_details_go_further(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = make_project(tmp_path)
    for i in range(12):  # configurations that differ in more than the strategy
        write(tmp_path, run("fsdp", 40_000 + i, knobs={"bucket_mb": float(i)}))
    for i in range(3):  # another workload
        write(tmp_path, run("ddp", 9_000.0, workload={**WORKLOAD, "seq": 1024 * (i + 1)}))
    assert run_cli(["decide", str(tmp_path), "--project", "PAR-TRAINING-STATE"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) <= 25, out
    assert f"chosen run: {docs['fsdp'].run_id}" in out and "rejected: 1 oom" in out
    assert "left out, other knobs differ: 12 configuration(s), 12 run(s): bucket_mb 12" in out
    assert "left out, other workloads: 3 workload(s), 3 run(s)" in out
    [path] = (tmp_path / "PAR-TRAINING-STATE").glob("decide-*.json")
    doc = contract.read_document(path)
    assert len(doc.layout["comparison"]["left_out"]) == 12  # the document carries everything
    assert run_cli(["decide", str(tmp_path), "--project", "PAR-TRAINING-STATE", "--details",
                    "--out", str(tmp_path / "elsewhere")]) == 0  # fmt: skip
    detailed = capsys.readouterr().out
    assert len(detailed.splitlines()) > len(lines) and "bucket_mb (11.0 vs absent)" in detailed
    assert "prediction error, (predicted - measured) / measured:" in detailed
    assert len(list((tmp_path / "elsewhere").rglob("decide-*.json"))) == 1
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
    other = training_doc(role="candidate", strategy="fsdp", tps=1.0, step=1.0, mem=[1e9, 1e9],
                         workload={**WORKLOAD, "seq": 2048})  # fmt: skip
    write(tmp_path, other)
    before = sorted(tmp_path.rglob("*.json"))
    ts = "PAR-TRAINING-STATE"
    for args, fragment in (
        (["--project", ts, "--run-id", docs["ddp"].run_id, "--run-id", other.run_id],
         "workload.seq: "),
        (["--project", "PAR-NOPE"], "unknown project"),
        (["--memory-budget", "lots"], "cannot parse size"),
        (["--project", ts, "--compare", "colour"], "unknown --compare knob 'colour'"),
        (["--project", ts, "--across", "mesh,shape"], "unknown --across knob 'shape'"),
        (["--compare", "colour"], "no project records colour"),
        (["--run-id", "nope"], "run id(s) nope not found"),
    ):  # fmt: skip
        assert run_cli(["decide", str(tmp_path), *args]) == 2
        err = capsys.readouterr().err.strip()
        assert fragment in err and len(err.splitlines()) == 1, err
    assert run_cli(["decide", str(tmp_path / ts)]) == 2
    assert "holds no project folder" in capsys.readouterr().err
    assert run_cli(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert sorted(tmp_path.rglob("*.json")) == before
