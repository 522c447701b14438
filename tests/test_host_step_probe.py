"""``benchmarks/host_step_probe.py``: the host's time per ``parlab train`` step, on the CPU; its
narrowed models read back as what they claim, and ``parlab.plan.fit.host.load_host_step``."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from parlab.contract import read_document, write_result
from parlab.models import get_spec
from parlab.models.hf import load_hf_config
from parlab.plan.fit.host import host_step_calibration, load_host_step

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "host_step_probe.py"
_spec = importlib.util.spec_from_file_location("host_step_probe", _PATH)
assert _spec is not None and _spec.loader is not None
probe = importlib.util.module_from_spec(_spec)
sys.modules["host_step_probe"] = probe
_spec.loader.exec_module(probe)

ENV = {
    "hardware": {"gpus": [], "gpu_count": 0, "cpu": {"count": 2}, "host_count": 1},
    "software": {"python": "3.11", "torch": "2.13", "parlab": "0.1.0"},
}


@pytest.mark.parametrize("model", ["llama3.1-8b", "qwen2.5-7b", "gpt2-1.5b", "llama2-7b"])
def test_narrowed_model_keeps_every_tensor_and_reads_back(model: str, tmp_path: Path) -> None:
    """Every layer, head, KV head, the vocabulary and the biases kept, the width cut; its
    ``config.json`` is read back by parlab's Hugging Face loader as the same structure."""
    s = get_spec(model)
    n = probe.narrow_spec(model, 16)
    assert (n.hidden, n.d_head) == (16 * s.heads, 16)
    assert (n.layers, n.heads, n.kv_heads, n.vocab_size) == (s.layers, s.heads, s.kv_heads,
                                                             s.vocab_size)  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(probe.hf_config(n)))
    back = load_hf_config(path)
    assert (back.kv_heads or back.heads) == (n.kv_heads or n.heads)  # MHA: None or = heads
    for field in ("hidden", "layers", "heads", "ffn_hidden", "vocab_size",
                  "activation", "norm", "position", "qkv_bias", "linear_bias",
                  "tied_embeddings"):  # fmt: skip
        assert getattr(back, field) == getattr(n, field), field
    assert back.num_params() == n.num_params()


def test_run_syntax_is_checked() -> None:
    assert probe.Run.parse("fsdp:8b:1x1024:full") == probe.Run("fsdp", "8b", 1, 1024, "full")
    with pytest.raises(ValueError, match="STRATEGY:MODEL:MBxSEQ:RECOMPUTE"):
        probe.Run.parse("fsdp:8b:1024")


def test_probe_times_narrowed_and_full_runs_on_one_cpu_rank(tmp_path: Path) -> None:
    """The real ``parlab train`` loop on one gloo rank: a narrowed width and the model's own,
    whose run document is written beside the calibration and named by it; the loader keeps the
    narrowed steps only (the full run is the configuration, not the host's time)."""
    run = probe.Run("ddp", "tiny", 1, 16, "none")
    entry = probe.measure(run, [4, 0], gpu=False, steps=1, warmup=1, results=str(tmp_path),
                          tokens=[8])  # fmt: skip
    narrow, full, few = entry["widths"]
    assert few["tokens"] == 8 and few["hidden"] == get_spec("tiny").hidden and few["step_s"] > 0
    assert narrow["hidden"] == 4 * get_spec("tiny").heads and narrow["step_s"] > 0
    assert "run_id" not in narrow and full["hidden"] == get_spec("tiny").hidden
    runs = list((tmp_path / "PAR-TRAINING-STATE").glob("train-ddp-tiny-*.json"))
    assert [read_document(p).run_id for p in runs] == [full["run_id"]]
    body = probe.calibration([entry], device="NVIDIA H200", backend="cuda")
    doc = probe.document(body, command="t", environment=ENV)
    assert doc.metric("step_time") is None and doc.workload["kind"] == "host-step-calibration"
    got = load_host_step(doc)
    assert got.steps == {("tiny", "ddp", 1, 16, "none"): (narrow["step_s"],)}
    assert got.full == {("tiny", "ddp", 1, 16, "none"): (few["step_s"],)}  # not a narrowed step
    # the narrowed model's parameters, which host_estimate swaps for the model's own
    assert got.params == {
        ("tiny", "ddp", 1, 16, "none"): (probe.narrow_spec("tiny", 4).num_params(),)
    }


def test_calibration_merges_the_probes_of_the_newest_device(tmp_path: Path) -> None:
    """Each configuration's narrowed steps from every GPU probe of the newest one's device; the
    host's time the mean; CPU probes and other devices left out."""

    def entry(step: float) -> dict[str, object]:
        return {"strategy": "fsdp", "model": "llama3.1-8b", "micro_batch": 1, "seq": 1024,
                "recompute": "full", "layers": 32,
                "widths": [{"head_dim": 16, "hidden": 512, "step_s": step, "step_times": []}]}  # fmt: skip

    assert host_step_calibration(tmp_path) is None
    for i, (dev, backend, step) in enumerate((("NVIDIA A100", "cuda", 9.0),
                                               ("NVIDIA H200", "cuda", 0.2),
                                               ("NVIDIA H200", "cuda", 0.3),
                                               ("cpu", "cpu", 5.0))):  # fmt: skip
        body = probe.calibration([entry(step)], device=dev, backend=backend)
        doc = probe.document(body, command="t", environment=ENV)
        doc = dataclasses.replace(doc, created=f"2026-12-01T06:00:0{i}Z", run_id=f"host-step-{i}")
        write_result(doc, tmp_path)
    got = host_step_calibration(tmp_path)
    assert got is not None and got.run_ids == ("host-step-1", "host-step-2")
    assert got.host_s(("llama3.1-8b", "fsdp", 1, 1024, "full")) == pytest.approx(0.25)
    assert got.host_s(("llama3.1-8b", "ddp", 1, 1024, "full")) is None


def test_plan_note_names_the_host_where_a_probe_ran_the_configuration() -> None:
    """``parlab plan --roofline``'s host line: host-bound where the host alone takes at least
    the roofline's GPU work, GPU-bound with the ratio otherwise; nothing where no probe ran the
    configuration (another micro-batch, or the planner's Megatron selective recompute, which
    ``parlab train`` has no form of); the runtime's op-selective is train's ``selective``."""
    from types import SimpleNamespace

    from parlab.plan.fit.host import HostStep, host_note

    steps = HostStep(run_ids=("host-step-1",), device="NVIDIA H200",
                     steps={("llama3.1-8b", "fsdp", 1, 1024, "full"): (0.2, 0.3),
                            ("1.3b", "fsdp", 2, 4096, "selective"): (0.29,)})  # fmt: skip

    def cand(mb: int, rc: str) -> SimpleNamespace:
        return SimpleNamespace(strategy="fsdp", micro_batch=mb, recompute=rc)

    bound = host_note(steps, "llama3.1-8b", cand(1, "full"), 1024, 0.22)
    assert "0.250 s a step" in bound and "host-bound there" in bound
    free = host_note(steps, "llama3.1-8b", cand(1, "full"), 1024, 0.5)
    assert "GPU-bound there (the host alone 0.50 of the GPU's time)" in free
    assert "host-bound" in host_note(steps, "1.3b", cand(2, "op-selective"), 4096, 0.19)
    assert host_note(steps, "1.3b", cand(2, "selective"), 4096, 0.19) == ""
    assert host_note(steps, "llama3.1-8b", cand(2, "full"), 1024, 0.22) == ""
    assert host_note(None, "llama3.1-8b", cand(1, "full"), 1024, 0.22) == ""


def test_a_failed_run_stops_the_probe_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A narrowed run that fails (out of memory, say) raises with its failure's kind and line,
    so the probe writes nothing half-made."""
    from types import SimpleNamespace

    from parlab.contract import Failure
    from parlab.projects import training_state

    failed = SimpleNamespace(status="failed", failure=Failure(kind="oom", message="over 80 GB"),
                             metric=lambda name: None)  # fmt: skip
    monkeypatch.setattr(training_state, "run_training", lambda cfg, command: failed)
    with pytest.raises(RuntimeError, match="oom: over 80 GB"):
        probe.time_run(probe.Run("ddp", "tiny", 1, 16, "none"), 4, gpu=False, steps=1, warmup=1,
                       tmp=tmp_path)  # fmt: skip
