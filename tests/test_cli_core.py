"""The core commands as a user runs them: env, results, demo's failure path, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema_rs
import pytest

from parlab import contract
from parlab.cli import main


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(args)
    return int(info.value.code or 0)


def test_env_without_gpus_succeeds_and_writes_a_valid_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(["env", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "GPUs: none found" in out
    assert "sanity all-reduce over 2 gloo ranks: correct (0 wrong values)" in out
    [path] = (tmp_path / "PAR-ENV").glob("*.json")
    data = json.loads(path.read_text())
    jsonschema_rs.validate(contract.schema(), data)
    assert data["evidence_level"] == "env-precheck"
    assert data["metrics"]["sanity_allreduce_ok"]["value"] == 1.0
    assert data["environment"]["hardware"]["gpu_count"] == 0
    assert data["command"] == f"parlab env --results {tmp_path}"  # what reproduces it


def test_results_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.test_contract import make_doc

    doc = make_doc()
    contract.write_result(doc, tmp_path)
    (tmp_path / "PAR-COLLECTIVES" / "junk.json").write_text("{")
    (tmp_path / "outside.json").write_text("{")  # not in a project folder: not read
    assert run_cli(["results", str(tmp_path)]) == 0  # the summary, one row per project
    captured = capsys.readouterr()
    row = next(ln for ln in captured.out.splitlines() if "PAR-COLLECTIVES" in ln)
    assert "│         1 │ baseline 1" in row and "--all" in captured.out
    assert "skipped" in captured.err and "junk.json" in captured.err
    assert "outside.json" not in captured.err
    assert run_cli(["results", str(tmp_path), "--all"]) == 0  # every row
    assert "busbw_peak = 1.5 GB/s" in capsys.readouterr().out
    assert run_cli(["results", str(tmp_path), "--json", "--role", "baseline"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["run_id"] for d in data["documents"]] == [doc.run_id]
    assert data["skipped"][0]["path"].endswith("junk.json")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["results", "/nonexistent/folder"], "does not exist"),
        (["results", ".", "--role", "winner"], "'winner' is not one of"),
        (["env", "--nproc", "0"], "--nproc': 0 is out of range"),
        (["no-such-command"], "No such command"),
        (["env", "--no-such-option"], "No such option"),
        (["env", "--results", "./file.txt"], "is a file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], fragment: str
) -> None:
    (tmp_path / "file.txt").write_text("not a folder")
    args = [a if a != "." else str(tmp_path) for a in args]
    args = [str(tmp_path / "file.txt") if a == "./file.txt" else a for a in args]
    assert run_cli(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("parlab: error:") and fragment in err
    assert len(err.splitlines()) == 1
    assert not list(tmp_path.rglob("*.json"))


def test_module_entry_point_runs_from_the_source_tree() -> None:
    src = Path(__file__).parents[1] / "src"
    res = subprocess.run(
        [sys.executable, "-m", "parlab", "--help"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert res.returncode == 0 and "results" in res.stdout
