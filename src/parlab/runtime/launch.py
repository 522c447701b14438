"""Run a function on N ranks through torchrun (``torch.distributed.run``).

parlab writes no launcher of its own: ``launch`` starts
``python -m torch.distributed.run`` with the user's flags, which starts
``parlab.runtime.worker`` on every rank. One node uses ``--standalone`` (a
free port, so runs never collide); several nodes pass ``--nnodes``,
``--node-rank``, ``--rdzv-endpoint`` and ``--rdzv-backend`` through.

Failure handling, so that nothing hangs:
- every process group has a timeout (default 5 min): a collective whose peer
  never arrives raises on the waiting ranks, which write an error file and
  exit; torchrun then stops the rest;
- a rank that raises (or runs out of memory) does the same at once;
- a wall-clock deadline (``deadline_s``) is the backstop: past it the whole
  process tree is killed and the failure is a ``timeout``;
- Ctrl-C sends SIGINT, then SIGTERM, then SIGKILL to every rank.

The result is a ``LaunchResult``: every rank's return value (rank order), or
a contract ``Failure`` naming the kind, the rank and the message.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parlab.contract import Failure
from parlab.errors import UsageError

DEFAULT_TIMEOUT_S = 300.0
NUMA_BINDINGS = ("node", "socket", "exclusive", "core-complex")
"""torchrun's ``--numa-binding`` modes (``torch.numa.binding.AffinityMode``): GPU ranks only."""


def check_numa_binding(mode: str | None) -> None:
    """``UsageError`` unless ``mode`` is None or one of torchrun's ``--numa-binding`` modes."""
    if mode is not None and mode not in NUMA_BINDINGS:
        raise UsageError(f"--numa-binding {mode!r} is not one of {', '.join(NUMA_BINDINGS)}")


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """How to start the ranks (torchrun's flags, and parlab's timeouts)."""

    nproc: int = 1
    """Ranks per node (torchrun ``--nproc-per-node``)."""
    nnodes: str = "1"
    """Nodes, or a range ``MIN:MAX`` (torchrun ``--nnodes``)."""
    node_rank: int | None = None
    """This node's rank (torchrun ``--node-rank``); multi-node only."""
    rdzv_endpoint: str | None = None
    """``host:port`` of the rendezvous (torchrun ``--rdzv-endpoint``); multi-node only."""
    rdzv_backend: str = "c10d"
    """Rendezvous backend (torchrun ``--rdzv-backend``)."""
    rdzv_id: str | None = None
    """Job id shared by all nodes (torchrun ``--rdzv-id``)."""
    backend: str = "auto"
    """``nccl``, ``gloo``, or ``auto``: NCCL when there is a GPU per local rank, else gloo."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Process-group timeout: a collective waiting longer than this fails the run."""
    deadline_s: float | None = None
    """Wall-clock limit for the whole run; None: timeout_s x 2 + 120 s."""
    env_defaults: tuple[tuple[str, str], ...] = ()
    """Environment variables the ranks get unless the caller's environment sets them."""
    numa_binding: str | None = None
    """Bind each rank to the CPUs near its GPU (torchrun ``--numa-binding``: node, socket,
    exclusive, core-complex); None: the operating system places the ranks."""

    def __post_init__(self) -> None:
        if self.nproc < 1:
            raise UsageError(f"--nproc {self.nproc} is below 1: run at least one rank per node")
        if self.timeout_s <= 0:
            raise UsageError(f"--timeout {self.timeout_s} must be positive (seconds)")
        if self.backend not in ("auto", "nccl", "gloo"):
            raise UsageError(f"backend {self.backend!r} is not one of auto, nccl, gloo")
        check_numa_binding(self.numa_binding)
        multi = self.nnodes not in ("1", "1:1")
        if multi and not self.rdzv_endpoint:
            raise UsageError("--nnodes above 1 needs --rdzv-endpoint HOST:PORT shared by all nodes")

    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        import torch

        return (
            "nccl"
            if torch.cuda.is_available() and torch.cuda.device_count() >= self.nproc
            else "gloo"
        )

    def torchrun_args(self) -> list[str]:
        args = ["--nproc-per-node", str(self.nproc), "--max-restarts", "0"]
        if self.nnodes in ("1", "1:1"):
            args.append("--standalone")
        else:
            args += ["--nnodes", self.nnodes, "--rdzv-backend", self.rdzv_backend]
            args += ["--rdzv-endpoint", str(self.rdzv_endpoint)]
            args += ["--rdzv-id", self.rdzv_id or "parlab"]
            if self.node_rank is not None:
                args += ["--node-rank", str(self.node_rank)]
        if self.numa_binding is not None:
            args += ["--numa-binding", self.numa_binding]
        return args


@dataclass
class LaunchResult:
    """What came back from the ranks."""

    ok: bool
    results: list[Any] = field(default_factory=list)
    """Each rank's return value, in rank order (from rank 0's gather)."""
    failure: Failure | None = None
    wall_s: float = 0.0
    errors: list[dict[str, Any]] = field(default_factory=list)
    """Every error file the ranks wrote (rank, kind, message, traceback)."""


def _fatal_signals(out_dir: Path) -> list[dict[str, Any]]:
    """Ranks that died from a fatal signal, from the stacks ``faulthandler`` left behind."""
    out = []
    for p in sorted(out_dir.glob("fault-rank*.log")):
        try:
            text = p.read_text(errors="replace")
        except OSError:
            continue
        if "Fatal Python error" not in text:
            continue
        rank = int(p.stem.removeprefix("fault-rank"))
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        signal_line = next((ln for ln in lines if ln.startswith("Fatal Python error")), lines[0])
        frames = [ln for ln in lines if ln.startswith("File ")]
        where = frames[0] if frames else "no Python frame"
        # the innermost frame of the program itself, past the libraries it called into
        own = next((f for f in frames if "site-packages" not in f and "/lib/python" not in f), None)
        if own and own != where:
            where += f", called from {own}"
        out.append(
            {
                "rank": rank,
                "kind": "crash",
                "message": f"{signal_line.removeprefix('Fatal Python error: ')} in {where}",
                "traceback": text,
                "time": p.stat().st_mtime,
            }
        )
    return out


def _failure_from(errors: list[dict[str, Any]], world: int, returncode: int | None) -> Failure:
    if not errors:
        reason = "was killed" if returncode is not None and returncode < 0 else "exited"
        return Failure(
            kind="crash",
            message=f"torchrun {reason} with status {returncode} and no rank reported an error "
            "(a rank may have died from a signal: check the log above)",
            rank=None,
        )
    errors = sorted(errors, key=lambda e: e["time"])
    first_real = next((e for e in errors if e["kind"] != "timeout"), None)
    if first_real is not None:
        return Failure(
            kind=first_real["kind"], message=first_real["message"], rank=first_real["rank"]
        )
    # Only timeouts: the culprit is a rank that never reported (hung or died).
    reported = {e["rank"] for e in errors}
    silent = [r for r in range(world) if r not in reported]
    first = errors[0]
    if silent:
        return Failure(
            kind="timeout",
            message=f"rank(s) {silent} never reached the collective that rank {first['rank']} "
            f"waited in ({first['message']})",
            rank=silent[0],
        )
    return Failure(kind="timeout", message=first["message"], rank=first["rank"])


def _kill_tree(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _forward_sigterm() -> Any:
    """Turn SIGTERM into KeyboardInterrupt while the ranks run; return the undo."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, on_term)
    return lambda: signal.signal(signal.SIGTERM, previous)


def launch(
    entry: str, kwargs: dict[str, Any] | None = None, config: LaunchConfig | None = None
) -> LaunchResult:
    """Run ``entry`` (``"module:function"``, called as ``function(ctx, **kwargs)``) on every rank.

    ``kwargs`` must be JSON: it travels to the ranks in a file. Each rank's
    return value must be JSON-serialisable too.
    """
    config = config or LaunchConfig()
    backend = config.resolved_backend()
    world = config.nproc * (int(config.nnodes.split(":")[-1]) if config.nnodes else 1)
    deadline = config.deadline_s or config.timeout_s * 2 + 120
    with tempfile.TemporaryDirectory(prefix="parlab-run-") as tmp:
        spec = {
            "entry": entry,
            "kwargs": kwargs or {},
            "backend": backend,
            "timeout_s": config.timeout_s,
            "out_dir": tmp,
        }
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        cmd = [sys.executable, "-m", "torch.distributed.run", *config.torchrun_args()]
        cmd += ["-m", "parlab.runtime.worker", str(spec_path)]
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        env.setdefault("OMP_NUM_THREADS", "1")
        for key, value in config.env_defaults:
            env.setdefault(key, value)
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        timed_out = False
        killed_at = float("inf")
        # The ranks run in their own session (so Ctrl-C reaches them only through us):
        # a SIGTERM to this process must take them down too, or they outlive it
        # holding GPU memory.
        restore = _forward_sigterm()
        try:
            try:
                proc.wait(timeout=deadline)
            except subprocess.TimeoutExpired:
                timed_out = True
                killed_at = time.time()
                _kill_tree(proc)
        except KeyboardInterrupt:
            _kill_tree(proc)
            raise
        finally:
            restore()
        wall = time.perf_counter() - start
        errors = []
        for p in sorted(Path(tmp).glob("error-rank*.json")):
            try:
                errors.append(json.loads(p.read_text()))
            except (OSError, json.JSONDecodeError):
                continue
        errors += _fatal_signals(Path(tmp))
        result_path = Path(tmp) / "result.json"
        if proc.returncode == 0 and result_path.exists() and not timed_out:
            results = json.loads(result_path.read_text())["results"]
            return LaunchResult(ok=True, results=results, wall_s=wall)
        if timed_out:
            failure = Failure(
                kind="timeout",
                message=f"the run passed its {deadline:.0f} s deadline and was stopped",
                rank=None,
            )
            # errors raised before the kill explain it; those the kill caused do not
            earlier = [e for e in errors if e.get("time", 0) < killed_at]
            if earlier:
                failure = _failure_from(earlier, world, proc.returncode)
        else:
            failure = _failure_from(errors, world, proc.returncode)
        return LaunchResult(ok=False, failure=failure, wall_s=wall, errors=errors)
