"""``parlab train --strategy deepspeed-zero1|2|3``: DeepSpeed's ZeRO, an optional extra.

Without DeepSpeed (CI): one clear line, exit 2, nothing written, nothing launched. With it
(``DS_BUILD_OPS=0``, pure Python: DeepSpeed's CPU accelerator runs on gloo CPU ranks), each
stage trains the tiny model on 2 gloo ranks (and 1) through the rank function ``parlab train``
uses, and the rank-averaged losses and the final parameters equal one process training on the
whole batch (SGD). With AdamW in bf16, the optimizer states, the fp32 master partition and its
gradient equal the ledger's ``bf16-master`` items exactly, and the measured peak (which holds
DeepSpeed's 5e8-element gradient bucket) is within 0.1 % of the ledger's.
"""

from __future__ import annotations

import builtins
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from parlab.projects.training_state import TrainConfig, ledger_predictions, train_rank
from parlab.runtime.testing import run_ranks
from tests.test_training_state import cfg_for, check_equal

pytestmark = pytest.mark.timeout(180)

HAVE_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
needs_deepspeed = pytest.mark.skipif(not HAVE_DEEPSPEED, reason="deepspeed is not installed")


def _hide_deepspeed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import deepspeed`` fails as where it is not installed (also where it is)."""
    real = builtins.__import__

    def fake(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "deepspeed" or name.startswith("deepspeed."):
            raise ModuleNotFoundError(f"No module named {name!r}", name="deepspeed")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_missing_deepspeed_is_one_line_exit_2_nothing_written(
    stage: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from parlab.cli import main
    from parlab.projects.training_state import run

    def no_launch(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("launched")

    monkeypatch.setattr(run, "launch", no_launch)
    _hide_deepspeed(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        main(["train", "--strategy", f"deepspeed-zero{stage}", "--results", str(tmp_path / "r")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("parlab: error:") and "\n" not in err
    assert "deepspeed is not installed: pip install deepspeed" in err
    assert "DS_BUILD_OPS=0" in err
    assert not (tmp_path / "r").exists()


def test_ledger_models_deepspeed_as_zero_with_a_master_partition() -> None:
    """No DeepSpeed needed: bf16 runs are the ledger's zero1/2/3 under ``bf16-master``, plus
    DeepSpeed's gradient bucket as the explicit overhead; the notes say what it leaves out."""
    from parlab.ledger import predict
    from parlab.models import get_spec
    from parlab.topology import Topology

    for stage in (1, 2, 3):
        c = object.__new__(TrainConfig)
        # a zero1 config with DeepSpeed's recipe, then each DeepSpeed stage in its place
        fields = cfg_for("zero1", 2, optimizer="adamw", dtype="bf16-params").to_json()
        for k, v in {**fields, "strategy": f"deepspeed-zero{stage}"}.items():
            object.__setattr__(c, k, v)  # past __post_init__: deepspeed may be missing here
        preds, notes = ledger_predictions(c, "gloo")
        led = predict(
            get_spec("tiny"), strategy=f"zero{stage}", topology=Topology(world_size=2, dp=2),
            micro_batch=2, seq_len=16, dtype="bf16-master", optimizer="adamw",
        )  # fmt: skip
        for item in ("params", "grads", "optimizer", "master_params", "master_grads"):
            assert preds[f"state_bytes.{item}"].value == led.value(item), item
        assert preds["state_bytes.master_params"].value > 0
        assert any("stage3_param_persistence_threshold" in n for n in notes)


@needs_deepspeed
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_two_ranks_equal_single_process(stage: int) -> None:
    cfg = cfg_for(f"deepspeed-zero{stage}", 2)
    check_equal(run_ranks(train_rank, 2, return_params=True, timeout=150, **cfg.to_json()), 2)


@needs_deepspeed
@pytest.mark.parametrize("stage", [1, 3])
def test_deepspeed_world_size_one_is_plain_training(stage: int) -> None:
    cfg = cfg_for(f"deepspeed-zero{stage}", 1)
    check_equal(run_ranks(train_rank, 1, return_params=True, timeout=150, **cfg.to_json()), 1)


@needs_deepspeed
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_bf16_state_against_the_ledger(stage: int) -> None:
    cfg = cfg_for(f"deepspeed-zero{stage}", 2, optimizer="adamw", lr=1e-3, dtype="bf16-params")
    results = run_ranks(train_rank, 2, timeout=150, **cfg.to_json())
    preds, _ = ledger_predictions(cfg, "gloo")
    for r in results:
        sb = r["state_bytes"]
        for item in ("optimizer", "master_params", "master_grads"):
            assert sb[item] == preds[f"state_bytes.{item}"].value, (r["rank"], item)
        # bf16 parameters: the whole padded flat buffer (stages 1/2); stage 3's partitions
        # plus its persistent parameters (every parameter of the tiny model is under 1e5)
        assert sb["params"] >= preds["state_bytes.params"].value
        # the reduced gradient partition, bf16, within a few padding elements of the ledger's
        # zero2/zero3 shard (stage 1 too: DeepSpeed reduces it in buckets during backward)
        shard = preds["state_bytes.grads"].value / (2 if stage == 1 else 1)
        assert sb["grads"] == pytest.approx(shard, abs=256)
        assert r["peak_memory"] == pytest.approx(preds["peak_memory"].value, rel=1e-3)
        assert r["comm_bytes_per_step"] > 0
