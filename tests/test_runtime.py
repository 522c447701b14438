"""The torchrun runtime and the fork helper: results, failures, timeouts -- nothing hangs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch.distributed as dist

from parlab.runtime.launch import LaunchConfig, launch
from parlab.runtime.testing import RankFailure, run_ranks

TESTS = str(Path(__file__).parent)


@pytest.fixture(autouse=True)
def _importable_rank_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", TESTS)


def test_two_rank_gloo_run_through_torchrun() -> None:
    res = launch(
        "rankfns:allreduce_rank",
        {"value": 1.5},
        LaunchConfig(nproc=2, backend="gloo", timeout_s=30),
    )
    assert res.ok, res.failure
    assert [r["rank"] for r in res.results] == [0, 1]
    assert all(
        r["sum"] == [4.5] * 4 and r["world"] == 2 and r["backend"] == "gloo" for r in res.results
    )


def test_env_defaults_reach_the_ranks_unless_the_environment_sets_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PARLAB_TEST_GIVEN", "mine")
    monkeypatch.delenv("PARLAB_TEST_NEW", raising=False)
    cfg = LaunchConfig(
        nproc=2,
        backend="gloo",
        timeout_s=30,
        env_defaults=(("PARLAB_TEST_GIVEN", "default"), ("PARLAB_TEST_NEW", "default")),
    )
    res = launch("rankfns:env_of", {"keys": ["PARLAB_TEST_GIVEN", "PARLAB_TEST_NEW"]}, cfg)
    assert res.ok, res.failure
    assert res.results == [{"PARLAB_TEST_GIVEN": "mine", "PARLAB_TEST_NEW": "default"}] * 2


def test_raising_rank_gives_crash_failure_naming_it() -> None:
    res = launch(
        "rankfns:raise_on", {"bad_rank": 1}, LaunchConfig(nproc=2, backend="gloo", timeout_s=30)
    )
    assert not res.ok
    assert res.failure is not None
    assert res.failure.kind == "crash"
    assert res.failure.rank == 1
    assert "deliberate failure on rank 1" in res.failure.message
    assert res.wall_s < 30


def test_rank_killed_by_a_signal_is_named_with_its_stack() -> None:
    res = launch(
        "rankfns:segfault_on", {"bad_rank": 1}, LaunchConfig(nproc=2, backend="gloo", timeout_s=30)
    )
    assert not res.ok and res.failure is not None
    assert res.failure.kind == "crash" and res.failure.rank == 1
    assert "Segmentation fault" in res.failure.message and "rankfns.py" in res.failure.message


def test_oom_is_classified() -> None:
    res = launch(
        "rankfns:oom_on", {"bad_rank": 0}, LaunchConfig(nproc=2, backend="gloo", timeout_s=30)
    )
    assert not res.ok and res.failure is not None
    assert (res.failure.kind, res.failure.rank) == ("oom", 0)


def test_hanging_rank_times_out_within_the_timeout() -> None:
    t0 = time.perf_counter()
    res = launch(
        "rankfns:hang_on", {"bad_rank": 1}, LaunchConfig(nproc=2, backend="gloo", timeout_s=4)
    )
    elapsed = time.perf_counter() - t0
    assert not res.ok and res.failure is not None
    assert res.failure.kind == "timeout"
    assert res.failure.rank == 1  # the rank that never reached the collective
    assert elapsed < 4 + 20  # the timeout plus torchrun start-up and teardown


def test_deadline_backstop_kills_the_run() -> None:
    # pg timeout longer than the deadline: only the wall-clock backstop can end it
    cfg = LaunchConfig(nproc=1, backend="gloo", timeout_s=600, deadline_s=6)
    t0 = time.perf_counter()
    res = launch("rankfns:hang_on", {"bad_rank": 0}, cfg)
    assert time.perf_counter() - t0 < 25
    assert not res.ok and res.failure is not None and res.failure.kind == "timeout"


def test_bad_launch_config() -> None:
    from parlab.runtime.launch import Nodes

    with pytest.raises(ValueError, match="nproc"):
        LaunchConfig(nproc=0)
    with pytest.raises(ValueError, match="rdzv-endpoint"):
        Nodes(nnodes=2, node_rank=0)
    with pytest.raises(ValueError, match="--node-rank"):
        Nodes(nnodes=2, rdzv_endpoint="host0:29500")
    with pytest.raises(ValueError, match="outside 0 to 1"):
        Nodes(nnodes=2, node_rank=2, rdzv_endpoint="host0:29500")
    with pytest.raises(ValueError, match="port 1 to 65535"):
        Nodes(nnodes=2, node_rank=1, rdzv_endpoint="host0:99999")
    with pytest.raises(ValueError, match="do not divide over --nnodes 2"):
        LaunchConfig(nproc=3, nodes=Nodes(nnodes=2, node_rank=1, rdzv_endpoint="h:1"))
    for bad in (float("nan"), float("inf"), -1.0, 0.0):
        with pytest.raises(ValueError, match="finite number of seconds above 0"):
            LaunchConfig(nproc=2, timeout_s=bad)
    two = Nodes(nnodes=2, node_rank=1, rdzv_endpoint="host0:29500", rdzv_id="job7")
    args = LaunchConfig(nproc=8, nodes=two).torchrun_args()  # 8 ranks over 2 nodes
    assert "--standalone" not in args
    assert args[args.index("--nproc-per-node") + 1] == "4"
    assert args[args.index("--rdzv-endpoint") + 1] == "host0:29500"
    assert args[args.index("--node-rank") + 1] == "1"
    assert args[args.index("--rdzv-id") + 1] == "job7"
    assert "--numa-binding" not in args
    assert "--standalone" in LaunchConfig(nproc=2).torchrun_args()
    # torchrun's NUMA binding passes through; a mode torchrun does not have is refused first
    bound = LaunchConfig(nproc=2, numa_binding="node").torchrun_args()
    assert bound[bound.index("--numa-binding") + 1] == "node"
    with pytest.raises(ValueError, match="numa-binding 'near'"):
        LaunchConfig(nproc=2, numa_binding="near")


def test_the_command_sets_the_nodes_of_every_launch_inside_it() -> None:
    from parlab.runtime.launch import Nodes, current_nodes, on_nodes

    two = Nodes(nnodes=2, node_rank=0, rdzv_endpoint="127.0.0.1:29400")
    assert not current_nodes().multi
    with on_nodes(two):
        assert LaunchConfig(nproc=4).per_node == 2
        assert "--standalone" not in LaunchConfig(nproc=4).torchrun_args()
    assert LaunchConfig(nproc=4).per_node == 4


def test_default_timeout_suits_the_backend() -> None:
    from parlab.runtime.launch import default_timeout_s

    assert default_timeout_s(2, "gloo") == 60.0
    assert default_timeout_s(2, "nccl") == 180.0
    assert LaunchConfig(nproc=2).resolved_timeout("gloo") == 60.0


def _sum_ranks(ctx, k: int) -> int:
    import torch

    x = torch.tensor([ctx.rank + k])
    dist.all_reduce(x)
    return int(x.item())


def _raise_on_one(ctx) -> None:
    if ctx.rank == 1:
        raise ValueError("boom")


def _hang_on_one(ctx) -> None:
    if ctx.rank == 1:
        time.sleep(3600)
    dist.barrier()


def test_fork_helper_runs_ranks_fast() -> None:
    t0 = time.perf_counter()
    assert run_ranks(_sum_ranks, 4, 10) == [46] * 4
    assert time.perf_counter() - t0 < 10


def test_fork_helper_reports_failures() -> None:
    with pytest.raises(RankFailure) as info:
        run_ranks(_raise_on_one, 2)
    assert set(info.value.failures) == {1}  # rank 0 finished: only the raising rank is named
    assert info.value.failures[1].rstrip().endswith("ValueError: boom")
    with pytest.raises(RankFailure) as info:
        run_ranks(_hang_on_one, 2, timeout=8, pg_timeout=3)
    failures = info.value.failures
    assert set(failures) == {0, 1}
    assert failures[1] == "rank did not finish within 8 s"  # the hung rank, killed at the deadline
    assert "Timed out" in failures[0]  # its peer, released by the process-group timeout


def test_sigterm_to_the_launcher_stops_every_rank(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    script = (
        "from parlab.runtime.launch import LaunchConfig, launch\n"
        "launch('rankfns:hang_on', {'bad_rank': 0}, LaunchConfig(nproc=2, backend='gloo', timeout_s=600))\n"
    )
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([TESTS, str(Path(__file__).parents[1] / "src")])
    )
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    time.sleep(8)  # torchrun up, ranks started

    def stat(pid: str) -> list[str]:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return []
        return text.rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, ...

    procs = [p for p in os.listdir("/proc") if p.isdigit()]
    torchrun = [p for p in procs if stat(p)[1:2] == [str(proc.pid)]]
    assert torchrun, "the launcher should have started torchrun"
    workers = [p for p in procs if stat(p)[1:2] == [torchrun[0]]]
    assert workers, "the ranks should be running"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    deadline = time.time() + 20
    while time.time() < deadline:
        alive = [p for p in workers if Path(f"/proc/{p}").exists()]
        if not alive:
            break
        time.sleep(0.5)
    assert not alive, f"ranks {alive} outlived the launcher"
