"""The launcher's holes, closed: a killed rank is named, a stopped rank ends the run within the
group timeout plus seconds, and nothing outlives a launcher killed by SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parlab.runtime.launch import LaunchConfig, launch, torchrun_failures

TESTS = str(Path(__file__).parent)
SRC = str(Path(__file__).parents[1] / "src")


@pytest.fixture(autouse=True)
def _importable_rank_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", TESTS)


def test_a_rank_killed_by_sigkill_is_named() -> None:
    res = launch(
        "rankfns:kill_self_on", {"bad_rank": 1}, LaunchConfig(nproc=2, backend="gloo", timeout_s=30)
    )
    assert not res.ok and res.failure is not None
    assert res.failure.rank == 1, res.failure  # not rank 0, whose peer closed the connection
    assert res.failure.kind == "crash"
    assert "SIGKILL" in res.failure.message and "-9" in res.failure.message


def test_torchrun_failure_report_is_read() -> None:
    log = """
Failures:
[1]:
  time      : 2026-12-02_02:31:26
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 19001)  (SIGKILL)
  error_file: <N/A>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 19000)
"""
    assert torchrun_failures(log) == {1: -9, 0: 1}


def test_a_stopped_rank_ends_within_the_timeout_plus_seconds() -> None:
    """SIGSTOP: its peer times out in the collective; torchrun alone would then wait 30 s more
    for the stopped rank to take its SIGTERM."""
    t0 = time.perf_counter()
    res = launch(
        "rankfns:stop_self_on", {"bad_rank": 1}, LaunchConfig(nproc=2, backend="gloo", timeout_s=4)
    )
    elapsed = time.perf_counter() - t0
    assert not res.ok and res.failure is not None
    assert (res.failure.kind, res.failure.rank) == ("timeout", 1)
    assert elapsed < 4 + 20, elapsed  # torchrun start-up + timeout + grace; was 4 + 30 + more


def _procs_with(needle: str) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if needle.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                out.append(int(name))
        except OSError:
            continue
    return out


def test_sigkill_of_the_launcher_ends_torchrun_and_the_ranks_and_cleans_up(
    tmp_path: Path,
) -> None:
    script = (
        "from parlab.runtime.launch import LaunchConfig, launch\n"
        "launch('rankfns:hang_on', {'bad_rank': 0}, "
        "LaunchConfig(nproc=2, backend='gloo', timeout_s=600))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, SRC]), TMPDIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    deadline = time.time() + 60
    ranks: list[int] = []
    while time.time() < deadline and len(ranks) < 4:
        runs = list(tmp_path.glob("parlab-run-*"))
        # torchrun, 2 ranks and the watchdog name the spec on their command lines
        ranks = _procs_with(f"{runs[0]}/spec.json") if runs else []
        time.sleep(0.5)
    assert len(ranks) == 4, "torchrun, the ranks and the watchdog should be running"
    [run_dir] = list(tmp_path.glob("parlab-run-*"))
    proc.send_signal(signal.SIGKILL)  # no handler runs: only the watchdog can clean up
    proc.wait(timeout=10)
    deadline = time.time() + 20
    while time.time() < deadline:
        alive = _procs_with(str(run_dir))
        if not alive and not run_dir.exists():
            break
        time.sleep(0.5)
    assert not _procs_with(str(run_dir)), "torchrun or the ranks outlived the launcher"
    assert not run_dir.exists(), "the run's temp folder was left behind"


def test_the_signalled_rank_is_the_cause_not_the_ones_torchrun_ended() -> None:
    from parlab.runtime.launch import _failure_from

    # rank 1 killed; torchrun then ended rank 0 with SIGTERM before it wrote a word
    f = _failure_from([], 2, 1, {0: -15, 1: -9})
    assert (f.rank, f.kind) == (1, "crash") and "SIGKILL" in f.message
    # a rank that timed out reported; torchrun ended the hung one with SIGTERM
    err = {"rank": 0, "kind": "timeout", "message": "Timed out", "time": 1.0}
    f = _failure_from([err], 2, 1, {1: -15, 0: 1})
    assert (f.rank, f.kind) == (1, "timeout")
    # only SIGTERM and nobody reported: that rank was stopped from outside
    f = _failure_from([], 2, 1, {1: -15})
    assert f.rank == 1 and "SIGTERM" in f.message
