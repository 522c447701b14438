"""The small-message all_reduce probe (benchmarks/collectives_small_probe.py) on 2 gloo ranks.

Run as a user runs it (the script launches its own torchrun); checks the table's shape and
values, not speeds: every eager variant ran, its all_reduce result matched the exact sum on
every rank, its times are positive and finite, and every GPU-only variant is listed as
skipped with a reason.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.scripts import run_script

SIZES = [8, 1024]


@pytest.mark.timeout(120)
def test_probe_table_on_gloo(tmp_path: Path) -> None:
    sizes = ",".join(map(str, SIZES))
    quick = ["--samples", "3", "--ops-per-sample", "4", "--warmup", "2"]
    args = ["--out", str(tmp_path), "--tag", "test", "--sizes", sizes, "--nproc", "2", *quick]
    done = run_script("collectives_small_probe.py", *args, timeout=110)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    table = json.loads((tmp_path / "collectives_small_probe-test.json").read_text())
    assert table["evidence"] == "cpu-mechanism"
    assert table["environment"]["backend"] == "gloo"
    rows = table["rows"]
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    assert [(r["variant"], r["bytes"]) for r in rows] == [(v, b) for v in variants for b in SIZES]
    assert {"dist", "funcol", "nccl_direct", "graph_dist_N1", "graph_dist_N100"} <= set(variants)
    eager = set()
    for r in rows:
        if r["skipped"]:  # GPU-only: CUDA graphs, NCCL called directly
            assert "CUDA" in r["skipped"] and r["median_us"] is None
            continue
        assert r["graph_ops"] == 0 and r["variant"] != "nccl_direct"
        assert r["error"] is None, r
        assert r["wrong_ranks"] == 0 and r["checked"]
        assert r["samples"] == 3
        assert 0 < r["min_us"] <= r["median_us"] < 1e6
        assert math.isfinite(r["median_us"])
        assert 0 < r["issue_us"] <= r["wall_us"] < 1e6
        eager.add(r["variant"])
    assert {"dist", "dist_async", "pg_wait", "funcol"} <= eager
    assert {r["graph_ops"] for r in rows if r["variant"].startswith("graph_dist")} == {1, 20, 100}
    assert "summary:" in done.stdout and "fastest" in done.stdout
    assert f"table written to {tmp_path}" in done.stdout
