"""The small-message all_reduce probe (benchmarks/collectives_small_probe.py) on 2 gloo ranks.

Checks the table's shape and values, not speeds: every eager variant ran, its all_reduce
result matched the exact sum on every rank, its times are positive and finite, and every
GPU-only variant is listed as skipped with a reason.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from parlab.runtime.testing import run_ranks

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "collectives_small_probe.py"
_spec = importlib.util.spec_from_file_location("collectives_small_probe", _PATH)
assert _spec is not None and _spec.loader is not None
probe = importlib.util.module_from_spec(_spec)
sys.modules["collectives_small_probe"] = probe
_spec.loader.exec_module(probe)

SIZES = [8, 1024]


def _small_probe(ctx, out_path: str) -> dict:
    probe.SAMPLES, probe.OPS_PER_SAMPLE, probe.WARMUP = 3, 4, 2
    return probe.probe_rank(ctx, sizes=SIZES, out_path=out_path, tag="test")


@pytest.mark.timeout(60)
def test_probe_table_on_gloo(tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    tables = run_ranks(_small_probe, 2, str(out), timeout=50)
    assert len(tables) == 2
    assert tables[0]["rows"] == tables[1]["rows"]  # the slowest rank's figures, on every rank
    table = tables[0]
    assert table["evidence"] == "cpu-mechanism"
    assert table["environment"]["backend"] == "gloo"
    rows = table["rows"]
    assert [(r["variant"], r["bytes"]) for r in rows] == [
        (v.name, b) for v in probe.VARIANTS for b in SIZES
    ]
    for r in rows:
        v = next(v for v in probe.VARIANTS if v.name == r["variant"])
        if v.gpu_only:
            assert r["skipped"] and "CUDA" in r["skipped"]
            assert r["median_us"] is None
            continue
        assert r["error"] is None, r
        assert r["skipped"] is None
        assert r["wrong_ranks"] == 0 and r["checked"]
        assert r["samples"] == 3
        assert 0 < r["min_us"] <= r["median_us"] < 1e6
        assert math.isfinite(r["median_us"])
        assert 0 < r["issue_us"] <= r["wall_us"] < 1e6
    eager = {r["variant"] for r in rows if r["median_us"] is not None}
    assert eager == {v.name for v in probe.VARIANTS if not v.gpu_only}
    # rank 0 wrote the same table as JSON
    assert json.loads(out.read_text())["rows"] == rows
    assert any("fastest" in line for line in probe.summary(table))


def test_expected_sum_and_variant_names() -> None:
    assert probe._expected(2, 1) == 3.0
    assert probe._expected(2, 100) == 3.0 * 2.0**99
    assert probe._expected(4, 100) is None  # beyond fp32: not checkable
    names = [v.name for v in probe.VARIANTS]
    assert len(names) == len(set(names))
    assert {v.graph_ops for v in probe.VARIANTS if v.name.startswith("graph_dist")} == {1, 20, 100}
    assert all(v.gpu_only for v in probe.VARIANTS if v.graph_ops)
