"""The rank of ``parlab doctor``'s collective-timeout reproduction: one all-reduce that one rank
never joins. A module of its own, so each launched rank imports torch and this alone, not the
projects the other reproductions run."""

from __future__ import annotations

import datetime
import os
import time
from typing import Any

import torch
import torch.distributed as dist

from parlab.comm.sweep import FR_ENV  # its names, the first one set wins (as in torch)


def _dump_flight_recorder(rank: int) -> str | None:
    """Write this rank's NCCL flight-recorder buffer where ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``
    says (``<prefix><rank>``), as the watchdog does on a timeout; None when off or unavailable."""
    prefix = os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    size = next((os.environ[k] for k in FR_ENV if k in os.environ), None)
    if not prefix or not size or size == "0":
        return None
    try:
        data = torch._C._distributed_c10d._dump_nccl_trace()  # pickled, as fr_trace reads it
    except (AttributeError, RuntimeError):
        return None
    path = f"{prefix}{rank}"
    with open(path, "wb") as f:
        f.write(data)
    return path


def timeout_rank(ctx: Any, skip_rank: int | None, nbytes: int) -> dict[str, Any]:
    """Rank function: one all-reduce of ``nbytes`` that ``skip_rank`` never joins (it stays
    busy elsewhere for six times the process-group timeout instead, as a rank stuck in a data
    loader or a data-dependent branch would, until the launcher stops it).

    On NCCL the waiting rank waits on the work with half the group timeout, so it fails with
    a timeout of its own before the watchdog aborts the process, and both ranks dump their
    flight recorder first (when ``TORCH_FR_BUFFER_SIZE`` is set)."""
    x = torch.ones(nbytes // 4, device=ctx.device)
    nccl = ctx.backend == "nccl"
    # One collective both ranks join first: NCCL creates its communicator at the first
    # collective, and a rank waiting there (not in the all-reduce) cannot time out -- on 2xH200
    # rank 0 sat in that set-up until rank 1 came back from its sleep. Hangs in training come
    # after the communicator exists.
    dist.all_reduce(torch.zeros(1, device=ctx.device))
    ctx.sync()
    t0 = time.perf_counter()
    if ctx.rank != skip_rank:
        if nccl:
            work = dist.all_reduce(x, async_op=True)
            wait_s = ctx.timeout_s / 2
            try:
                done = work.wait(timeout=datetime.timedelta(seconds=wait_s))
            except Exception as exc:
                _dump_flight_recorder(ctx.rank)
                raise TimeoutError(
                    f"all_reduce timed out after {wait_s:g} s on rank {ctx.rank}: "
                    + " ".join(str(exc).split())[:200]
                ) from None
            if done is False:
                _dump_flight_recorder(ctx.rank)
                raise TimeoutError(f"all_reduce timed out after {wait_s:g} s on rank {ctx.rank}")
        else:
            dist.all_reduce(x)
        ctx.sync()
    else:
        if nccl:
            _dump_flight_recorder(ctx.rank)
        # Longer than the waiting rank can last, so the launcher stops it: a skipping rank that
        # woke first would reach the launcher's result gather on a dead communicator (on
        # 2xH200 a garbage-sized allocation, an "out of memory" that hid the timeout).
        time.sleep(6 * ctx.timeout_s)
    return {"time_s": time.perf_counter() - t0, "value": float(x[0])}
