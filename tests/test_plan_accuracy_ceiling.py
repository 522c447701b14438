"""``benchmarks/plan_accuracy.py``: the most runs one prediction per configuration can bring
within 10 % (the machine's spread between repeats), and which side sets a run's step."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(_DIR))
_spec = importlib.util.spec_from_file_location("plan_accuracy", _DIR / "plan_accuracy.py")
assert _spec is not None and _spec.loader is not None
pa = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("plan_accuracy", pa)  # its dataclasses look their module up
_spec.loader.exec_module(pa)

H200 = "NVIDIA H200"
PROBES = {pa._key("1.3b", "ddp", "none"): (H200, [(0.08, "host-step-1"), (0.10, "host-step-2")])}


def _run(step: float) -> tuple[SimpleNamespace, None, bool]:
    return (
        SimpleNamespace(metric=lambda name, s=step: s if name == "step_time" else None),
        None,
        False,
    )


def _doc(step: float, *, backward: tuple[list[float], list[float]] | None = None,
         global_batch: int = 2, gpu: str = H200) -> Any:  # fmt: skip
    """A one-rank DDP run of the 1.3B at 2 x 4096 with a ``step`` median, and rank 0's backward
    phase times (device, host) when given."""
    workload: dict[str, Any] = {"preset": "1.3b", "micro_batch": 2, "seq": 4096,
                                "global_batch": global_batch}  # fmt: skip
    if backward is not None:
        workload["phase_times"] = {"host": {"backward": backward[1]},
                                   "device": {"backward": backward[0]}}  # fmt: skip
    return SimpleNamespace(
        run_id="train-ddp-1.3b-t",
        project="PAR-TRAINING-STATE",
        workload=workload,
        layout={"world_size": 1, "mesh": {"dp": 1}, "strategy": "ddp", "knobs": {}},
        environment={"hardware": {"gpus": [{"name": gpu}]}},
        metric=lambda name: step if name == "step_time" else None,
    )


def test_ceiling_counts_the_runs_one_value_per_configuration_can_meet() -> None:
    """Steps 1.0, 1.15 and 1.3 s: no value is within 10 % of all three (1.0 needs at most
    1.1, 1.3 at least 1.17), two of them at best; a configuration run once is met."""
    repeats = {"a": [_run(1.0), _run(1.15), _run(1.3)], "b": [_run(0.5)]}
    assert pa.ceiling(repeats) == (3, 4)
    assert pa.ceiling({"c": [_run(1.0), _run(1.05), _run(1.1)]}) == (3, 3)


def test_the_runs_own_phase_timing_decides_first() -> None:
    """Rule 1: the device's backward outlasting the host's by more than 2 % of the step is
    GPU-set (the median over the timed steps), even where a probe's host alone is near the
    step; the device keeping to the host's backward is host-bound, even where the probe's host
    alone is a small part of it."""
    ahead = _doc(0.2, backward=([0.120, 0.121, 0.150], [0.100, 0.100, 0.100]))
    assert pa.backlog(ahead) == pytest.approx(0.021 / 0.2)
    got = pa.side(ahead, PROBES, share=0.3)
    assert got.gpu and got.rule == "phases" and "+10.5% of step" in got.why
    waits = _doc(0.2, backward=([0.100, 0.1003, 0.090], [0.100, 0.100, 0.100]))
    assert not pa.side(waits, PROBES, share=0.99).gpu
    assert pa.side(_doc(0.2, backward=([0.103], [0.100])), {}, 0.7).gpu is False  # 1.5 %


def test_without_phase_timing_a_probe_of_the_configuration_decides_then_nothing() -> None:
    """Rule 2: the probes' median host alone (0.09 s) against ``share`` of the step; rule 3:
    no probe of the configuration (another GPU, or more than one micro-batch a step, which the
    probes never ran) -- counted GPU-set."""
    assert pa.host_alone(_doc(0.2), PROBES) == (
        pytest.approx(0.09),
        "median of 2 (host-step-1, host-step-2)",
    )
    assert pa.side(_doc(0.2), PROBES, share=0.5).gpu  # 0.45 x step
    host = pa.side(_doc(0.1), PROBES, share=0.5)
    assert not host.gpu and host.rule == "probe" and "0.90 x step" in host.why
    for other in (_doc(0.1, gpu="NVIDIA H100"), _doc(0.1, global_batch=4)):
        assert pa.host_alone(other, PROBES) is None
        got = pa.side(other, PROBES, share=0.5)
        assert got.gpu and got.rule == "none"


def test_the_probe_rules_share_is_the_cut_that_best_separates_the_phase_timed_runs() -> None:
    """Runs with both measurements: host-alone shares 0.3, 0.4 (GPU-set by their phases), 0.8,
    0.9 (host-bound), and one GPU-set run at 0.85: a cut between 0.4 and 0.8 or between 0.85
    and 0.9 each calls 4 of the 5 alike; the wider gap's middle is the share."""
    gpu, host = ([0.12], [0.10]), ([0.10], [0.10])
    docs = [_doc(0.09 / s, backward=b)
            for s, b in ((0.3, gpu), (0.4, gpu), (0.8, host), (0.9, host), (0.85, gpu))]  # fmt: skip
    share, alike, both = pa.share_threshold(docs, PROBES)
    assert share == pytest.approx(0.6) and (alike, both) == (4, 5)
    assert pa.share_threshold([_doc(0.2)], PROBES) == (1.0, 0, 0)  # no phase timing
