"""benchmarks/plain_references.py (the plain FSDP2 / DDP / pipelining baselines) on the CPU.

Run as a user runs it (torchrun, two gloo ranks, the tiny model, 1 warm-up + 1 timed step):
every mode writes its JSON; the script's own Llama equals parlab's reference model given the
same weights (the parameter names are the same, so its saved state dict loads as it is); and
fsdp, ddp and the three pipeline schedules, fed the same global batch (4 sequences a step),
give the losses one process computes (``ddp`` on one rank): the first step's (same weights,
same data) and the second step's (after one AdamW step on the averaged gradient), where the
update shows beside the second step's loss without it. Times are not asserted.
"""

from __future__ import annotations

import json
import math
import subprocess
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from parlab.models import get_spec
from parlab.models.reference import build_model as build_reference
from tests.scripts import start_script

SEQ = 32
LR = 1e-2  # large enough that the second step's loss shows the first update
COMMON = ["--model", "tiny", "--seq", str(SEQ), "--warmup", "1", "--steps", "1"]
RUNS: dict[str, tuple[int, list[str]]] = {  # ranks, arguments; 4 sequences a step in every run
    "fsdp": (2, ["--mode", "fsdp", "--micro-batch", "2"]),
    "ddp": (2, ["--mode", "ddp", "--micro-batch", "2"]),
    "pp-1f1b": (2, ["--mode", "pp", "--schedule", "1f1b", "--micro-batch", "1", "--microbatches", "4"]),
    "pp-gpipe": (2, ["--mode", "pp", "--schedule", "gpipe", "--micro-batch", "1", "--microbatches", "4"]),
    "pp-interleaved": (2, ["--mode", "pp", "--schedule", "interleaved", "--micro-batch", "1",
                           "--microbatches", "4"]),
    "single": (1, ["--mode", "ddp", "--micro-batch", "4"]),
}  # fmt: skip
PARALLEL = ("fsdp", "ddp", "pp-1f1b", "pp-gpipe", "pp-interleaved")


pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every run at once, its JSON read back (the single run also saved its weights)."""
    out = tmp_path_factory.mktemp("plain")
    procs = {}
    for name, (nproc, args) in RUNS.items():
        extra = ["--save-weights", str(out / "weights.pt")] if name == "single" else []
        procs[name] = start_script(
            "plain_references.py", *COMMON, "--lr", str(LR), *args, *extra,
            "--json", str(out / f"{name}.json"), nproc=nproc,
        )  # fmt: skip
    logs = {}
    for name, p in procs.items():
        try:
            logs[name], _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            p.kill()
            logs[name], _ = p.communicate()
        assert p.returncode == 0, f"{name} failed:\n{logs[name][-3000:]}"
    got = {name: json.loads((out / f"{name}.json").read_text()) for name in RUNS}
    return {**got, "_logs": logs, "_weights": torch.load(out / "weights.pt")}


def _reference(saved: dict[str, Any]) -> torch.nn.Module:
    """parlab's reference model with the script's initial weights."""
    ref = build_reference(get_spec("tiny"))
    ref.load_state_dict(saved["weights"])
    return ref


def test_model_equals_parlab_reference_with_the_same_weights(results: dict[str, Any]) -> None:
    saved = results["_weights"]
    shapes = [(n, tuple(t.shape)) for n, t in saved["weights"].items()]
    assert shapes == get_spec("tiny").param_shapes()  # parlab's names, shapes and order
    ref = _reference(saved)
    with torch.no_grad():
        for batch, logits in zip(saved["batches"], saved["logits"], strict=True):
            assert torch.allclose(ref(batch[:, :-1]), logits, atol=1e-5, rtol=1e-5)


def test_every_mode_writes_its_result(results: dict[str, Any]) -> None:
    for name in PARALLEL:
        r = results[name]
        assert r["mode"] == name.split("-")[0]
        assert r["world_size"] == 2 and r["device"] == "cpu" and r["nccl"] is None
        assert r["tokens_per_s_per_gpu"] > 0 and r["step_s"] > 0
        assert len(r["step_times_s"]) == 1 and len(r["losses"]) == 2
        assert all(math.isfinite(x) for x in r["losses"])
        assert r["tokens_per_step"] == 4 * SEQ
        assert r["tokens_per_s_per_gpu"] == pytest.approx(4 * SEQ / r["step_s"] / 2)
        assert r["mfu"] is None and r["peak_memory_bytes"] is None  # no GPU, no peak
        assert r["flops_per_token"] > 0 and "6 N + 12 L H Q T" in r["formula"]
        assert r["config"]["precision"] == "fp32"
    assert results["pp-interleaved"]["config"]["schedule"] == "interleaved"
    assert "tok/s/GPU" in results["_logs"]["fsdp"]


def test_every_mode_trains_like_one_process(results: dict[str, Any]) -> None:
    want = results["single"]["losses"]
    assert results["single"]["world_size"] == 1
    saved = results["_weights"]
    with torch.no_grad():  # step 1's loss without the update, parlab's model on the same batch
        b = saved["batches"][1]
        untrained = float(
            F.cross_entropy(_reference(saved)(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten())
        )
    assert abs(want[1] - untrained) > 100 * 1e-5  # the update shows, far beyond the tolerance
    for name in PARALLEL:
        got = results[name]["losses"]
        assert got[0] == pytest.approx(want[0], abs=1e-5), (name, got, want)
        assert got[1] == pytest.approx(want[1], abs=1e-5), (name, got, want)
