"""``benchmarks/plan_accuracy.py``: the most runs one prediction per configuration can bring
within 10 % (the machine's spread between repeats), and the host-bound prediction."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(_DIR))
_spec = importlib.util.spec_from_file_location("plan_accuracy", _DIR / "plan_accuracy.py")
assert _spec is not None and _spec.loader is not None
pa = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("plan_accuracy", pa)  # its dataclasses look their module up
_spec.loader.exec_module(pa)


def _run(step: float) -> tuple[SimpleNamespace, None, bool]:
    return (
        SimpleNamespace(metric=lambda name, s=step: s if name == "step_time" else None),
        None,
        False,
    )


def test_ceiling_counts_the_runs_one_value_per_configuration_can_meet() -> None:
    """Steps 1.0, 1.15 and 1.3 s: no value is within 10 % of all three (1.0 needs at most
    1.1, 1.3 at least 1.17), two of them at best; a configuration run once is met."""
    repeats = {"a": [_run(1.0), _run(1.15), _run(1.3)], "b": [_run(0.5)]}
    assert pa.ceiling(repeats) == (3, 4)
    assert pa.ceiling({"c": [_run(1.0), _run(1.05), _run(1.1)]}) == (3, 3)


def test_a_host_bound_run_is_predicted_as_the_host_alone() -> None:
    assert pa.with_host(0.2, 0.3) == 0.3
    assert pa.with_host(0.3, 0.2) == 0.3
    assert pa.with_host(0.3, None) == 0.3 and pa.with_host(None, 0.3) is None
