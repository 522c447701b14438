"""Rank functions the runtime tests launch through torchrun (importable by name)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from parlab.runtime.context import RankContext


def allreduce_rank(ctx: RankContext, value: float) -> dict:
    x = torch.full((4,), value * (ctx.rank + 1))
    dist.all_reduce(x)
    return {"rank": ctx.rank, "world": ctx.world_size, "sum": x.tolist(), "backend": ctx.backend}


def raise_on(ctx: RankContext, bad_rank: int) -> None:
    dist.barrier()
    if ctx.rank == bad_rank:
        raise RuntimeError(f"deliberate failure on rank {ctx.rank}")
    dist.barrier()


def oom_on(ctx: RankContext, bad_rank: int) -> None:
    if ctx.rank == bad_rank:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
    dist.barrier()


def hang_on(ctx: RankContext, bad_rank: int) -> None:
    if ctx.rank == bad_rank:
        time.sleep(3600)
    dist.barrier()


def segfault_on(ctx: RankContext, bad_rank: int) -> None:
    import ctypes

    dist.barrier()
    if ctx.rank == bad_rank:
        ctypes.string_at(0)  # a read of address 0: SIGSEGV, as a broken kernel library would
    dist.barrier()


def env_of(ctx: RankContext, keys: list[str]) -> dict:
    """This rank's values of ``keys`` (None where unset)."""
    import os

    return {k: os.environ.get(k) for k in keys}


def kill_self_on(ctx: RankContext, bad_rank: int) -> None:
    """``kill -9`` of one rank mid-run (the kernel's OOM killer looks the same)."""
    import os
    import signal

    dist.barrier()
    if ctx.rank == bad_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def stop_self_on(ctx: RankContext, bad_rank: int) -> None:
    """One rank stops (SIGSTOP) before a collective: its peers wait in it."""
    import os
    import signal

    dist.barrier()
    if ctx.rank == bad_rank:
        os.kill(os.getpid(), signal.SIGSTOP)
    dist.barrier()
