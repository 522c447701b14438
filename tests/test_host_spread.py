"""benchmarks/host_spread.py: runs grouped by configuration, diagnostics kept as .json.log read
alike, each run's step and host time, the spread slowest over fastest."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
_spec = importlib.util.spec_from_file_location("host_spread", _DIR / "host_spread.py")
assert _spec is not None and _spec.loader is not None
spread = importlib.util.module_from_spec(_spec)
sys.modules["host_spread"] = spread
_spec.loader.exec_module(spread)


def _doc(created: str, seq: int, step: float, host: list[float]) -> dict:
    phases = {"data": [host[0]], "forward": [host[1]], "backward": [host[2]]}
    return {
        "run_id": f"train-ddp-1.3b-{created}",
        "created": created,
        "workload": {
            "model": "1.3b",
            "micro_batch": 1,
            "seq": seq,
            "phase_times": {"host": phases},
        },
        "layout": {"strategy": "ddp", "world_size": 1, "knobs": {"recompute": "none"}},
        "metrics": {"step_time": {"value": step, "unit": "s"}},
    }


def test_groups_reads_logs_and_reports_spread(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (tmp_path / "a.json").write_text(
        json.dumps(_doc("2026-01-01T00:00:02Z", 512, 0.090, [0.001, 0.03, 0.06]))
    )
    (tmp_path / "b.json").write_text(
        json.dumps(_doc("2026-01-01T00:00:01Z", 512, 0.060, [0.001, 0.02, 0.04]))
    )
    (logs / "c.json.log").write_text(
        json.dumps(_doc("2026-01-01T00:00:03Z", 32, 0.070, [0.001, 0.02, 0.05]))
    )
    (logs / "notes.txt").write_text("not a document")
    assert spread.main([str(tmp_path / "a.json"), str(tmp_path / "b.json"), str(logs)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("ddp")]
    assert len(rows) == 2
    full, short = rows
    assert "1x512" in full and "60.0, 90.0" in full and "50%" in full and "61.0, 91.0" in full
    assert "1x32" in short and " 1 " in short and "0%" in short and "71.0" in short
    assert full.rstrip().endswith("-, -")  # neither run made a host probe


def test_a_runs_host_probe_is_shown(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    doc = _doc("2026-01-01T00:00:01Z", 512, 0.090, [0.001, 0.03, 0.06])
    doc["workload"]["host_probe"] = {"tokens": 32, "step_s": 0.0307}
    (tmp_path / "a.json").write_text(json.dumps(doc))
    assert spread.main([str(tmp_path)]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("ddp"))
    assert row.rstrip().endswith("30.7")


def test_no_arguments_is_a_usage_error() -> None:
    assert spread.main([]) == 2
