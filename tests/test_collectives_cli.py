"""``parlab collectives`` as a user runs it: sweep through torchrun, fit, Ctrl-C, bad input."""

from __future__ import annotations

import _thread
import json
import signal
from pathlib import Path

import jsonschema_rs
import pytest

from parlab import contract
from parlab.cli import main
from parlab.comm.calibration import load_calibration
from parlab.comm.sweep import SweepSpec, run_sweep, write_sweep


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(args)
    return int(info.value.code or 0)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real 2-rank gloo sweep through torchrun, shared by the tests below."""
    root = tmp_path_factory.mktemp("sweep")
    ops = "all_reduce,all_gather,all_to_all_uneven,send_recv,barrier"
    args = ["-b", "8", "-e", "64KiB", "-f", "4", "-w", "1", "-n", "4", "--op", ops]
    code = run_cli(["collectives", *args, "--nproc", "2", "--results", str(root)])
    assert code == 0
    return root


def test_sweep_writes_a_valid_document_table_and_plot(
    sweep_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    [path] = [p for p in (sweep_dir / "PAR-COLLECTIVES").glob("collectives-2*.json")]
    data = json.loads(path.read_text())
    jsonschema_rs.validate(contract.schema(), data)
    assert (data["project"], data["task"], data["evidence_level"]) == (
        "PAR-COLLECTIVES",
        "T1",
        "cpu-mechanism",
    )
    rows = data["workload"]["measurements"]
    assert {r["op"] for r in rows} == {
        "all_reduce",
        "all_gather",
        "all_to_all_uneven",
        "send_recv",
        "barrier",
    }
    assert [r["size"] for r in rows if r["op"] == "all_reduce"] == [
        8,
        32,
        128,
        512,
        2048,
        8192,
        32768,
    ]
    assert data["metrics"]["wrong_total"]["value"] == 0
    assert data["metrics"]["busbw_peak"]["unit"] == "B/s"
    assert data["metrics"]["all_reduce.busbw_pct_of_link"]["value"] is None  # no link on CPU
    assert any("rounded down" in n for n in data["notes"])  # the uneven all-to-all sizes
    plot = path.parent / data["artifacts"]["busbw_plot"]
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert data["command"].startswith("parlab ")


def test_fit_writes_a_calibration_the_planner_loads(
    sweep_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    [sweep] = (sweep_dir / "PAR-COLLECTIVES").glob("collectives-2*.json")
    out = sweep_dir / "cal"
    assert run_cli(["collectives", "--fit", str(sweep), "--results", str(out)]) == 0
    assert "alpha-beta fit" in capsys.readouterr().out
    cal = load_calibration(out)
    assert cal.source_run_id == sweep.stem
    assert set(cal.ops) == {"all_reduce", "all_gather", "all_to_all_uneven", "send_recv", "barrier"}
    ar = cal.ops["all_reduce"]
    assert ar.group_size == 2 and ar.points == 7 and ar.alpha_s >= 0
    assert cal.predict("all_reduce", 1 << 20) >= cal.predict("all_reduce", 8) > 0
    assert cal.predict("reduce_scatter", 1024) is None  # not measured, not guessed
    [path] = (out / "PAR-COLLECTIVES").glob("*.json")
    jsonschema_rs.validate(contract.schema(), json.loads(path.read_text()))
    assert load_calibration(path).run_id == cal.run_id
    # a folder: its newest sweep
    assert run_cli(["collectives", "--fit", str(sweep_dir), "--results", str(out / "2")]) == 0
    assert load_calibration(out / "2").source_run_id == sweep.stem
    # a sweep document is not a calibration
    with pytest.raises(ValueError, match="not a collectives calibration"):
        load_calibration(sweep)


def test_ctrl_c_keeps_what_was_measured(tmp_path: Path) -> None:
    # interrupt_main does nothing unless Python's own SIGINT handler is installed: in the whole
    # suite an earlier test may have left another (the interrupt was lost in two full local runs)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    spec = SweepSpec(
        ops=("all_reduce", "all_gather", "broadcast"),
        minbytes=8,
        # the large sizes leave seconds of work after the second record, so the interrupt
        # (the follower polls every 0.1 s) lands mid-sweep even on a fast machine; at 1 MiB x 3
        # iterations the whole sweep could finish first, and at 16 MiB it did once on a busy machine
        maxbytes=1 << 26,
        warmup=1,
        iters=20,
        nproc=2,
        backend="gloo",
    )
    seen: list[dict] = []

    def on_record(rec: dict) -> None:
        seen.append(rec)
        if len(seen) == 2:
            _thread.interrupt_main()  # what Ctrl-C does to the main thread

    try:
        outcome = run_sweep(spec, command="parlab collectives (test)", on_record=on_record)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert outcome.interrupted
    assert 2 <= len(outcome.records) < len(spec.plan())
    doc = outcome.doc
    assert doc.status == "ok" and doc.workload["partial"] is True
    assert any(n.startswith("partial: interrupted") for n in doc.notes)
    path = write_sweep(doc, tmp_path)
    jsonschema_rs.validate(contract.schema(), json.loads(path.read_text()))


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["-b", "1M", "-e", "8"], "size range inverted"),
        (["-b", "8", "-e", "lots"], "cannot parse -e 'lots'"),
        (["-e", "9" * 30], "larger than 9223372036854775807 bytes"),
        (["-d", "fp8_e4m3", "--backend", "gloo"], "not supported by the gloo backend"),
        (["-d", "complex"], "'complex' is not one of"),
        (["-d", "half"], "half is now fp16"),
        (["--nproc", "2", "--mesh", "dp=2,tp=4", "--axis", "tp"], "not the world size 2"),
        (["--nproc", "4", "--mesh", "dp=2,tp=2"], "--mesh needs --axis"),
        (["--nproc", "4", "--mesh", "dp=2,tp=2", "--axis", "pp"], "--axis pp is not in --mesh"),
        (["--mesh", "dp:2", "--axis", "dp"], "cannot parse --mesh"),
        (["--mesh", "dp=²", "--axis", "dp"], "cannot parse --mesh"),
        (["--mesh", "dp=①", "--axis", "dp"], "cannot parse --mesh"),
        (["--graph", "--backend", "gloo"], "--graph"),
        (["--op", "all_reduce,allfoo"], "unknown op"),
        (["-f", "1"], "stepfactor"),
        (["-n", "0"], "'--iters': 0 is out of range"),
        (["--fit", "/nonexistent.json"], "cannot read"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], fragment: str
) -> None:
    assert run_cli(["collectives", *args, "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("parlab: error:") and fragment in err, err
    assert len(err.splitlines()) == 1
    assert not list(tmp_path.rglob("*"))
