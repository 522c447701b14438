"""Ending a run's processes, whoever dies first.

torchrun starts each rank in its own session, so a signal to torchrun's process group
misses them: ``signal_all`` also finds the ranks by the run's spec path on their command
line. ``kill_tree`` ends torchrun and the ranks (SIGTERM, then SIGKILL, a stopped rank
too). The watchdog (``python -m parlab.runtime.reaper --watch PID TMP SPEC``) holds a pipe
from the launcher: when the launcher dies, even by SIGKILL, the pipe closes without its
``done``, and the watchdog ends the run and removes its temp folder.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any


def ranks_of(spec_path: str) -> list[int]:
    """Pids of the rank processes of one run: their command line holds its spec path (each
    rank runs in its own session, out of reach of a signal to torchrun's group)."""
    needle = spec_path.encode()
    pids = []
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if needle in f.read():
                        pids.append(int(name))
            except OSError:
                continue
    return pids


def signal_all(torchrun_pid: int, spec_path: str, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(torchrun_pid, sig)
    for pid in ranks_of(spec_path):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def kill_tree(proc: subprocess.Popen[bytes], spec_path: str, grace_s: float = 2.0) -> None:
    """SIGTERM torchrun and every rank, then SIGKILL what is left (a stopped rank included)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        signal_all(proc.pid, spec_path, sig)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM and ranks_of(spec_path):
            continue
        return


def tee(stream: Any, tail: collections.deque[str]) -> threading.Thread:
    """Copy torchrun's stderr to ours, keeping its last lines for the failure report."""

    def run() -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            tail.append(line)
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(line)
                sys.stderr.flush()
        stream.close()

    t = threading.Thread(target=run, name="parlab-torchrun-stderr", daemon=True)
    t.start()
    return t


def start_watchdog(torchrun_pid: int, tmp: str, spec_path: str) -> subprocess.Popen[bytes]:
    """The process that cleans up if this one dies (see the module docstring)."""
    cmd = [sys.executable, "-m", "parlab.runtime.reaper", "--watch", str(torchrun_pid), tmp]
    cmd.append(spec_path)
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, env=env, start_new_session=True)


def stop_watchdog(dog: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError, ValueError):
        assert dog.stdin is not None
        dog.stdin.write(b"done\n")
        dog.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        dog.wait(timeout=5)


def _watch(torchrun_pid: int, tmp: str, spec_path: str) -> None:
    """Block until the launcher closes our stdin; unless it said ``done``, it died: end the
    run (torchrun's group, then every rank by its spec path) and remove its temp folder."""
    said = sys.stdin.buffer.read()
    if b"done" in said:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        signal_all(torchrun_pid, spec_path, sig)
        time.sleep(1.0)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__" and sys.argv[1:2] == ["--watch"]:
    _watch(int(sys.argv[2]), sys.argv[3], sys.argv[4])
