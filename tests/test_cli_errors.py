"""Exit statuses as docs/cli.md gives them: bad input is one line and status 2, before anything
runs; an internal error is one line naming what failed and in which file, status 3."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from parlab import contract
from parlab.cli import main
from parlab.contract import Metric, Prediction
from tests.test_contract import make_doc

HUGE = "9" * 40


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(args)
    return int(info.value.code or 0)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["train", "--strategy", "ddp", "--timeout", "nan"], "finite number of seconds"),
        (["train", "--strategy", "ddp", "--timeout", "inf"], "finite number of seconds"),
        (["collectives", "--timeout", "-inf"], "finite number of seconds"),
        (["train", "--strategy", "ddp", "--memory-cap", HUGE], "larger than"),
        (["train", "--strategy", "ddp", "--memory-cap", "1e999"], "cannot parse --memory-cap"),
        (["collectives", "-e", HUGE + "G"], "larger than"),
        (["decide", ".", "--memory-budget", HUGE + "GiB"], "larger than"),
        (["train", "--strategy", "ddp", "--nproc", "²"], "not a whole number"),
        (["train", "--strategy", "ddp", "--nproc", "①"], "not a whole number"),
        (["collectives", "--explain", "tiny", "--layout", "dp=①"], "cannot parse --layout"),
        (["train", "--strategy", "ddp", "--nproc", HUGE], "out of range"),
        (["serve", "replica", "--port", "70000"], "0 to 65535"),
        (["serve", "router", "--replica", "http://127.0.0.1:1", "--port", "-1"], "not a whole"),
        (["project", "moe", "--capacity-factor", "nan"], "finite number"),
        (["bench", "serve", "--goodput", "ttft:abc"], "--goodput"),
        (["bench", "serve", "--percentiles", "101"], "(0, 100]"),
    ],
)
def test_bad_input_is_one_line_and_status_2_before_anything_runs(
    args: list[str], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [str(tmp_path) if a == "." else a for a in args]
    t0 = time.perf_counter()
    assert run_cli(args) == 2
    assert time.perf_counter() - t0 < 5  # refused, not launched
    err = capsys.readouterr().err.strip()
    assert err.startswith("parlab: error:") and fragment in err, err
    assert len(err.splitlines()) == 1


def test_report_out_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    contract.write_result(make_doc(), tmp_path)
    (tmp_path / "a-file").write_text("x")
    assert run_cli(["report", str(tmp_path), "--out", str(tmp_path / "a-file")]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a file: give a folder" in err and len(err.splitlines()) == 1


def test_a_busy_port_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert run_cli(["serve", "replica", "--engine", "trivial", "--port", str(port),
                        "--duration", "1"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert "pick another --port (0: a free one)" in err and len(err.splitlines()) == 1


def test_an_internal_error_names_what_failed_and_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A valid document holding 1e308: the decision's prediction error overflows to inf, which
    JSON cannot hold. Not bad input (status 3), and the message says which file and field."""
    for i, v in enumerate((1e308, 2.0)):
        contract.write_result(
            make_doc(
                project="PAR-TRAINING-STATE", task="T2", evidence_level="real-training",
                role="candidate" if i else "baseline",
                layout={"world_size": 2, "mesh": {"dp": 2}, "strategy": "ddp"},
                metrics={"tokens_per_s_per_gpu": Metric(value=v, unit="tokens/s"),
                         "step_time": Metric(value=1e-308 if i == 0 else 1.0, unit="s")},
                predictions={"step_time": Prediction(value=1e308, unit="s", model="x")},
            ),
            tmp_path,
        )  # fmt: skip
    code = run_cli(["decide", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 3, err
    assert err.startswith("parlab: internal error:") and len(err.splitlines()) == 1
    assert "cannot write" in err and "is not a finite number" in err
    assert "parlab/contract/write.py" in err and "PARLAB_DEBUG=1" in err


@pytest.mark.parametrize(
    "args",
    [["train", "--strategy", "ddp"], ["collectives"], ["env"], ["fit", "tiny"]],
)
def test_a_results_path_that_is_a_file_is_refused_before_anything_runs(
    args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "f").write_text("x")
    t0 = time.perf_counter()
    assert run_cli([*args, "--results", str(tmp_path / "f")]) == 2
    assert time.perf_counter() - t0 < 3  # nothing launched
    assert "is a file" in capsys.readouterr().err
