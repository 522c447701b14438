"""Every CPU reproduction shows its case, and its healthy twin does not (gloo ranks, tiny
sizes; about 45 s for all five on 2 cores)."""

from __future__ import annotations

from pathlib import Path

import pytest

from parlab.doctor import diagnose
from parlab.doctor.reproduce import REPRODUCTIONS

CPU = [c for c, r in REPRODUCTIONS.items() if not r.needs_gpu]
TIMED = {"ddp-small-buckets"}
"""Cases whose detector compares step times of two-step CPU runs: another process loading the
CPU can hide the difference in one reproduction (seen once while a benchmark ran beside the
suite)."""


def test_the_cpu_reproductions() -> None:
    assert set(CPU) == {
        "ddp-small-buckets", "pp-bubble", "moe-skew", "oom-activations", "collective-timeout",
    }  # fmt: skip


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", CPU)
def test_reproduction_shows_case_not_in_healthy_twin(case: str, tmp_path: Path) -> None:
    case_dir, healthy_dir = REPRODUCTIONS[case].run(tmp_path / "1")
    if case in TIMED and case not in diagnose(case_dir).cases_found():
        # a timed case on a loaded CPU: one more reproduction before calling it missing
        case_dir, healthy_dir = REPRODUCTIONS[case].run(tmp_path / "2")
    sick, healthy = diagnose(case_dir), diagnose(healthy_dir)
    assert case in sick.cases_found(), [f.summary for f in sick.findings]
    assert case not in healthy.cases_found(), [f.summary for f in healthy.findings]
    # the finding cites a document of the case folder that exists, with its fields
    for f in (f for f in sick.findings if f.case == case):
        assert (case_dir / f.document).is_file() and f.fields
        assert f.evidence_level in ("cpu-mechanism", "real-nccl", "real-training")
