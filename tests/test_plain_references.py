"""benchmarks/plain_references.py (the plain FSDP2 / DDP / pipelining baselines) on the CPU.

Checks that the script's own Llama equals parlab's reference model given the same weights
(the parameter names are the same, so the state dict loads as it is), that a pipeline stage
holds exactly the whole model's weights for its names, and that every mode runs on two gloo
ranks with the tiny model (1 warm-up + 1 timed step, launched through torchrun) and writes
its JSON; then that fsdp, ddp and the three pipeline schedules, fed the same global batch
(4 sequences a step), give the loss a single process computes: the first step's (same
weights, same data) and the second step's (after one AdamW step on the averaged gradient).
Times are not asserted.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from parlab.models import get_spec
from parlab.models.reference import build_model as build_reference

ROOT = Path(__file__).resolve().parents[1]
_PATH = ROOT / "benchmarks" / "plain_references.py"
_spec = importlib.util.spec_from_file_location("plain_references", _PATH)
assert _spec is not None and _spec.loader is not None
plain = importlib.util.module_from_spec(_spec)
sys.modules["plain_references"] = plain
_spec.loader.exec_module(plain)

SEQ = 32
ROWS = 4  # sequences per step in every run below: 2 ranks x 2, or 4 micro-batches x 1
LR = 1e-2  # large enough that the second step's loss shows the first update
RUNS: dict[str, list[str]] = {
    "fsdp": ["--mode", "fsdp", "--micro-batch", "2"],
    "ddp": ["--mode", "ddp", "--micro-batch", "2"],
    "pp-1f1b": ["--mode", "pp", "--schedule", "1f1b", "--micro-batch", "1", "--microbatches", "4"],
    "pp-gpipe": ["--mode", "pp", "--schedule", "gpipe", "--micro-batch", "1", "--microbatches", "4"],
    "pp-interleaved": ["--mode", "pp", "--schedule", "interleaved", "--micro-batch", "1",
                       "--microbatches", "4"],
}  # fmt: skip


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every run at once (two gloo ranks each), its JSON read back."""
    out = tmp_path_factory.mktemp("plain")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    procs = {}
    for name, args in RUNS.items():
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", str(_PATH), "--model", "tiny", "--seq", str(SEQ),
               "--warmup", "1", "--steps", "1", "--lr", str(LR), "--json", str(out / f"{name}.json"), *args]  # fmt: skip
        procs[name] = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    logs = {}
    for name, p in procs.items():
        try:
            logs[name], _ = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            p.kill()
            logs[name], _ = p.communicate()
        assert p.returncode == 0, f"{name} failed:\n{logs[name][-3000:]}"
    return {name: json.loads((out / f"{name}.json").read_text()) for name in RUNS} | {
        "_logs": logs  # type: ignore[dict-item]
    }


def _args() -> Any:
    return plain.ModelArgs.from_parlab("tiny")


def test_model_equals_parlab_reference_with_the_same_weights() -> None:
    a = _args()
    ours = plain.build_model(a, SEQ, torch.device("cpu"))
    ref = build_reference(get_spec("tiny"))
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    ref.load_state_dict(ours.state_dict())
    tokens = plain.make_batch(0, ROWS, SEQ, a.vocab_size)[:, :-1]
    with torch.no_grad():
        assert torch.allclose(ours(tokens), ref(tokens), atol=1e-5, rtol=1e-5)


def test_the_13b_model_has_the_presets_parameters() -> None:
    a = plain.ModelArgs.from_parlab("1.3b")
    with torch.device("meta"):
        model = plain.Transformer(a, 4096)
    shapes = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert shapes == get_spec("1.3b").param_shapes()


def test_a_stage_holds_the_whole_models_weights() -> None:
    a = _args()
    whole = dict(plain.build_model(a, SEQ, torch.device("cpu")).named_parameters())
    stage = plain.build_model(a, SEQ, torch.device("cpu"), layers=range(2, 4), first=False)
    names = [n for n, _ in stage.named_parameters()]
    assert names[0].startswith("layers.2.") and names[-1] == "output.weight"
    assert not any(n.startswith(("tok_embeddings", "layers.0.", "layers.1.")) for n in names)
    for n, p in stage.named_parameters():
        assert torch.equal(p, whole[n]), n


def _single_process_losses() -> tuple[list[float], float]:
    """Step 0's loss, one AdamW step, step 1's loss: the whole global batch in one process;
    and step 1's loss without the update."""
    a = _args()
    model = plain.build_model(a, SEQ, torch.device("cpu"))
    batches = [plain.make_batch(step, ROWS, SEQ, a.vocab_size) for step in range(2)]
    with torch.no_grad():
        untrained = float(plain.loss_fn(model(batches[1][:, :-1]), batches[1][:, 1:]))
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    out = []
    for batch in batches:
        loss = plain.loss_fn(model(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out, untrained


def test_every_mode_writes_its_result(results: dict[str, dict[str, Any]]) -> None:
    for name in RUNS:
        r = results[name]
        assert r["mode"] == name.split("-")[0]
        assert r["world_size"] == 2 and r["device"] == "cpu" and r["nccl"] is None
        assert r["tokens_per_s_per_gpu"] > 0 and r["step_s"] > 0
        assert len(r["step_times_s"]) == 1 and len(r["losses"]) == 2
        assert all(math.isfinite(x) for x in r["losses"])
        assert r["tokens_per_step"] == ROWS * SEQ
        assert r["tokens_per_s_per_gpu"] == pytest.approx(ROWS * SEQ / r["step_s"] / 2)
        assert r["mfu"] is None and r["peak_memory_bytes"] is None  # no GPU, no peak
        assert r["flops_per_token"] > 0 and "6 N + 12 L H Q T" in r["formula"]
        assert r["config"]["precision"] == "fp32"
    assert results["pp-interleaved"]["config"]["schedule"] == "interleaved"
    assert "tok/s/GPU" in results["_logs"]["fsdp"]  # type: ignore[operator]


def test_every_mode_trains_like_one_process(results: dict[str, dict[str, Any]]) -> None:
    want, untrained = _single_process_losses()
    assert abs(want[1] - untrained) > 100 * 1e-5  # the update shows, far beyond the tolerance
    for name in RUNS:
        got = results[name]["losses"]
        assert got[0] == pytest.approx(want[0], abs=1e-5), (name, got, want)
        assert got[1] == pytest.approx(want[1], abs=1e-5), (name, got, want)
