"""Replicas as child processes: start one, learn its URL, stop it (projects, benchmarks).

A child is ``python -m parlab serve replica ... --port 0``; it prints
``parlab replica listening on http://HOST:PORT`` once bound, which is how the
parent learns the port (no fixed ports, so runs never collide). Children get
one CPU thread each unless told otherwise and always a ``--duration`` bound,
so none outlives its parent by more than that.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp


@dataclass
class ReplicaProcess:
    """A running replica child."""

    proc: subprocess.Popen[str]
    url: str
    args: list[str] = field(default_factory=list)
    """What it was started with (``restart_replica`` starts it again on its port)."""

    def kill(self) -> None:
        """Kill it at once (a crash, as far as its clients can tell)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def restart_replica(r: ReplicaProcess, timeout_s: float = 120.0) -> ReplicaProcess:
    """Start a stopped replica again, with its arguments, on the port it had."""
    port = r.url.rsplit(":", 1)[1]
    args = [*r.args, "--port", port]
    return wait_replica(spawn_replica(args, duration_s=1800.0), timeout_s)


def spawn_replica(
    args: list[str], *, threads: int = 1, duration_s: float = 1800.0
) -> tuple[subprocess.Popen[str], list[str]]:
    """Start the child without waiting (start several, then ``wait_replica`` each)."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = str(threads)
    if "--port" not in args:
        args = [*args, "--port", "0"]
    cmd = [sys.executable, "-m", "parlab", "serve", "replica", *args]
    cmd += ["--threads", str(threads), "--duration", str(duration_s)]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=None, text=True, start_new_session=True
    )
    return proc, cmd


def wait_replica(
    started: tuple[subprocess.Popen[str], list[str]], timeout_s: float = 120.0
) -> ReplicaProcess:
    """Wait until a spawned child prints its URL."""
    proc, cmd = started
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if "listening on " in line:
            url = line.strip().split("listening on ")[1]
            args = _strip_run_args(cmd[cmd.index("replica") + 1 :])
            return ReplicaProcess(proc=proc, url=url, args=args)
    proc.kill()
    proc.wait(5)
    raise RuntimeError(f"replica did not start within {timeout_s:g} s: {' '.join(cmd)}")


def _strip_run_args(args: list[str]) -> list[str]:
    """A replica's own arguments without what ``spawn_replica`` adds (port, threads,
    duration)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("--port", "--threads", "--duration"):
            skip = True
        else:
            out.append(a)
    return out


async def post_json(url: str, timeout_s: float = 300.0) -> Any:
    async with (
        aiohttp.ClientSession() as s,
        s.post(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r,
    ):
        r.raise_for_status()
        return await r.json()


async def get_json(url: str, timeout_s: float = 30.0) -> Any:
    async with (
        aiohttp.ClientSession() as s,
        s.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r,
    ):
        r.raise_for_status()
        return await r.json()
