"""Two nodes of one job on one machine: two parlab launchers on 127.0.0.1 (c10d rendezvous,
one rank each, gloo over loopback), as a cluster's nodes would run them; and the sbatch script
``parlab launch --slurm`` writes, run against a stand-in ``srun`` that starts it once per node."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).parents[1] / "src")
BIN = str(Path(sys.executable).parent)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    path = os.pathsep.join([BIN, os.environ.get("PATH", "")])
    return dict(os.environ, PYTHONPATH=SRC, GLOO_SOCKET_IFNAME="lo", PATH=path)


def _two_nodes(args: list[str], tmp_path: Path) -> list[dict]:
    """Run ``parlab ARGS`` as node 0 and node 1 of one job; return each node's document."""
    port = _free_port()
    procs = []
    for node in (0, 1):
        flags = ["--nnodes", "2", "--node-rank", str(node), "--rdzv-backend", "c10d"]
        flags += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes"]
        cmd = [sys.executable, "-m", "parlab", *args, *flags]
        cmd += ["--results", str(tmp_path / f"node{node}")]
        procs.append(subprocess.Popen(cmd, env=_env(), stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=150)
        assert p.returncode == 0, err[-2000:]
    docs = []
    for node in (0, 1):
        [path] = list((tmp_path / f"node{node}").glob("PAR-*/*.json"))
        docs.append(json.loads(path.read_text()))
    return docs


def _check_nodes(docs: list[dict]) -> None:
    for node, d in enumerate(docs):
        assert d["status"] == "ok"
        assert d["layout"]["world_size"] == 2
        assert d["layout"]["nodes"]["nnodes"] == 2 and d["layout"]["nodes"]["node_rank"] == node
        assert d["environment"]["hardware"]["host_count"] == 2
        assert f"--node-rank {node} of 2 nodes" in d["notes"][-1]


@pytest.mark.timeout(300)
def test_two_node_zero2_step(tmp_path: Path) -> None:
    args = ["train", "--strategy", "zero2", "--model", "tiny", "--nproc", "1"]
    args += ["--steps", "1", "--warmup", "1", "--seq", "32"]
    docs = _two_nodes(args, tmp_path)
    _check_nodes(docs)
    # ZeRO-2 over the two nodes' ranks: each holds half the gradients, all the parameters
    for d in docs:
        params = d["metrics"]["state_bytes.params"]["per_rank"]
        grads = d["metrics"]["state_bytes.grads"]["per_rank"]
        assert len(params) == 2 and all(
            abs(g - p / 2) <= 512 for g, p in zip(grads, params, strict=True)
        )
    # both nodes report the same run: the same per-rank measurements
    assert docs[0]["metrics"]["state_bytes.grads"] == docs[1]["metrics"]["state_bytes.grads"]


STAND_IN_SRUN = """#!/bin/bash
# a stand-in srun: runs its command once per node (SLURM_NODEID 0..N-1), in parallel
nodes=1
while [[ "$1" == --* ]]; do
  case "$1" in --nodes=*) nodes="${1#--nodes=}";; esac
  shift
done
pids=()
for ((i = 0; i < nodes; i++)); do
  SLURM_NODEID=$i SLURM_PROCID=$i SLURM_NNODES=$nodes "$@" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
"""


@pytest.mark.timeout(300)
def test_sbatch_script_runs_one_launcher_per_node(tmp_path: Path) -> None:
    """The two-node collectives sweep, started the way a cluster starts it."""
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir()
    (stand_ins / "srun").write_text(STAND_IN_SRUN)
    (stand_ins / "scontrol").write_text("#!/bin/bash\necho 127.0.0.1\necho 127.0.0.2\n")
    for f in stand_ins.iterdir():
        f.chmod(0o755)
    script = tmp_path / "job.sbatch"
    results = tmp_path / "results"
    env = _env()
    cmd = [sys.executable, "-m", "parlab", "launch", "--slurm", "--nodes", "2",
           "--gpus-per-node", "1", "--port", str(_free_port()), "--time", "00:10:00",
           "--out", str(script), "--", "parlab", "collectives", "--op", "all_reduce", "-b", "8",
           "-e", "1KiB", "-f", "8", "-w", "1", "-n", "2", "--backend", "gloo", "--results",
           str(results)]  # fmt: skip
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    text = script.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text
    assert "export GLOO_SOCKET_IFNAME=lo" in text  # the environment's variables go along
    assert '--node-rank "$SLURM_NODEID"' in text and "--rdzv-backend c10d" in text
    env = dict(env, SLURM_JOB_NODELIST="node[1-2]", SLURM_JOB_ID="4242", SLURM_NNODES="2")
    env["PATH"] = os.pathsep.join([str(stand_ins), env["PATH"]])
    run = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=200
    )
    assert run.returncode == 0, run.stderr[-2000:]
    docs = [json.loads(p.read_text()) for p in sorted(results.glob("PAR-COLLECTIVES/*.json"))]
    assert len(docs) == 2  # one per node, into the shared results folder
    assert sorted(d["layout"]["nodes"]["node_rank"] for d in docs) == [0, 1]
    assert all(d["layout"]["nodes"]["rdzv_id"] == "4242" for d in docs)
    _check_nodes(sorted(docs, key=lambda d: d["layout"]["nodes"]["node_rank"]))
    for d in docs:  # checked values over two nodes
        rows = d["workload"]["measurements"]
        assert rows and all(r["op"] == "all_reduce" and r["wrong"] == 0 for r in rows)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--", "parlab", "fit", "tiny"], "does not launch ranks"),
        (["--", "python", "train.py"], "give the parlab command"),
        (["--", "parlab", "train", "--nnodes", "2"], "leave --nnodes out"),
        (["--time", "forever", "--", "parlab", "train"], "--time 'forever'"),
    ],
)
def test_launch_refuses_what_it_cannot_run(
    argv: list[str], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from parlab.cli import main

    with pytest.raises(SystemExit) as info:
        main(["launch", "--slurm", "--out", str(tmp_path / "x.sbatch"), *argv])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and fragment in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x.sbatch").exists()
