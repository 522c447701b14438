"""Fast multi-rank runs for the test suite: fork N gloo ranks in ~0.1 s.

``run_ranks(fn, world_size, *args)`` forks ``world_size`` children from the
(already torch-importing) parent, each joining a gloo group through a fresh
``file://`` store in a temp folder (no port, so overlapping jobs never
collide), with one CPU thread per rank and a short process-group timeout.
Each child calls ``fn(ctx, *args, **kwargs)`` with the same ``RankContext``
torchrun ranks get, and sends back its return value. The parent never joins
a process group itself.

A child that raises makes ``run_ranks`` raise ``RankFailure`` with every
failing rank's traceback; a child that hangs is killed at ``timeout``.
"""

from __future__ import annotations

import datetime as _dt
import multiprocessing as mp
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from parlab.runtime.context import RankContext


class RankFailure(RuntimeError):
    """One or more ranks raised, or hung past the deadline."""

    def __init__(self, failures: dict[int, str]) -> None:
        self.failures = failures
        lines = [f"rank {r}:\n{tb}" for r, tb in sorted(failures.items())]
        super().__init__("\n".join(lines))


def _child(
    rank: int,
    world_size: int,
    store_path: str,
    pg_timeout: float,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    conn: Any,
) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{store_path}",
            rank=rank,
            world_size=world_size,
            timeout=_dt.timedelta(seconds=pg_timeout),
        )
        ctx = RankContext(
            rank=rank,
            world_size=world_size,
            local_rank=rank,
            local_world_size=world_size,
            backend="gloo",
            device=torch.device("cpu"),
            timeout_s=pg_timeout,
        )
        result = fn(ctx, *args, **kwargs)
        conn.send(("ok", result))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        finally:
            os._exit(0)


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 60.0,
    pg_timeout: float = 20.0,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(ctx, *args, **kwargs)`` on ``world_size`` forked gloo ranks; return results by rank."""
    ctx = mp.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="parlab-ranks-") as tmp:
        store = os.path.join(tmp, "store")
        pipes = []
        procs = []
        for rank in range(world_size):
            parent_conn, child_conn = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=_child,
                args=(rank, world_size, store, pg_timeout, fn, args, kwargs, child_conn),
                daemon=True,
            )
            p.start()
            child_conn.close()
            pipes.append(parent_conn)
            procs.append(p)
        deadline = time.monotonic() + timeout
        results: list[Any] = [None] * world_size
        failures: dict[int, str] = {}
        pending = set(range(world_size))
        while pending and time.monotonic() < deadline:
            for rank in list(pending):
                conn = pipes[rank]
                if conn.poll(0.01):
                    try:
                        status, value = conn.recv()
                    except EOFError:
                        status, value = "error", "rank exited without a result"
                    pending.discard(rank)
                    if status == "ok":
                        results[rank] = value
                    else:
                        failures[rank] = value
                elif not procs[rank].is_alive() and not conn.poll(0):
                    pending.discard(rank)
                    failures[rank] = f"rank died (exit code {procs[rank].exitcode})"
        for rank in pending:
            failures[rank] = f"rank did not finish within {timeout:.0f} s"
        for p in procs:
            p.join(timeout=0.5 if failures else 5)
            if p.is_alive():
                p.kill()
                p.join()
        if failures:
            raise RankFailure(failures)
        return results
