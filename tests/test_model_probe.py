"""The reference model's eager probe (benchmarks/model_eager_probe.py) at tiny size on the CPU.

Checks that every equivalent implementation the probe times really equals the reference
model's (in float64, tight), that the probe's own equality gate passes for each of them in
fp32 and bf16, that an alternative whose output or only whose gradient differs is refused
and not timed, and that the table has the expected rows. No speeds are asserted.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from parlab.models import get_spec
from parlab.models.reference import apply_rope, build_model, rope_table

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "model_eager_probe.py"
_spec = importlib.util.spec_from_file_location("model_eager_probe", _PATH)
assert _spec is not None and _spec.loader is not None
probe = importlib.util.module_from_spec(_spec)
sys.modules["model_eager_probe"] = probe
_spec.loader.exec_module(probe)

TINY = dict(hidden=32, layers=2, heads=4, ffn_hidden=96, vocab_size=64, max_seq_len=16)


def _cfg(dtype: torch.dtype, **spec_changes: object) -> object:
    spec = get_spec("1.3b").replace(**{**TINY, **spec_changes})
    return probe.ProbeConfig(spec=spec, batch=2, seq=8, dtype=dtype, device=torch.device("cpu"),
                             iters=1, warmup=0)  # fmt: skip


def test_equivalents_match_reference_in_float64() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 8, 3, 16, dtype=torch.float64)
    table = rope_table(torch.arange(8), 16, 10000.0)
    ref = apply_rope(x, table)
    # the complex path computes in complex64 (as torchtitan does): float32 accuracy
    assert torch.allclose(probe.apply_rope_complex(x, probe.freqs_cis(table)), ref, atol=1e-6)
    cos, sin = probe.cos_sin_expanded(table)
    assert torch.allclose(probe.apply_rope_cached(x, cos, sin), ref, atol=1e-6)

    spec = get_spec("1.3b").replace(**TINY, kv_heads=2)
    model = build_model(spec, dtype=torch.float64, seed=1)
    block = model.layers[0]
    h = torch.randn(2, 8, 32, dtype=torch.float64)
    table = rope_table(torch.arange(8), spec.d_head, spec.rope_theta)
    fast = probe.fast_block(block, h, probe.freqs_cis(table), gqa_native=True)
    assert torch.allclose(fast, block(h, table), atol=1e-6)
    q, k, v = torch.randn(2, 8, 4, 8), torch.randn(2, 8, 2, 8), torch.randn(2, 8, 2, 8)
    cur = probe.sdpa_current(q, k, v)
    assert torch.allclose(probe.sdpa_native_gqa(q, k, v), cur, atol=1e-6)
    assert torch.allclose(probe.sdpa_contiguous(q, k, v), cur, atol=1e-6)


EXPECTED = {
    ("part", "norm", "current"), ("part", "norm", "F.rms_norm(weight)"),
    ("part", "norm", "F.rms_norm * weight"),
    ("part", "rope", "current"), ("part", "rope", "complex (cached freqs_cis)"),
    ("part", "rope", "cached cos/sin [S,1,D]"),
    ("part", "rope_table", "current (forward only, once per step)"),
    ("part", "attention", "current"), ("part", "attention", "contiguous q/k/v"),
    ("part", "mlp", "current"), ("part", "mlp", "fused w13"),
    ("part", "loss", "current"), ("part", "loss", "no fp32 upcast"),
    ("block", "block", "current"), ("block", "block", "all equivalent swaps"),
    ("model", "model", "current"), ("model", "model", "all equivalent swaps"),
}  # fmt: skip


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("dtype", "kv_heads"), [(torch.float32, None), (torch.bfloat16, 2)], ids=["fp32", "bf16-gqa"]
)
def test_probe_rows_all_equal_and_timed(dtype: torch.dtype, kv_heads: int | None) -> None:
    cfg = _cfg(dtype, kv_heads=kv_heads)
    rows = probe.run_probe(cfg)
    keys = {(r.scope, r.part, r.variant) for r in rows}
    assert keys >= EXPECTED
    if kv_heads is not None:
        assert ("part", "attention", "enable_gqa=True") in keys
    tol = probe.TOLERANCE[dtype]
    for r in rows:
        if r.status.startswith("unsupported"):
            assert "CUDA" in r.status  # only the GPU-only variants are skipped on the CPU
            continue
        assert r.status == "timed", (r.part, r.variant, r.status)
        assert r.ms is not None and r.ms > 0
        assert r.err_out is not None and r.err_out <= tol
        assert r.err_grad is not None and r.err_grad <= tol
    model_rows = [r for r in rows if r.scope == "model"]
    assert all(r.extra["tokens_per_s"] > 0 and r.extra["mfu"] is None for r in model_rows)
    table = probe.format_table(rows)
    assert len(table.splitlines()) == len(rows) + 1


def test_unequal_alternative_is_refused_and_not_timed() -> None:
    cfg = _cfg(torch.float32)
    x = torch.randn(4, 32, requires_grad=True)
    w = torch.ones(32, requires_grad=True)
    leaves = [x, w]

    def grads() -> list[torch.Tensor]:
        return [x.grad, w.grad]  # type: ignore[list-item]

    def current() -> torch.Tensor:
        return F.rms_norm(x, (32,), w, 1e-5)

    def wrong_grad() -> torch.Tensor:  # same output, gradient of x scaled by 1.01
        y = current()
        return y + 0.01 * (y - y.detach())

    rows = probe.probe_part("part", "norm", [
        probe.Variant(name="current", forward=current, grads=grads, leaves=leaves),
        probe.Variant(name="off output", forward=lambda: current() * 1.01, grads=grads,
                      leaves=leaves),
        probe.Variant(name="off gradient", forward=wrong_grad, grads=grads, leaves=leaves),
        probe.Variant(name="raises", forward=lambda: x @ w[:3], grads=grads, leaves=leaves),
    ], cfg)  # fmt: skip
    by = {r.variant: r for r in rows}
    assert by["current"].status == "timed" and by["current"].ms is not None
    assert by["off output"].status.startswith("NOT EQUAL") and by["off output"].ms is None
    assert by["off output"].err_out > 1e-3
    off = by["off gradient"]
    assert off.status.startswith("NOT EQUAL") and off.ms is None
    assert off.err_out <= 1e-6 and off.err_grad > 1e-3
    assert by["raises"].status.startswith("failed:") and by["raises"].ms is None


def test_main_prints_header_and_table_and_refuses_bad_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rows.json"
    rc = probe.main(["--device", "cpu", "--iters", "1", "--warmup", "0", "--no-model",
                     "--seq", "8", "--json", str(out)])  # fmt: skip
    assert rc == 0
    text = capsys.readouterr().out
    assert text.startswith("python ") and "torch " + torch.__version__ in text
    assert "cpu-mechanism" in text and "F.rms_norm(weight)" in text
    doc = json.loads(out.read_text())
    assert not any(r["scope"] == "model" for r in doc["rows"])
    assert probe.main(["--model", "gpt2-124m", "--device", "cpu"]) == 2
    assert "Llama-style" in capsys.readouterr().err
