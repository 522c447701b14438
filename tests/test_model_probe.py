"""The reference model's eager probe (benchmarks/model_eager_probe.py) at tiny size on the CPU.

Run as a user runs it: every equivalent implementation the probe times passes its own
equality gate (output and every gradient against the reference model's, in fp32 and bf16),
the gate refuses, and does not time, alternatives known to be wrong (``--check-gate``: one
off in the output, one off only in a gradient, one that raises), the table has the expected
rows, and bad input is refused. No speeds are asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.scripts import run_script

EXPECTED = {
    ("part", "norm", "current"),
    ("part", "norm", "F.rms_norm(weight)"),
    ("part", "norm", "F.rms_norm * weight"),
    ("part", "rope", "current"),
    ("part", "rope", "complex (cached freqs_cis)"),
    ("part", "rope", "cached cos/sin [S,1,D]"),
    ("part", "rope_table", "current (forward only, once per step)"),
    ("part", "attention", "current"),
    ("part", "attention", "contiguous q/k/v"),
    ("part", "mlp", "current"),
    ("part", "mlp", "fused w13"),
    ("part", "loss", "current"),
    ("part", "loss", "no fp32 upcast"),
    ("block", "block", "current"),
    ("block", "block", "all equivalent swaps"),
    ("model", "model", "current"),
    ("model", "model", "all equivalent swaps"),
}
TINY = ["--device", "cpu", "--tiny", "--seq", "8", "--batch", "2", "--iters", "1", "--warmup", "0"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "args",
    [["--dtype", "fp32", "--check-gate"], ["--dtype", "bf16", "--gqa-kv-heads", "2"]],
    ids=["fp32-gate", "bf16-gqa"],
)
def test_probe_rows_all_equal_and_timed(args: list[str], tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    done = run_script("model_eager_probe.py", *TINY, *args, "--json", str(out))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    doc = json.loads(out.read_text())
    rows, tol = doc["rows"], doc["tolerance"]
    keys = {(r["scope"], r["part"], r["variant"]) for r in rows}
    assert keys >= EXPECTED
    if "--gqa-kv-heads" in args:
        assert ("part", "attention", "enable_gqa=True") in keys
    for r in rows:
        if r["scope"] == "gate" or r["status"].startswith("unsupported"):
            assert r["scope"] == "gate" or "CUDA" in r["status"]  # only GPU-only are skipped
            continue
        assert r["status"] == "timed", (r["part"], r["variant"], r["status"])
        assert r["ms"] is not None and r["ms"] > 0
        assert r["err_out"] is not None and r["err_out"] <= tol
        assert r["err_grad"] is not None and r["err_grad"] <= tol
    model_rows = [r for r in rows if r["scope"] == "model"]
    assert all(r["extra"]["tokens_per_s"] > 0 and r["extra"]["mfu"] is None for r in model_rows)
    assert done.stdout.startswith("python ") and "torch " + torch.__version__ in done.stdout
    assert "cpu-mechanism" in done.stdout and "F.rms_norm(weight)" in done.stdout
    if "--check-gate" in args:
        by = {r["variant"]: r for r in rows if r["scope"] == "gate"}
        assert by["current"]["status"] == "timed" and by["current"]["ms"] is not None
        off = by["off output"]
        assert off["status"].startswith("NOT EQUAL") and off["ms"] is None and off["err_out"] > 1e-3
        grad = by["off gradient"]
        assert grad["status"].startswith("NOT EQUAL") and grad["ms"] is None
        assert grad["err_out"] <= 1e-6 and grad["err_grad"] > 1e-3
        assert by["raises"]["status"].startswith("failed:") and by["raises"]["ms"] is None


def test_main_skips_the_model_on_request_and_refuses_bad_models(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    done = run_script("model_eager_probe.py", *TINY, "--no-model", "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    assert not any(r["scope"] == "model" for r in json.loads(out.read_text())["rows"])
    bad = run_script("model_eager_probe.py", "--model", "gpt2-124m", "--device", "cpu")
    assert bad.returncode == 2 and "Llama-style" in bad.stderr
