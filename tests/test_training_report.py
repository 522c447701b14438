"""The training-state report is rendered from contract documents alone; text-file data."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from parlab.contract import Failure, read_results, write_result
from parlab.data import TextTokens
from parlab.errors import UsageError
from parlab.hardware.env import snapshot
from parlab.projects.training_state import TrainConfig, document, run_project


def fake_rank(rank: int, peak: int) -> dict:
    """A rank's return value shaped like ``train_rank``'s (the numbers are test inputs)."""
    return {
        "rank": rank,
        "device": "cpu",
        "losses": [5.5, 5.4, 5.3],
        "step_times": [0.1, 0.12],
        "peak_memory": peak,
        "memory_source": "tracked-tensor-bytes",
        "state_bytes": {"params": 100, "grads": 100, "optimizer": 200},
        "comm_metered": True,
        "comm_by_op": {"all_reduce": {"count": 1, "bytes": 400}},
        "comm_bytes_per_step": 400,
        "comm_time": 0.01,
        "tokens_per_step": 64,
    }


ENV = snapshot(probe_links=False)


def test_report_from_documents_only(tmp_path: Path) -> None:
    ok = TrainConfig(strategy="ddp", model="tiny", nproc=2, seq=32)
    bad = TrainConfig(strategy="zero3", model="tiny", nproc=2, seq=32, memory_cap=1000)
    d1 = document(
        ok, [fake_rank(0, 5000), fake_rank(1, 6000)], None, command="c", backend="gloo",
        environment=ENV,
    )  # fmt: skip
    d2 = document(
        bad, None, Failure(kind="oom", message="out of memory", rank=1), command="c",
        backend="gloo", environment=ENV,
    )  # fmt: skip
    assert d1.role == "baseline" and d1.evidence_level == "cpu-mechanism"
    assert d1.metric("peak_memory") == 6000 and d1.metrics["peak_memory"].per_rank == [5000, 6000]
    assert d1.metric("step_time") == pytest.approx(0.11)
    assert d1.workload["step_times"] == [0.1, 0.12]  # each step's slowest rank, all kept
    assert "step_times" not in d2.workload
    assert d1.metric("tokens_per_s_per_gpu") == pytest.approx(64 / 0.11)
    assert d1.metric("mfu") is None  # cpu: unknown, never guessed
    assert d1.predictions["state_bytes.params"].value > 0
    assert d2.role == "failure" and d2.failure is not None and d2.failure.kind == "oom"
    assert d2.predictions["peak_memory"].value > 1000
    for d in (d1, d2):
        write_result(d, tmp_path)
    paths = run_project(tmp_path, report_only=True)
    text = paths["report"].read_text()
    assert "ddp tiny" in text and "failed (oom)" in text
    for name in ("memory", "throughput", "predicted"):
        assert paths[name].exists() and paths[name].stat().st_size > 1000
    entries, skipped = read_results(tmp_path)
    assert len(entries) == 2 and not skipped


def test_report_only_without_documents_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    with pytest.raises(UsageError):
        run_project(tmp_path, report_only=True)


def test_text_file_tokens(tmp_path: Path) -> None:
    f = tmp_path / "t.txt"
    f.write_text("hello parlab " * 20)
    d = TextTokens(f, seq=8, seed=1)
    b = d.global_batch(0, 4)
    assert b.inputs.shape == (4, 8) and b.inputs.dtype == torch.int64
    assert int(b.inputs.max()) < 256
    assert torch.equal(b.inputs[:, 1:], b.labels[:, :-1])
    assert torch.equal(b.inputs, d.global_batch(0, 4).inputs)
    with pytest.raises(UsageError):
        TextTokens(tmp_path / "missing.txt", seq=8)
