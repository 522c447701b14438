"""Run a function on N ranks through torchrun (``torch.distributed.run``), on one node or many.

parlab writes no launcher of its own: ``launch`` starts
``python -m torch.distributed.run`` with torchrun's flags, which starts
``parlab.runtime.worker`` on every rank. One node uses ``--standalone`` (a
free port, so runs never collide); several nodes pass ``--nnodes``,
``--node-rank``, ``--rdzv-endpoint``, ``--rdzv-backend`` and ``--rdzv-id``
through (``Nodes``). A command sets its nodes once (``on_nodes``); every launch
inside it runs on them, so project code never threads them by hand.

Failure handling, so that nothing hangs and nothing outlives the launcher:
- every process group has a timeout (``default_timeout_s``: 60 s on gloo, 180 s
  on NCCL): a collective whose peer never arrives raises on the waiting ranks,
  which write an error file and exit;
- once a rank has reported an error, the others get ``ERROR_GRACE_S`` to report
  theirs, then every rank is killed (a stopped or hung rank too: torchrun alone
  would wait 30 s more);
- a wall-clock deadline (``deadline_s``) is the backstop: past it the whole
  process tree is killed and the failure is a ``timeout``;
- Ctrl-C or SIGTERM stops every rank;
- a watchdog process (``python -m parlab.runtime.launch --watch``) holds a pipe from
  the launcher: if the launcher dies, even by SIGKILL, it kills torchrun and the
  ranks (each rank runs in its own session, so the watchdog finds them by the spec
  path on their command line) and removes the run's temp folder.

The result is a ``LaunchResult``: every rank's return value (rank order), or a
contract ``Failure`` naming the kind, the rank and the message. A rank killed by a
signal (SIGKILL, the kernel's OOM killer) is named from torchrun's failure report.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parlab.contract import Failure
from parlab.errors import UsageError
from parlab.runtime.nodes import ONE_NODE, Nodes, current_nodes, on_nodes
from parlab.runtime.reaper import kill_tree, start_watchdog, stop_watchdog, tee

__all__ = ["LaunchConfig", "LaunchResult", "Nodes", "current_nodes", "launch", "on_nodes"]

GLOO_TIMEOUT_S = 60.0
NCCL_TIMEOUT_S = 180.0
ERROR_GRACE_S = 3.0
"""Seconds the other ranks get to report their own errors after the first one."""
NUMA_BINDINGS = ("node", "socket", "exclusive", "core-complex")
"""torchrun's ``--numa-binding`` modes (``torch.numa.binding.AffinityMode``): GPU ranks only."""


def check_numa_binding(mode: str | None) -> None:
    """``UsageError`` unless ``mode`` is None or one of torchrun's ``--numa-binding`` modes."""
    if mode is not None and mode not in NUMA_BINDINGS:
        raise UsageError(f"--numa-binding {mode!r} is not one of {', '.join(NUMA_BINDINGS)}")


def default_timeout_s(nproc: int = 1, backend: str = "auto") -> float:
    """The process-group timeout a run of ``nproc`` ranks per node gets unless it names one:
    60 s on gloo, 180 s on NCCL (its first collectives build communicators; compiled runs
    compile before them)."""
    if backend == "auto":
        backend = LaunchConfig(nproc=nproc, nodes=ONE_NODE, timeout_s=1.0).resolved_backend()
    return NCCL_TIMEOUT_S if backend == "nccl" else GLOO_TIMEOUT_S


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """How to start the ranks (torchrun's flags, and parlab's timeouts)."""

    nproc: int = 1
    """Ranks in the job; each node runs ``nproc / nnodes`` (torchrun ``--nproc-per-node``)."""
    nodes: Nodes | None = None
    """The job's nodes; None: ``current_nodes()`` (one node unless the command set them)."""
    backend: str = "auto"
    """``nccl``, ``gloo``, or ``auto``: NCCL when there is a GPU per local rank, else gloo."""
    timeout_s: float | None = None
    """Process-group timeout: a collective waiting longer fails the run (None: the default)."""
    deadline_s: float | None = None
    """Wall-clock limit for the whole run; None: timeout_s x 2 + 120 s."""
    env_defaults: tuple[tuple[str, str], ...] = ()
    """Environment variables the ranks get unless the caller's environment sets them."""
    numa_binding: str | None = None
    """Bind each rank to the CPUs near its GPU (torchrun ``--numa-binding``: node, socket,
    exclusive, core-complex); None: the operating system places the ranks."""

    def __post_init__(self) -> None:
        if self.nproc < 1:
            raise UsageError(f"--nproc {self.nproc} is below 1: run at least one rank")
        for name in ("timeout_s", "deadline_s"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                flag = "--timeout" if name == "timeout_s" else "deadline"
                raise UsageError(f"{flag} {v} must be a finite number of seconds above 0")
        if self.backend not in ("auto", "nccl", "gloo"):
            raise UsageError(f"backend {self.backend!r} is not one of auto, nccl, gloo")
        check_numa_binding(self.numa_binding)
        n = self.job_nodes.nnodes
        if self.nproc % n:
            raise UsageError(f"{self.nproc} ranks do not divide over --nnodes {n}")

    @property
    def job_nodes(self) -> Nodes:
        return self.nodes if self.nodes is not None else current_nodes()

    @property
    def per_node(self) -> int:
        return self.nproc // self.job_nodes.nnodes

    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        import torch  # lazy: torch

        return (
            "nccl"
            if torch.cuda.is_available() and torch.cuda.device_count() >= self.per_node
            else "gloo"
        )

    def resolved_timeout(self, backend: str) -> float:
        if self.timeout_s is not None:
            return self.timeout_s
        return NCCL_TIMEOUT_S if backend == "nccl" else GLOO_TIMEOUT_S

    def torchrun_args(self) -> list[str]:
        args = ["--nproc-per-node", str(self.per_node), "--max-restarts", "0"]
        args += self.job_nodes.torchrun_args()
        if self.numa_binding is not None:
            args += ["--numa-binding", self.numa_binding]
        return args


@dataclass
class LaunchResult:
    """What came back from the ranks."""

    ok: bool
    results: list[Any] = field(default_factory=list)
    """Each rank's return value, in rank order (every node gets all of them)."""
    failure: Failure | None = None
    wall_s: float = 0.0
    errors: list[dict[str, Any]] = field(default_factory=list)
    """Every error file the ranks wrote (rank, kind, message, traceback)."""
    node_rank: int | None = None
    """The node rank the rendezvous gave this node (torchrun's ``GROUP_RANK``)."""


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


_REPORTED_RE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*exitcode\s*:\s*(-?\d+)")


def torchrun_failures(log: str) -> dict[int, int]:
    """Rank -> exit code, from torchrun's failure report (its ``Failures:`` and
    ``Root Cause`` blocks: ``rank : 1 (local_rank: 1)`` then ``exitcode : -9``)."""
    return {int(m.group(1)): int(m.group(2)) for m in _REPORTED_RE.finditer(log)}


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _killed_by_signal(errors: list[dict[str, Any]], exits: dict[int, int]) -> Failure | None:
    """A rank that died of a signal without a word (no error file, no fault log): it is the
    cause; its peers' errors ('connection closed by peer') are the consequence."""
    reported = {e["rank"] for e in errors}
    signalled = sorted(
        (code == -signal.SIGTERM, rank, code)
        for rank, code in exits.items()
        if code < 0 and rank not in reported
    )
    for is_term, rank, code in signalled:
        # torchrun ends the survivors of a failure with SIGTERM: not a cause while another
        # rank reported an error or died of another signal
        if is_term and (errors or not signalled[0][0]):
            continue
        name = _signal_name(code)
        hint = " (kill -9, or the kernel's out-of-memory killer)" if name == "SIGKILL" else ""
        return Failure(
            kind="crash",
            message=f"rank {rank} was killed by {name}{hint}; torchrun saw exit code {code}",
            rank=rank,
        )
    return None


def _failure_from(
    errors: list[dict[str, Any]], world: int, returncode: int | None, exits: dict[int, int]
) -> Failure:
    signalled = _killed_by_signal(errors, exits)
    if signalled is not None:
        return signalled
    if not errors:
        reason = "was killed" if returncode is not None and returncode < 0 else "exited"
        failed = ", ".join(f"rank {r} exit code {c}" for r, c in sorted(exits.items()))
        return Failure(
            kind="crash",
            message=f"torchrun {reason} with status {returncode} and no rank reported an error"
            + (f" (torchrun saw {failed})" if failed else ""),
            rank=min(exits) if exits else None,
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


def _forward_sigterm() -> Any:
    """Turn SIGTERM into KeyboardInterrupt while the ranks run; return the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, on_term)
    return lambda: signal.signal(signal.SIGTERM, previous)


def _wait(
    proc: subprocess.Popen[bytes], out_dir: Path, spec_path: str, deadline: float
) -> tuple[bool, float]:
    """Wait for torchrun; end the run early once a rank has reported an error and the others
    had ``ERROR_GRACE_S`` to report theirs. Returns (timed out, when the kill started)."""
    start = time.monotonic()
    first_error: float | None = None
    while proc.poll() is None:
        now = time.monotonic()
        if first_error is None and any(out_dir.glob("error-rank*.json")):
            first_error = now
        timed_out = now - start > deadline
        if timed_out or (first_error is not None and now - first_error > ERROR_GRACE_S):
            killed_at = time.time()
            kill_tree(proc, spec_path)
            return timed_out, killed_at
        time.sleep(0.1)
    return False, float("inf")


def _read_errors(out_dir: Path) -> list[dict[str, Any]]:
    errors = []
    for p in sorted(out_dir.glob("error-rank*.json")):
        try:
            errors.append(json.loads(p.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return errors + _fatal_signals(out_dir)


def launch(
    entry: str, kwargs: dict[str, Any] | None = None, config: LaunchConfig | None = None
) -> LaunchResult:
    """Run ``entry`` (``"module:function"``, called as ``function(ctx, **kwargs)``) on every rank.

    ``kwargs`` must be JSON: it travels to the ranks in a file. Each rank's
    return value must be JSON-serialisable too.
    """
    config = config or LaunchConfig()
    backend = config.resolved_backend()
    timeout_s = config.resolved_timeout(backend)
    deadline = config.deadline_s or timeout_s * 2 + 120
    tmp = tempfile.mkdtemp(prefix="parlab-run-")
    out_dir = Path(tmp)
    try:
        spec = {"entry": entry, "kwargs": kwargs or {}, "backend": backend}
        spec |= {"timeout_s": timeout_s, "out_dir": tmp}
        spec_path = str(out_dir / "spec.json")
        Path(spec_path).write_text(json.dumps(spec))
        cmd = [sys.executable, "-m", "torch.distributed.run", *config.torchrun_args()]
        cmd += ["-m", "parlab.runtime.worker", spec_path]
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        env.setdefault("OMP_NUM_THREADS", "1")
        for key, value in config.env_defaults:
            env.setdefault(key, value)
        start = time.perf_counter()
        # The ranks run in their own sessions (so Ctrl-C reaches them only through us):
        # SIGTERM to this process must take them down too, or they outlive it holding GPUs.
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, stderr=subprocess.PIPE)
        dog = start_watchdog(proc.pid, tmp, spec_path)
        tail: collections.deque[str] = collections.deque(maxlen=400)
        reader = tee(proc.stderr, tail)
        restore = _forward_sigterm()
        try:
            timed_out, killed_at = _wait(proc, out_dir, spec_path, deadline)
        except KeyboardInterrupt:
            kill_tree(proc, spec_path)
            raise
        finally:
            restore()
            reader.join(timeout=5)
            stop_watchdog(dog)
        return _outcome(proc.returncode, out_dir, config, "".join(tail), timed_out, killed_at,
                        wall=time.perf_counter() - start, deadline=deadline)  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _outcome(
    returncode: int | None,
    out_dir: Path,
    config: LaunchConfig,
    log: str,
    timed_out: bool,
    killed_at: float,
    *,
    wall: float,
    deadline: float,
) -> LaunchResult:
    errors = _read_errors(out_dir)
    result_path = out_dir / "result.json"
    if returncode == 0 and result_path.exists() and not timed_out:
        body = json.loads(result_path.read_text())
        return LaunchResult(
            ok=True, results=body["results"], wall_s=wall, node_rank=body.get("group_rank")
        )
    # errors raised before a kill explain it; those the kill caused do not
    earlier = [e for e in errors if e.get("time", 0) < killed_at]
    exits = {} if killed_at != float("inf") else torchrun_failures(log)
    if timed_out and not earlier:
        failure = Failure(
            kind="timeout",
            message=f"the run passed its {deadline:.0f} s deadline and was stopped",
            rank=None,
        )
    else:
        failure = _failure_from(earlier, config.nproc, returncode, exits)
    return LaunchResult(ok=False, failure=failure, wall_s=wall, errors=errors)
