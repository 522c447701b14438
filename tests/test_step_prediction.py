"""The step time the lab predicts before a run (``parlab train --roofline``,
``parlab.plan.fit.calibrate.step_prediction``): the GPU's time, the same number
``benchmarks/plan_accuracy.py`` gives the measured run, recorded beside the ledger's
predictions; nothing where the roofline does not describe the run; a clear line for a folder
that is not one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from parlab.cli import app
from parlab.contract import read_document
from parlab.plan.fit.calibrate import step_prediction
from parlab.projects.training_state import TrainConfig, predict_step

RESULTS = Path(__file__).resolve().parents[1] / "results"
STATE = RESULTS / "PAR-TRAINING-STATE"
TABLE = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "plan_accuracy.txt"
_ROW = re.compile(r"^(\S+)\s+(?:GPU|host)\s+(?:phases|probe|none)\s+[\d.]+\s+([\d.]+)\s")


def table_prediction(run_id: str) -> float:
    """The committed accuracy table's prediction column for ``run_id`` (its row names the run's
    first 43 characters)."""
    for line in TABLE.read_text().splitlines():
        m = _ROW.match(line)
        if m and run_id.startswith(m.group(1)):
            return float(m.group(2))
    raise AssertionError(f"{run_id} not in {TABLE}")


@pytest.mark.parametrize(
    "run_id",  # neither calibrates the fit; the table has the first host-bound, the second not
    ["train-fsdp-8b-20261201T113856-61f60a", "train-ddp-1.3b-20261201T091514-238036"],
)
def test_the_prediction_is_the_accuracy_tables(run_id: str) -> None:
    """The committed table's prediction column (three decimals) is this prediction, the GPU's
    time whichever side set the run's step."""
    doc = read_document(STATE / f"{run_id}.json")
    made = step_prediction(doc, RESULTS)
    assert made is not None
    step, how = made
    assert step == pytest.approx(table_prediction(run_id), abs=5e-4)
    assert how.startswith("roofline fitted on") and "host" not in how


def test_a_run_is_predicted_before_it_starts_from_its_configuration() -> None:
    """The 8B at 1 x 512 under FSDP with full recompute on one H200, as its committed run was
    configured: the prediction made from the configuration alone (no metrics) is the one the
    accuracy table gives the measured run."""
    measured = read_document(STATE / "train-fsdp-8b-20261201T113856-61f60a.json")
    cfg = TrainConfig(strategy="fsdp", model="8b", nproc=1, steps=8, warmup=3, micro_batch=1,
                      seq=512, dtype="bf16-compute", recompute="full")  # fmt: skip
    made, note = predict_step(
        cfg, command="t", backend="nccl", environment=measured.environment, root=RESULTS
    )
    expect = table_prediction(measured.run_id)
    assert made is not None and made.unit == "s" and made.value == pytest.approx(expect, abs=5e-4)
    assert made.model.startswith("roofline: ") and f"{expect:.3f} s" in note
    assert made.value < 0.6 * measured.metric("step_time")  # host-bound: the GPU's time is less


def test_cpu_ranks_get_no_prediction_and_say_why(tmp_path: Path) -> None:
    """A gloo run with --roofline: the roofline is fitted on H200 runs, so nothing is
    predicted, and the document says why; the ledger's predictions stay."""
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["train", "--strategy", "ddp", "--model", "tiny", "--nproc", "1",
                                 "--steps", "1", "--warmup", "1", "--seq", "16",
                                 "--roofline", str(RESULTS), "--results", str(out)])  # fmt: skip
    assert r.exit_code == 0, r.output
    (path,) = (out / "PAR-TRAINING-STATE").glob("train-ddp-tiny-*.json")
    doc = read_document(path)
    assert "step_time" not in doc.predictions and "peak_memory" in doc.predictions
    assert any(n.startswith("no step-time prediction") for n in doc.notes)


def test_a_roofline_that_is_not_a_folder_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from parlab.cli import main

    with pytest.raises(SystemExit) as info:
        main(["train", "--strategy", "ddp", "--model", "tiny", "--nproc", "1",
              "--roofline", str(tmp_path / "nowhere"), "--results", str(tmp_path / "out")])  # fmt: skip
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--roofline" in err[0] and "not a folder" in err[0]
    assert not (tmp_path / "out").exists()  # nothing written
